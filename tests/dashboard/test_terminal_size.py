"""The dashboard follows the terminal's own size, in tmux: a LINES / COLUMNS left in the environment (exported by a
shell, a parent program, or pytest-xdist's workers) does not pin it to a size the terminal no longer has."""

from __future__ import annotations

from pathlib import Path

import pytest

from tmux_pane import Pane, have_tmux, read_pid, wait_gone

pytestmark = [pytest.mark.skipif(not have_tmux(), reason="no tmux: apt-get install tmux")]

RECORD = Path(__file__).resolve().parent.parent / "data" / "record.jsonl"


def test_a_resize_reaches_the_layout_whatever_lines_and_columns_say(tmp_path):
    pidfile = tmp_path / "pid"
    with Pane("size", 160, 48, env={"LINES": "48", "COLUMNS": "160"}) as pane:
        pane.type_line("export LINES COLUMNS")
        pane.run_tokentui(["replay", str(RECORD)], pidfile)
        pid = read_pid(pidfile)
        pane.wait_for(lambda t: "q quit" in t and "one pass" in t, timeout=60, what="the replay at 160×48")
        pane.resize(80, 24)
        screen = pane.wait_for(lambda t: t.splitlines() and "q quit" in t.splitlines()[-1], timeout=20,
                               what="the key bar on the last line at 80×24")
        assert "one pass" not in screen  # the one-pass panel is a 160×48 panel (tui/sizes.py)
        assert len(screen.splitlines()) <= 24
        pane.resize(160, 48)
        pane.wait_for(lambda t: "one pass" in t and "q quit" in t.splitlines()[-1], timeout=20,
                      what="the 160×48 layout again")
        pane.send("q")
        assert pane.exit_status(timeout=30) == 0
        wait_gone(pid, timeout=30)
