"""The dashboard at GPU speed (issue 27, item 4): a model process that writes `--rate` steps a second (the tests'
scripted engine in a real second process speaking the real protocol: tests/scripted_process.py), the real
dashboard (headless Textual at 160x48) reading it, and what a user would feel:

- key press to screen: a `T` / `t` delivered as the terminal's input thread delivers it, timed to the sampler
  panel's render that carries the new temperature (median and p95 over the presses);
- "done" on screen after the engine's done (the child stamps its done with time.monotonic(), the clock both
  processes share);
- the event backlog: for every 50th step, the time from the child yielding it to the dashboard applying it; the
  backlog does not grow when the last quarter's lag is no larger than the first quarter's (plus a frame);
- the rate the engine reached (it is held back only when the dashboard cannot keep up: the socket's buffer fills and
  the child's send waits — back-pressure, not a queue that grows), and that every step reached the state.

    .venv/bin/python benchmarks/dashboard_rate.py [--rate 1000] [--steps 4000] [--presses 20] [--json FILE]

Targets (issue 27): key press to screen <= 100 ms, done on screen <= 0.25 s after the engine's, no backlog growth.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


async def measure(rate: float, steps: int, presses: int, size=(160, 48)) -> dict:
    import scripted_process
    from key_to_screen import SamplerRenders, press_temperature

    from tokentui.core.link.client import RunUpdate
    from tokentui.core.link.process_client import ProcessClient
    from tokentui.core.link.protocol import EngineSpec
    from tokentui.core.runs.events import StepEvent
    from tokentui.core.settings import RunOptions, SamplerSettings
    from tokentui.tui import DashboardConfig, TokentuiApp
    from tokentui.tui.panels import StatusLine

    stamps = Path(tempfile.mkdtemp(prefix="tokentui-rate-")) / "stamps"

    class Source:
        def client(self, sampler, options, recorder):
            return ProcessClient(EngineSpec(), sampler, options, recorder,
                                 started=scripted_process.start(1.0 / rate, steps, stamps))

    options = RunOptions(max_new_tokens=steps, ignore_eos=True)
    app = TokentuiApp(DashboardConfig(load=Source(), user_theme_dir=None, options=options,
                                      sampler=SamplerSettings(temperature=0.7)))
    applied: dict[int, float] = {}
    async with app.run_test(size=size) as pilot:
        controller = app.controller
        while not controller.loaded:
            await asyncio.sleep(0.01)
        passed_on = controller.on_reply

        def on_reply(reply) -> None:
            passed_on(reply)
            if isinstance(reply, RunUpdate) and isinstance(reply.event, StepEvent) and reply.event.index % 50 == 0:
                applied[reply.event.index] = time.monotonic()

        controller.client.listener = on_reply
        acted: list[float] = []  # when each key's action ran: the wait before it is the event loop's queue
        change = controller.temperature

        def temperature(direction: int) -> None:
            acted.append(time.perf_counter())
            change(direction)

        controller.temperature = temperature
        while len(app.state.run) < min(steps // 5, 400):
            await asyncio.sleep(0.005)
        latencies: list[float] = []
        queued: list[float] = []
        key = "T"
        with SamplerRenders(app) as renders:
            while app.state.running and len(latencies) < presses:
                pressed = time.perf_counter()
                latency = await press_temperature(app, renders, key, limit=5)
                if latency is not None and acted and acted[-1] >= pressed:
                    latencies.append(latency)
                    queued.append((acted[-1] - pressed) * 1000)
                await asyncio.sleep(0.05)
                key = "t" if key == "T" else "T"
        status = app.query_one(StatusLine)
        while "done" not in (status.last_text.plain if status.last_text is not None else ""):
            await asyncio.sleep(0.001)
        done_on_screen = time.monotonic()
        got = len(app.state.run)
        await pilot.press("q")
    sent, done = scripted_process.read_stamps(stamps)
    lags = sorted((k, (applied[k] - sent[k]) * 1000) for k in sent if k in applied)
    quarter = max(1, len(lags) // 4)
    first_q = statistics.median(lag for _, lag in lags[:quarter])
    last_q = statistics.median(lag for _, lag in lags[-quarter:])
    reached = done[0] / (done[1] - sent[0]) if done is not None and 0 in sent else None
    ordered = sorted(latencies)
    return {
        "rate_asked": rate, "steps": steps, "steps_in_state": got, "engine_rate": reached,
        "keys": len(latencies), "key_median_ms": statistics.median(latencies) if latencies else None,
        "key_p95_ms": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))] if ordered else None,
        "key_queued_median_ms": statistics.median(queued) if queued else None,  # of it: before the action ran
        "done_to_screen_ms": (done_on_screen - done[1]) * 1000 if done is not None else None,
        "lag_first_quarter_ms": first_q, "lag_last_quarter_ms": last_q,
        "backlog_grows": last_q > first_q + 1000 / 30,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=1000.0, help="steps a second the model process writes (1000)")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--presses", type=int, default=20)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    result = asyncio.run(measure(args.rate, args.steps, args.presses))
    for name, value in result.items():
        print(f"{name:24s} {value:.1f}" if isinstance(value, float) else f"{name:24s} {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
