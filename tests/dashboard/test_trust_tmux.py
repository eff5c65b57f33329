"""The real dashboard in tmux (issue 21): a model process killed with SIGKILL mid-run leaves a record that ends with
the `error` (kind process) and its `done`, and the dashboard says so in its dialog; with a state folder that cannot
be written, the dashboard still starts and runs (the record is said to be not kept), as headless does; escape
sequences in a record (its answer, model name, prompt, error) are drawn escaped and never reach the terminal."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from cli_run import record_files
from tmux_pane import Pane, assert_terminal_restored, have_tmux, read_pid, wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not have_tmux(), reason="no tmux: apt-get install tmux")]


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def lines_of(folder: Path) -> list[dict]:
    files = record_files(folder)  # the run records, not the tree file beside them
    if not files:
        return []
    return [json.loads(line) for line in files[-1].read_text().splitlines(keepends=True) if line.endswith("\n")]


DATA = Path(__file__).resolve().parent.parent / "data"
TITLE = "\x1b]2;PWNED\x07"  # sets the terminal's title when it reaches the terminal


@pytest.mark.parametrize("where", ["answer", "model", "prompt", "error"])
def test_escape_sequences_in_a_record_are_drawn_escaped_not_obeyed(tmp_path, where):
    lines = [json.loads(line) for line in (DATA / "record.jsonl").read_text().splitlines()]
    if where == "answer":
        next(e for e in lines if e["event"] == "step" and e["index"] == 1)["text"] = f"{TITLE}\x1b[2J!"
    elif where == "model":
        lines[0]["name"] = f"{TITLE}model"
    elif where == "prompt":
        lines[1]["text"] = f"{TITLE}prompt"
    else:
        lines[-1:] = [{"event": "error", "message": f"{TITLE}failed", "step": 2, "kind": "crash"}, lines[-1]]
    record = tmp_path / "hostile.jsonl"
    record.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with Pane("escapes", 160, 48) as pane:
        before = pane.tmux("display-message", "-p", "-t", pane.session, "#{pane_title}").stdout
        pane.run_tokentui(["replay", str(record), "--speed", "0"], tmp_path / "pid")
        pid = read_pid(tmp_path / "pid")
        pane.wait_for(lambda t: "<0x1B>]2;PWNED<0x07>" in t, timeout=60, what="the sequence drawn escaped")
        assert pane.tmux("display-message", "-p", "-t", pane.session, "#{pane_title}").stdout == before
        pane.send("Escape")
        time.sleep(0.3)
        pane.send("q")
        pane.exit_status(timeout=60)
        wait_gone(pid, timeout=30)
        assert_terminal_restored(pane)


def test_a_model_process_killed_mid_run_leaves_a_record_ending_with_error_and_done(embedded, isolated_dirs,
                                                                                   tmp_path):
    runs = tmp_path / "runs"
    with Pane("kill9", 120, 36) as pane:
        pane.run_tokentui(["--greedy", "--ignore-eos", "--max-new-tokens", "400", "--record-dir", str(runs)],
                          tmp_path / "pid")
        pid = read_pid(tmp_path / "pid")
        deadline = time.monotonic() + 180
        while len([e for e in lines_of(runs) if e["event"] == "step"]) < 3:
            assert time.monotonic() < deadline, "no steps recorded"
            time.sleep(0.2)
        (model,) = children(pid)
        os.kill(model, signal.SIGKILL)
        screen = pane.wait_for(lambda t: "ended unexpectedly" in t, timeout=60, what="the dialog")
        assert "killed by SIGKILL" in screen
        pane.send("Escape")
        time.sleep(0.5)
        pane.send("q")
        pane.exit_status(timeout=60)
        wait_gone(pid, timeout=30)
        after = pane.capture()
        assert "Traceback" not in after and "run of one prompt recorded in" in after
        assert_terminal_restored(pane)
    lines = lines_of(runs)
    error, done = lines[-2], lines[-1]
    assert error["event"] == "error" and error["kind"] == "process" and "killed by SIGKILL" in error["message"]
    assert done["event"] == "done" and done["reason"] == "error"
    assert done["tokens"] == len([e for e in lines if e["event"] == "step"]) >= 3


def test_the_dashboard_starts_and_runs_with_a_state_folder_it_cannot_write(embedded, isolated_dirs, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("where the state folder should be")
    with Pane("readonly", 120, 36, env={"TOKENTUI_STATE_DIR": str(blocked / "state")}) as pane:
        pane.run_tokentui(["--greedy", "--max-new-tokens", "6"], tmp_path / "pid")
        pid = read_pid(tmp_path / "pid")
        pane.wait_for(lambda t: "run not recorded" in t, timeout=180, what="the not-recorded note")
        pane.wait_for(lambda t: "▶" in t and "✓ done" in t, timeout=120, what="the run's end")
        pane.send("q")
        assert pane.exit_status(timeout=60) == 0
        wait_gone(pid, timeout=30)
        assert "Traceback" not in pane.capture()
        assert_terminal_restored(pane)
