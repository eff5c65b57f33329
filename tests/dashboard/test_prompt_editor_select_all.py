"""The prompt editor's select-all (issue 40, 11: ctrl+a went to the line's start, and nothing on screen said how to
clear a prompt): ctrl+a selects all of the field typed in, typing then replaces it and backspace clears it, and
the dialog says so, at 80×24, 120×30 and 160×48."""

from __future__ import annotations

import pytest

from fakes import ScriptedEngine, make_loader, screen_text, wait_for
from snapshot_apps import SnapshotApp
from tokentui.tui import DashboardConfig
from tokentui.tui.screens import PromptEditor

SIZES = [(80, 24), (120, 30), (160, 48)]


def app_on(engine) -> SnapshotApp:
    return SnapshotApp(DashboardConfig(load=make_loader(engine), user_theme_dir=None, recorder=None,
                                       prompt="Is OpenAI open?\nSay why, in two lines."))


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_ctrl_a_then_typing_replaces_the_whole_prompt(size):
    engine = ScriptedEngine()
    app = app_on(engine)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the first run")
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptEditor), what="the editor")
        await pilot.pause(0.1)
        text = " ".join(screen_text(app).split())
        assert "ctrl+a selects it all: type to replace it, delete to clear it" in text, text
        assert "ctrl+a select all" in text, text
        await pilot.press("ctrl+a", *"Why?")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: len(engine.runs) == 2 and app.state.phase == "done", what="the new run")
        assert engine.runs[-1][0] == "Why?", engine.runs  # the whole two-line prompt replaced


async def test_ctrl_a_then_backspace_clears_it_and_the_system_field_too():
    engine = ScriptedEngine()
    app = app_on(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the first run")
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptEditor), what="the editor")
        await pilot.press("ctrl+a", "backspace")
        assert app.screen.query_one("#prompt-text").text == ""
        await pilot.press("ctrl+s")  # an empty prompt is refused in the dialog
        await pilot.pause(0.1)
        assert isinstance(app.screen, PromptEditor) and "the prompt is empty" in screen_text(app)
        await pilot.press(*"Hi", "tab")  # to the system prompt field: its ctrl+a is select-all too, not home
        await pilot.press(*"You are terse.", "ctrl+a", *"Be kind.")
        assert app.screen.query_one("#system-text").value == "Be kind."
