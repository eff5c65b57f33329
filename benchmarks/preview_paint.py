"""A paused step previewed under another temperature (issue 38, 4), timed as a user feels it: the real dashboard
(headless Textual, 160x48) on the embedded model in its own process (the real protocol), the run paused at a step,
then `T` / `t` pressed in turn, each delivered as the terminal's input thread delivers it, timed to the render of
the selection panel that carries that step's preview under the new settings. Also the engine's own time for the
preview (StepPreview.total_ms) and its forward (forward_ms), and the step's prefix length.

    .venv/bin/python benchmarks/preview_paint.py [--steps 40] [--presses 20] [--dtype auto|float32] [--json FILE]

Target (issue 38): a preview repaints within 100 ms on the embedded model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


async def measure(steps: int, presses: int, dtype: str, size=(160, 48)) -> dict:
    from textual import events

    from tokentui.core.link.process_client import ProcessClient
    from tokentui.core.link.protocol import EngineSpec
    from tokentui.core.settings import RunOptions, SamplerSettings
    from tokentui.tui import DashboardConfig, TokentuiApp
    from tokentui.tui.panels import CandidatesPanel

    spec = EngineSpec(device="cpu", dtype=dtype)

    class Source:
        def client(self, sampler, options, recorder):
            return ProcessClient(spec, sampler, options, recorder)

    options = RunOptions(max_new_tokens=steps + 8, ignore_eos=True)
    app = TokentuiApp(DashboardConfig(load=Source(), user_theme_dir=None, options=options, recorder=None,
                                      sampler=SamplerSettings(temperature=0.7, seed=1)))
    panel_renders: list[tuple[float, str]] = []
    async with app.run_test(size=size) as pilot:
        controller = app.controller
        await pilot.press("space")  # pause at the first token
        while not (controller.loaded and app.state.steps >= 1 and controller.client.paused):
            await asyncio.sleep(0.05)
        while app.state.steps < steps:
            before = app.state.steps
            await pilot.press("n")
            while app.state.steps == before:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)
        panel = app.query_one(CandidatesPanel)
        original = panel.render

        def render():
            result = original()
            panel_renders.append((time.perf_counter(), getattr(result, "plain", str(result))))
            return result

        panel.render = render
        times, engine_ms, forward_ms = [], [], []
        for n in range(presses):
            key = "T" if n % 2 == 0 else "t"  # 0.8, 0.9, 0.8, ...: never the step's own 0.7 (no preview then)
            if n == 0:
                app.post_message(events.Key("T", "T"))  # 0.7 -> 0.8 first, untimed
                await asyncio.sleep(1.0)
            panel_renders.clear()
            started = time.perf_counter()
            app.post_message(events.Key(key, key))
            while True:
                preview = controller.previews.shown
                if preview is not None and preview.settings == controller.sampler and panel_renders and \
                        panel_renders[-1][0] >= started and "preview" in panel_renders[-1][1]:
                    times.append((panel_renders[-1][0] - started) * 1000)
                    engine_ms.append(preview.total_ms)
                    forward_ms.append(preview.forward_ms)
                    break
                if time.perf_counter() - started > 10:
                    times.append(None)
                    break
                await asyncio.sleep(0.0005)
            await asyncio.sleep(0.2)
        prefix = len(app.state.prompt.ids) + app.state.view_step.index
        await pilot.press("q")
    done = [t for t in times if t is not None]
    return {"size": f"{size[0]}x{size[1]}", "dtype": dtype, "step": steps, "prefix_tokens": prefix,
            "presses": presses, "missed": len(times) - len(done),
            "key_to_paint_ms_median": statistics.median(done) if done else None,
            "key_to_paint_ms_max": max(done) if done else None,
            "engine_ms_median": statistics.median(engine_ms) if engine_ms else None,
            "forward_ms_median": statistics.median(forward_ms) if forward_ms else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--presses", type=int, default=20)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = asyncio.run(measure(args.steps, args.presses, args.dtype))
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
