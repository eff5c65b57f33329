"""Export's `c` / `C` say what the clipboard copy could do (issue 23 item 17: "copied" inside tmux, where OSC 52
is dropped unless tmux's set-clipboard is on, and nothing was copied)."""

from __future__ import annotations

import os

import pytest

from fakes import ScriptedEngine, make_loader, wait_for
from noting_app import NotingApp
from tokentui.tui import DashboardConfig
from tokentui.tui.clipboard import copy_note
from tokentui.tui.screens.exported import ExportedDialog


def fake_tmux(folder, option: str) -> str:
    """A `tmux` on PATH that answers `show-options -gv set-clipboard` with `option`."""
    script = folder / "tmux"
    script.write_text(f"#!/bin/sh\necho {option}\n")
    script.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize("option, said", [("external", "not copied: inside tmux"),
                                          ("on", "sent to the terminal's clipboard")])
async def test_c_in_the_export_dialog_inside_tmux_says_whether_it_copied(tmp_path, monkeypatch, option, said):
    monkeypatch.chdir(tmp_path)  # the answer of a run not recorded is written here
    monkeypatch.setenv("TMUX", "/tmp/tmux-0/default,1,0")
    monkeypatch.setenv("PATH", fake_tmux(tmp_path, option))
    app = NotingApp(DashboardConfig(load=make_loader(ScriptedEngine()), user_theme_dir=None, recorder=None))
    copied: list[str] = []
    app.copy_to_clipboard = copied.append
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportedDialog), what="the export dialog")
        await pilot.press("c")
        await pilot.pause(0.1)
        notes = [str(n.message) for n in app.toasts]
        assert copied and copied[0].endswith(".txt")
        assert any(said in note for note in notes), notes
        assert not any(note.startswith("copied") for note in notes), notes


def test_outside_tmux_the_copy_is_sent_not_claimed():
    message, severity = copy_note("a.txt", env={}, tmux_option=lambda: None)
    assert message.startswith("a.txt sent to the terminal's clipboard (OSC 52") and severity == "information"


def test_inside_tmux_an_unreadable_option_is_said_so():
    message, severity = copy_note("a.txt", env={"TMUX": "x"}, tmux_option=lambda: None)
    assert "not copied" in message and "could not be read" in message and severity == "warning"
