"""The one-line readings strip says which reading is which: the last step's latency beside the run's average rate
(they used to read as one: "37.6 ms/step · 17.4 tok/s"), a past step's own latency beside the rate up to it (not the
whole run's), and the step a prefill scored as its TTFT (not "243.4 ms/step"); the speed panel names it too."""

from __future__ import annotations

import re

from fakes import ScriptedEngine, make_loader, wait_for
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.panels import ReadingsStrip, SpeedPanel


def make_app(engine) -> TokentuiApp:
    return TokentuiApp(DashboardConfig(load=make_loader(engine), user_theme_dir=None, recorder=None))


def strip(app) -> str:
    return app.query_one(ReadingsStrip).last_text.plain


async def settle(pilot) -> None:
    await pilot.pause(0.05)
    pilot.app.redraw()
    await pilot.pause()


async def test_live_the_strip_says_last_step_and_average_rate():
    engine = ScriptedEngine(pause_before={10})
    app = make_app(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.steps == 10 and engine.paused, what="the pause at step 10")
        await settle(pilot)
        stats = app.state.latency_stats()
        text = strip(app)
        assert re.search(rf"last {stats['last']:.1f} ms(/step)? · {stats['tok_s']:.1f} tok/s avg", text), text
        assert f"{1000 / stats['last']:.1f} tok/s" not in text  # the rate is not the last step's


async def test_at_a_past_step_the_rate_is_as_of_that_step_and_step_1_is_the_ttft():
    app = make_app(ScriptedEngine())
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        whole = app.state.latency_stats()["tok_s"]
        await pilot.press("less_than_sign")  # step 1: scored by the prefill
        await settle(pilot)
        text = strip(app)
        first = app.state.run.step(0)
        assert f"TTFT {first.latency_ms:.1f} ms" in text and "ms/step" not in text, text
        await pilot.press(*["right_square_bracket"] * 4)  # step 5
        await settle(pilot)
        text = strip(app)
        lat = app.state.run.values("latency_ms", 1, 5)
        as_of = 1000 * len(lat) / sum(lat)
        assert f"{as_of:.1f}" != f"{whole:.1f}"  # the scripted latencies make the two differ
        assert re.search(rf"(at step 5 │ |@5│).*{lat[-1]:.1f} ms(/step)? · {as_of:.1f} tok/s to it", text), text


async def test_the_speed_panel_names_step_1_as_the_ttft():
    app = make_app(ScriptedEngine())
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.press("less_than_sign")
        await settle(pilot)
        text = app.query_one(SpeedPanel).last_text.plain
        assert f"step 1 TTFT {app.state.run.step(0).latency_ms:.1f}" in text, text
