"""2: decode with the real dashboard attached (the model in its child process, as `tokentui` runs it) / headless."""

from __future__ import annotations

import asyncio
import time
from tokentui.core.model.engine import Engine  # noqa: E402
from measure.common import PROMPT, log, med, run_engine  # noqa: E402


class _ChildSource:
    """The dashboard's engine as the command line makes it: a client for the model in a child process."""

    def __init__(self, spec) -> None:
        self.spec = spec

    def client(self, sampler, options, recorder):
        from tokentui.core.link.process_client import ProcessClient

        return ProcessClient(self.spec, sampler, options, recorder)


async def _dashboard_once(spec) -> float:
    from tokentui.tui.app import TokentuiApp
    from tokentui.tui.config import DashboardConfig

    config = DashboardConfig(load=_ChildSource(spec), prompt=PROMPT, sampler=spec.sampler, options=spec.options,
                             recorder=None, user_theme_dir=None)
    app = TokentuiApp(config)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            deadline = time.monotonic() + 600
            while app.state.run.done is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("the dashboard run did not finish")
                await pilot.pause(0.05)
            await pilot.pause(0.2)  # let the last repaint happen inside the measured app
    finally:
        app.client.close()
    return app.state.run.done.decode_tok_s


def bench_dashboard(engine: Engine, reps: int) -> dict:
    """The dashboard as the command line runs it: the app in this process, the model in a child process
    (core/link/process_client.py) built from the same settings, a fresh one per rep; headless is the in-process engine."""
    from tokentui.core.link.protocol import EngineSpec

    # the child loads what this engine runs: the float32 model, or the default (the 4-bit path on CPU)
    spec = EngineSpec(sampler=engine.sampler, options=engine.options,
                      dtype="auto" if engine.facts.quantization is not None else engine.facts.dtype)
    series: dict[str, list[float]] = {"headless": [], "dashboard": []}
    for rep in range(reps):
        series["headless"].append(run_engine(engine)[1].decode_tok_s)
        series["dashboard"].append(asyncio.run(_dashboard_once(spec)))
        log(f"  dashboard rep {rep + 1}/{reps}: headless {series['headless'][-1]:.1f}, "
            f"dashboard {series['dashboard'][-1]:.1f}")
    return {"tok_s": {k: med(v) for k, v in series.items()},
            "ratio": med([d / h for d, h in zip(series["dashboard"], series["headless"])])}
