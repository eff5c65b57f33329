"""What the panels say is said whole (issue 23 item 12): a change note at 80 columns is one of its short forms,
never "…seed 1 · changed: applies"; one token is "1 token"."""

from __future__ import annotations

from fakes import ScriptedEngine, make_loader, slow_engine, wait_for
from tokentui.core.settings import RunOptions
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.panels import ModelPanel, SamplerPanel
from tokentui.tui.panels.sampler import PENDING_ENDED, PENDING_LIVE


def make_app(engine, **config) -> TokentuiApp:
    return TokentuiApp(DashboardConfig(load=make_loader(engine), user_theme_dir=None, recorder=None,
                                       options=engine.options, **config))


async def test_a_change_note_on_the_one_line_sampler_is_whole():
    engine = slow_engine(delay=0.05, steps=400)
    app = make_app(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.steps >= 2, what="decoding")
        await pilot.press("space")
        await wait_for(pilot, lambda: app.client.paused, what="paused")
        app.controller.new_seed(draw=lambda: 1_234_567_890)  # a long seed: the line is nearly full
        await pilot.press("T")
        await pilot.pause(0.2)
        line = app.query_one(SamplerPanel).last_text.plain
        width = app.query_one(SamplerPanel).content_size.width
        assert len(line) <= width, (line, width)
        assert "seed 1234567890" in line
        note = line.rsplit(" · ", 1)[-1]
        assert note in PENDING_LIVE, line
        await pilot.press("q")


async def test_an_ended_runs_change_note_is_whole_and_one_token_is_one_token():
    engine = ScriptedEngine(options=RunOptions(max_new_tokens=1))
    app = make_app(engine)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.pause(0.2)
        model = app.query_one(ModelPanel).last_text.plain.splitlines()
        assert any(line.split() == ["answer", "1", "token"] for line in model), model
        await pilot.press("T")
        await pilot.pause(0.2)
        sampler = app.query_one(SamplerPanel).last_text.plain.splitlines()
        notes = [line for line in sampler if line.startswith("changed")] or [sampler[-1].rsplit(" · ", 1)[-1]]
        assert notes and notes[0] in PENDING_ENDED, sampler
