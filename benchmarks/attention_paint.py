"""The attention view (`A`, issue 39) as a user has it: the real dashboard (headless Textual) on the embedded model
in its own process (the real protocol), a run of --steps tokens with the view open against the same run with it
closed, alternated --rounds times:

- the decode speed each run's done event reports (the step time the user gets with the view on, as a ratio);
- with the view open, which steps the view painted (AttentionPanel.show building a step's attention, wrapped and
  timed), the longest time between two such paints, and the time from the run's last step reaching the dashboard
  to the view painting it ("the dashboard still paints every step": a step the frame rate coalesces is painted
  with the next one, so the figure that matters is that the view keeps up, not one frame per step);
- after the run, `[` pressed --presses times: each timed from the key to the view's paint of that past step
  (time travel's 100 ms target).

    .venv/bin/python benchmarks/attention_paint.py [--steps 64] [--rounds 2] [--presses 10] [--size 160x48]
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


async def one_run(steps: int, view: bool, presses: int, size: tuple[int, int]) -> dict:
    from textual import events

    from tokentui.core.link.process_client import ProcessClient
    from tokentui.core.link.protocol import EngineSpec
    from tokentui.core.settings import RunOptions, SamplerSettings
    from tokentui.tui import DashboardConfig, TokentuiApp
    from tokentui.tui.panels.attention import AttentionPanel, AttentionScreen

    spec = EngineSpec(device="cpu", dtype="auto")

    class Source:
        def client(self, sampler, options, recorder):
            return ProcessClient(spec, sampler, options, recorder)

    options = RunOptions(max_new_tokens=steps, ignore_eos=True)
    app = TokentuiApp(DashboardConfig(load=Source(), user_theme_dir=None, options=options, recorder=None,
                                      sampler=SamplerSettings(temperature=0.0, seed=1)))
    paints: list[tuple[float, int]] = []  # (when, step index) of each paint of a step's attention
    arrived: dict[int, float] = {}
    out: dict = {"view": view}
    async with app.run_test(size=size) as pilot:
        controller = app.controller
        await pilot.press("space")  # hold the run at its first token while the view opens
        while not (controller.loaded and app.state.steps >= 1 and controller.client.paused):
            await asyncio.sleep(0.02)
        if view:
            await pilot.press("A")
            while not isinstance(app.screen, AttentionScreen):
                await asyncio.sleep(0.02)
            panel = app.screen.query_one(AttentionPanel)
            original = panel.show

            def show(state, force=False):
                original(state, force)
                step = state.view_step
                if step is not None and getattr(step, "attention", None):
                    paints.append((time.perf_counter(), step.index))

            panel.show = show
        seen = app.state.steps

        def note_arrivals():
            nonlocal seen
            while seen < app.state.steps:
                arrived[seen] = time.perf_counter()
                seen += 1

        await pilot.press("space")
        while app.state.phase != "done":
            note_arrivals()
            await asyncio.sleep(0.002)
        note_arrivals()
        await asyncio.sleep(0.5)
        out["decode_tok_s"] = app.state.run.done.decode_tok_s
        if view:
            captured = [i for i in range(len(app.state.run)) if getattr(app.state.run.step(i), "attention", None)]
            painted = sorted({i for _, i in paints})
            last = max(captured)
            gaps = [(b - a) * 1000 for (a, _), (b, _) in zip(paints, paints[1:])]
            span = paints[-1][0] - paints[0][0] if len(paints) > 1 else 0.0
            # the arrival is seen by polling every 2 ms, the paint in the same frame as the state's update: a paint
            # "before" its arrival is one within that polling (0 here)
            lag = max(0.0, (min(t for t, i in paints if i == last) - arrived[last]) * 1000) \
                if last in painted and last in arrived else None
            out.update(steps_with_attention=len(captured), steps_painted=len(painted),
                       paints_per_s=(len(paints) - 1) / span if span > 0 else None,
                       steps_per_s=len(captured) / span if span > 0 else None,
                       last_step_painted=last in painted, last_step_to_paint_ms=lag,
                       max_ms_between_paints=max(gaps) if gaps else None,
                       median_ms_between_paints=statistics.median(gaps) if gaps else None)
            travel = []
            for _ in range(presses):
                want = app.state.view_step.index - 1
                started = time.perf_counter()
                app.post_message(events.Key("left_square_bracket", "["))
                while not any(t >= started and i == want for t, i in paints):
                    if time.perf_counter() - started > 5:
                        break
                    await asyncio.sleep(0.0005)
                hit = [t for t, i in paints if t >= started and i == want]
                travel.append((hit[0] - started) * 1000 if hit else None)
                await asyncio.sleep(0.1)
            done = [t for t in travel if t is not None]
            out.update(travel_presses=presses, travel_missed=len(travel) - len(done),
                       travel_ms_median=statistics.median(done) if done else None,
                       travel_ms_max=max(done) if done else None)
        await pilot.press("q")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--presses", type=int, default=10)
    parser.add_argument("--size", default="160x48")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    size = tuple(int(n) for n in args.size.split("x"))
    runs = []
    for round_ in range(args.rounds):
        for view in (False, True):
            result = asyncio.run(one_run(args.steps, view, args.presses, size))
            print(json.dumps(result), flush=True)
            runs.append(result)
    off = statistics.median(r["decode_tok_s"] for r in runs if not r["view"])
    on = statistics.median(r["decode_tok_s"] for r in runs if r["view"])
    summary = {"size": args.size, "steps": args.steps, "rounds": args.rounds, "decode_tok_s_off": off,
               "decode_tok_s_on": on, "step_time_ratio_on_over_off": off / on, "runs": runs}
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
