"""The dashboard follows the size of the terminal it draws on, in tmux (tui/driver.py): a LINES / COLUMNS left in the
environment (exported by a shell, a parent program, or pytest-xdist's workers) does not pin it to a size the terminal
no longer has, and `tokentui > file` (stdout not a terminal) does not shrink it to 80x24."""

from __future__ import annotations

from pathlib import Path

import pytest

from tmux_pane import Pane, have_tmux, read_pid, wait_gone

pytestmark = [pytest.mark.skipif(not have_tmux(), reason="no tmux: apt-get install tmux")]

RECORD = Path(__file__).resolve().parent.parent / "data" / "record.jsonl"


@pytest.mark.parametrize("how", ["lines and columns exported", "stdout to a file"])
def test_a_resize_reaches_the_layout_whatever_lines_columns_and_stdout_say(tmp_path, how):
    pidfile = tmp_path / "pid"
    stale = how == "lines and columns exported"
    with Pane("size", 160, 48, env={"LINES": "48", "COLUMNS": "160"} if stale else None) as pane:
        if stale:
            pane.type_line("export LINES COLUMNS")
        pane.run_tokentui(["replay", str(RECORD)], pidfile, stdout=None if stale else tmp_path / "stdout")
        pid = read_pid(pidfile)
        pane.wait_for(lambda t: "q quit" in t and "one pass" in t, timeout=60, what="the replay at 160×48")
        pane.resize(80, 24)
        # the one-pass panel is a 160×48 panel (tui/sizes.py): gone once the layout for 80×24 is in place (for a
        # frame or two after the resize the old layout can show at the new size: the app lays out again on its next
        # paint; CI caught one such frame, and a screen that chose at Textual's resize itself looped in a test)
        screen = pane.wait_for(lambda t: t.splitlines() and "q quit" in t.splitlines()[-1] and "one pass" not in t,
                               timeout=20, what="the 80×24 layout, its key bar on the last line")
        assert len(screen.splitlines()) <= 24
        pane.resize(160, 48)
        pane.wait_for(lambda t: "one pass" in t and t.splitlines() and "q quit" in t.splitlines()[-1], timeout=20,
                      what="the 160×48 layout again")
        pane.send("q")
        assert pane.exit_status(timeout=30) == 0
        wait_gone(pid, timeout=30)
