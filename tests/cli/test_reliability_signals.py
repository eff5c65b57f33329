"""Faults from outside: Ctrl-C, SIGHUP (the SSH connection drops) and SIGTERM, for the dashboard and `--headless`,
during model loading, prefill and decode — each in a real terminal (tmux).

What must hold every time: the process exits promptly (< 15 s), no traceback, the terminal is restored (checked
with `stty` and tmux's pane flags where the pane survives), and the run record is complete: every line valid JSON,
no partial line, step indices 0..n without a gap, and a final `done` event with reason "stopped" whose token count
is the number of steps. While decoding, the process holds no listening network socket.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from cli_run import record_files
from tmux_pane import assert_terminal_restored
from tmux_pane import Pane, have_tmux, listening_sockets, read_pid, wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not have_tmux(), reason="no tmux: apt-get install tmux")]

LONG_RUN = ["--ignore-eos", "--max-new-tokens", "2000"]
EXIT_LIMIT_S = 15.0
EXIT_TIMES: dict[str, float] = {}  # reported at the end of the session (see test_report_exit_times)


def record_lines(runs: Path) -> list[dict]:
    files = record_files(runs)
    if not files:
        return []
    text = files[-1].read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def wait_steps(runs: Path, n: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while sum(e["event"] == "step" for e in record_lines(runs)) < n:
        assert time.monotonic() < deadline, f"fewer than {n} steps recorded after {timeout}s"
        time.sleep(0.1)


def whole_record(runs: Path) -> tuple[list[dict], list[dict]]:
    """The one record in `runs`: whole lines of valid JSON, the model first, no step missing."""
    (path,) = record_files(runs)
    raw = path.read_text(encoding="utf-8")
    assert raw.endswith("\n"), "the record ends with a partial line"
    events = [json.loads(line) for line in raw.splitlines()]  # every line is valid JSON
    assert events[0]["event"] == "model"
    steps = [e for e in events if e["event"] == "step"]
    assert [s["index"] for s in steps] == list(range(len(steps))), "a step is missing"
    return events, steps


def complete_record(runs: Path) -> tuple[list[dict], list[dict], dict]:
    """A whole record that ends with `done` (reason "stopped"); returns (events, steps, done)."""
    events, steps = whole_record(runs)
    done = events[-1]
    assert done["event"] == "done" and done["reason"] == "stopped", done
    assert done["tokens"] == len(steps)
    assert done["text"] == "".join(s["text"] for s in steps) or done["text"].startswith(
        "".join(s["text"] for s in steps).rstrip("\ufffd"))
    return events, steps, done


def deliver(pane: Pane, pid: int, how: str) -> None:
    if how == "ctrl-c":
        pane.send("C-c")
    elif how == "sighup":
        os.kill(pid, signal.SIGHUP)
    elif how == "sigterm":
        os.kill(pid, signal.SIGTERM)
    elif how == "sigint":  # an interrupt sent as a signal (in the dashboard, Ctrl-C typed is a key)
        os.kill(pid, signal.SIGINT)
    elif how == "pane-closed":  # the terminal itself goes away, as when an SSH connection drops
        pane.close()
    else:  # pragma: no cover
        raise ValueError(how)


def exited(pane: Pane, pid: int, label: str) -> float:
    seconds = wait_gone(pid, EXIT_LIMIT_S)
    EXIT_TIMES[label] = seconds
    return seconds


# ---- the dashboard -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["ctrl-c", "sigint", "sighup", "sigterm", "pane-closed"])
def test_dashboard_signal_while_decoding(embedded, isolated_dirs, tmp_path, how):
    runs, pidfile = tmp_path / "runs", tmp_path / "pid"
    with Pane(f"dash-{how}", 120, 40) as pane:
        pane.run_tokentui([*LONG_RUN, "--record-dir", str(runs)], pidfile)
        pid = read_pid(pidfile)
        wait_steps(runs, 3)
        screen = pane.wait_for(lambda t: re.search(r"decoding · step \d+", t), timeout=60, what="decoding")
        shown = int(re.search(r"decoding · step (\d+)", screen).group(1))
        assert listening_sockets(pid) == [], "the dashboard listens on the network"
        deliver(pane, pid, how)
        exited(pane, pid, f"dashboard {how} while decoding")
        if how != "pane-closed":
            assert pane.exit_status() == 0
            after = pane.capture()
            assert "Traceback" not in after and "of one prompt recorded in" in after
            assert_terminal_restored(pane)
    _, steps, done = complete_record(runs)
    assert steps[-1]["index"] >= shown  # everything that was on screen is in the record


def test_dashboard_ctrl_c_while_loading(embedded, isolated_dirs, tmp_path):
    """An empty model cache: the embedded model is being converted (tens of seconds) when Ctrl-C comes."""
    runs, pidfile = tmp_path / "runs", tmp_path / "pid"
    with Pane("dash-load", 120, 40, env={"TOKENTUI_CACHE_DIR": str(tmp_path / "cache")}) as pane:
        pane.run_tokentui([*LONG_RUN, "--record-dir", str(runs)], pidfile)
        pid = read_pid(pidfile)
        pane.wait_for(lambda t: "◌ loading" in t, timeout=120, what="the loading status")
        time.sleep(1.0)  # well inside the conversion
        assert "◌ loading" in pane.capture()
        deliver(pane, pid, "ctrl-c")
        exited(pane, pid, "dashboard ctrl-c while loading")
        assert pane.exit_status() == 0
        assert "Traceback" not in pane.capture()
        assert_terminal_restored(pane)
    assert record_files(runs) == []  # no run started, so no record (and no half-written one)
    assert not list((tmp_path / "cache").glob("*/*/.complete"))  # no half-converted cache in use (4-bit or float)


def test_dashboard_ctrl_c_while_prefilling(embedded, isolated_dirs, tmp_path):
    """A long prompt: Ctrl-C while its single prefill run is going (many seconds on a small CPU). The terminal is
    restored at once; the process waits a little for the run to reach a step boundary, then ends without it."""
    runs, pidfile = tmp_path / "runs", tmp_path / "pid"
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Summarise this. " + "The quick brown fox jumps over the lazy dog. " * 150, encoding="utf-8")
    with Pane("dash-prefill", 120, 40) as pane:
        pane.run_tokentui([*LONG_RUN, "--prompt-file", str(prompt), "--record-dir", str(runs)], pidfile)
        pid = read_pid(pidfile)
        pane.wait_for(lambda t: "◐ prefill" in t, timeout=120, what="the prefill status")
        deliver(pane, pid, "ctrl-c")
        exited(pane, pid, "dashboard ctrl-c while prefilling")
        assert pane.exit_status() == 0
        assert "Traceback" not in pane.capture()
        assert_terminal_restored(pane)
    events, steps = whole_record(runs)
    assert len(steps) <= 2  # nothing ran after the prefill but (at most) the step it scored
    assert events[-1]["event"] in ("prompt", "prefill", "step", "done")


# ---- headless ------------------------------------------------------------------------------------------------

def test_headless_ctrl_c_while_decoding_keeps_what_was_shown(embedded, isolated_dirs, tmp_path):
    runs, pidfile = tmp_path / "runs", tmp_path / "pid"
    with Pane("head-int", 160, 40) as pane:
        # The ^C typed below makes the terminal's line discipline discard the output still queued for the screen
        # (unless NOFLSH): a token written just before it could vanish from the screen though the program wrote it.
        # What is compared is what the program wrote, so the pane keeps its queued output.
        pane.type_line("stty noflsh")
        pane.run_tokentui(["--headless", *LONG_RUN, "--record-dir", str(runs)], pidfile)
        pid = read_pid(pidfile)
        wait_steps(runs, 5)
        assert listening_sockets(pid) == [], "headless mode listens on the network"
        deliver(pane, pid, "ctrl-c")
        exited(pane, pid, "headless ctrl-c while decoding")
        assert pane.exit_status() == 130
        screen = pane.capture(joined=True)
        assert "Traceback" not in screen
        assert "tokentui: interrupted; the run stopped" in screen and "run recorded in" in screen
        assert_terminal_restored(pane)
    _, steps, done = complete_record(runs)
    assert len(steps) >= 5
    # What the terminal showed is exactly the recorded answer.
    # (the last echo of the command line: typed while the shell was still busy with `stty`, the line is echoed by
    # the terminal and then once more after the prompt, CI saw both)
    command_end = screen.rindex("TOKENTUI-EXIT=$?") + len("TOKENTUI-EXIT=$?")
    shown = screen[command_end: screen.index("tokentui: interrupted")]
    shown = shown.replace("^C", "")
    assert " ".join(shown.split()) == " ".join(done["text"].split())


def test_headless_sigterm_json_stream_and_record_agree(embedded, isolated_dirs, tmp_path):
    runs, pidfile, out = tmp_path / "runs", tmp_path / "pid", tmp_path / "out.jsonl"
    with Pane("head-term", 120, 30) as pane:
        pane.run_tokentui(["--headless", "--json", *LONG_RUN, "--record-dir", str(runs)], pidfile, stdout=out)
        pid = read_pid(pidfile)
        wait_steps(runs, 3)
        deliver(pane, pid, "sigterm")
        exited(pane, pid, "headless sigterm while decoding")
        assert pane.exit_status() == 128 + signal.SIGTERM
        screen = pane.capture(joined=True)
        assert "Traceback" not in screen and "terminated (SIGTERM); the run stopped" in screen
        assert_terminal_restored(pane)
    events, steps, done = complete_record(runs)
    streamed = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    streamed_steps = [e for e in streamed if e["event"] == "step"]
    assert streamed[-1] == done  # the stream ends as the record does
    assert [s["index"] for s in streamed_steps] == [s["index"] for s in steps]


def test_headless_terminal_gone_while_decoding(embedded, isolated_dirs, tmp_path):
    """SIGHUP with the terminal gone (writes fail): the run still stops cleanly and the record is complete."""
    runs, pidfile = tmp_path / "runs", tmp_path / "pid"
    with Pane("head-hup", 120, 30) as pane:
        pane.run_tokentui(["--headless", *LONG_RUN, "--record-dir", str(runs)], pidfile)
        pid = read_pid(pidfile)
        wait_steps(runs, 3)
        deliver(pane, pid, "pane-closed")
        exited(pane, pid, "headless terminal closed (SIGHUP) while decoding")
    complete_record(runs)


def test_headless_ctrl_c_while_prefilling(embedded, isolated_dirs, tmp_path):
    runs, pidfile, out = tmp_path / "runs", tmp_path / "pid", tmp_path / "out.jsonl"
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Summarise this. " + "The quick brown fox jumps over the lazy dog. " * 150, encoding="utf-8")
    with Pane("head-prefill", 120, 30) as pane:
        pane.run_tokentui(["--headless", "--json", *LONG_RUN, "--prompt-file", str(prompt),
                           "--record-dir", str(runs)], pidfile, stdout=out)
        pid = read_pid(pidfile)
        deadline = time.monotonic() + 120
        while not any(e["event"] == "prompt" for e in record_lines(runs)):
            assert time.monotonic() < deadline, "the prompt event never came"
            time.sleep(0.02)
        deliver(pane, pid, "ctrl-c")
        exited(pane, pid, "headless ctrl-c while prefilling")
        assert pane.exit_status() == 130
        assert "Traceback" not in pane.capture()
        assert_terminal_restored(pane)
    events, steps, _ = complete_record(runs)
    assert len(steps) <= 2


def test_headless_ctrl_c_while_loading(embedded, isolated_dirs, tmp_path):
    runs, pidfile, out = tmp_path / "runs", tmp_path / "pid", tmp_path / "out.jsonl"
    with Pane("head-load", 120, 30, env={"TOKENTUI_CACHE_DIR": str(tmp_path / "cache")}) as pane:
        pane.run_tokentui(["--headless", "--json", *LONG_RUN, "--record-dir", str(runs)], pidfile, stdout=out)
        pid = read_pid(pidfile)
        deadline = time.monotonic() + 120
        while not (out.exists() and '"event": "load"' in out.read_text(encoding="utf-8")):
            assert time.monotonic() < deadline, "no load progress"
            time.sleep(0.05)
        time.sleep(1.0)
        deliver(pane, pid, "ctrl-c")
        exited(pane, pid, "headless ctrl-c while loading")
        assert pane.exit_status() == 130
        screen = pane.capture()
        assert "Traceback" not in screen and "tokentui: interrupted" in screen
        assert_terminal_restored(pane)
    assert record_files(runs) == []


def test_report_exit_times():
    """Not a check: prints how long each signal took to end the process (run with -s to see it)."""
    for label, seconds in EXIT_TIMES.items():
        print(f"exit after {label}: {seconds:.2f} s")
    assert all(s < EXIT_LIMIT_S for s in EXIT_TIMES.values())
