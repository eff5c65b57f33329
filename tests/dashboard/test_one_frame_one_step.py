"""Every panel shows the same step in one frame: the latency plot and the one-pass panel used to be drawn on clocks
of their own (4 and 5 times a second), so mid-run the plot said "steps 11–53" while the KV panel was at step 56 and
the one-pass panel said step 67 beside the candidates' step 69."""

from __future__ import annotations

import re

from fakes import ScriptedEngine, make_loader, wait_for
from tokentui.core.settings import RunOptions
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.panels import CandidatesPanel, KVPanel, SpeedPanel, StatusLine


def steps_on_screen(app) -> dict[str, int]:
    """The step each panel shows now, read from what it drew."""
    status = re.search(r"step (\d+)", app.query_one(StatusLine).last_text.plain)
    candidates = re.search(r"step (\d+)", app.query_one(CandidatesPanel).border_subtitle)
    anatomy = re.search(r"step (\d+)", app.anatomy_panel.border_subtitle)
    window = app.query_one(SpeedPanel).plot.window
    kv = re.search(r"tokens +([\d,]+)", app.query_one(KVPanel).last_text.plain)
    kv_tokens = int(kv.group(1).replace(",", ""))
    run = app.state.run
    kv_step = next(i + 1 for i in range(len(run)) if run.step(i).kv_tokens == kv_tokens)
    return {"status": int(status.group(1)), "candidates": int(candidates.group(1)),
            "one pass": int(anatomy.group(1)), "plot": window[-1][0] if window else 1, "kv": kv_step}


CHECKS = 30  # frames checked, each between two paints


async def test_every_panel_shows_the_same_step_in_every_frame():
    # A run far longer than the checks need (1,000 steps of 15 ms): on a loaded CI machine a 160-step run ended
    # after 19 checks, so the run's length, not the app, decided whether the test passed.
    engine = ScriptedEngine(delay=0.015, options=RunOptions(max_new_tokens=1000, ignore_eos=True))
    app = TokentuiApp(DashboardConfig(load=make_loader(engine), options=engine.options, user_theme_dir=None,
                                      recorder=None))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "decoding" and len(app.state.run) > 3
                       and app.anatomy_panel is not None, timeout=20, what="decoding, the one-pass row shown")
        frames = 0
        while app.state.phase == "decoding" and frames < CHECKS:
            await pilot.pause(0.011)  # between frames: whatever is on screen is one frame's
            if app.state.phase != "decoding" or app.frame_due:
                continue  # a frame is due: the panels wait for it together
            seen = steps_on_screen(app)
            assert len(set(seen.values())) == 1, seen
            frames += 1
        assert frames == CHECKS, f"the run ended after {frames} checks"
