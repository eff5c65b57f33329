"""End to end in a real terminal: tmux runs `tokentui` (no arguments: the dashboard on the embedded model with
the seeds' question), the screen shows the prompt tokens, the candidates and the answer; `T` raises the
temperature on screen; at 80×24 the readings strip shows the KV size, the ms/step figure and the pending bytes as
the record has them, with `q quit` in the key bar; `q` quits and leaves the shell usable (cooked mode, echo, no
alternate screen, no mouse reporting, cursor visible)."""

from __future__ import annotations

import json
import re
import time

import pytest

from tmux_pane import Pane, assert_terminal_restored, have_tmux, read_pid, wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not have_tmux(), reason="no tmux: apt-get install tmux")]


def record_of(pid: int, runs_dir) -> list[dict]:
    """The run record the process with `pid` is writing (its file name carries the pid); complete lines only."""
    files = sorted(runs_dir.glob(f"*-{pid}.jsonl")) + sorted(runs_dir.glob(f"*-{pid}-*.jsonl"))
    if not files:
        return []
    text = files[-1].read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]




def check_readings_strip(screen: str, record: list[dict]) -> None:
    """The strip's KV size, token count, ms/step and pending bytes are those of one step in the run record."""
    from tokentui.tui.format import human_bytes

    match = re.search(r"5 decode KV (\S+ \S+) · ([\d,]+) tok ?│ ?last ([\d.]+) ms(?:/step)? · ([\d.]+) tok/s avg ?│ ?"
                      r"pending (.+?)\s*│", screen)
    assert match, screen
    size, tokens, ms_step, pending = match.group(1), int(match.group(2).replace(",", "")), match.group(3), \
        match.group(5)
    steps = [e for e in record if e["event"] == "step"]
    done = [e for e in record if e["event"] == "done"]
    at = [e for e in steps + done if e.get("kv_tokens") == tokens]
    assert at and human_bytes(at[-1]["kv_bytes"]) == size, (size, tokens, at[-1:] if at else None)
    decodes = [s for s in steps if s["index"] >= 1 and s["kv_tokens"] <= tokens]
    assert ms_step == f"{decodes[-1]['latency_ms']:.1f}", (ms_step, decodes[-1]["latency_ms"])
    if done:  # the run ended: nothing is held (bytes it ended on are shown as dropped)
        expected = done[0].get("dropped_hex") or "none"
    else:  # paused after the step the strip shows
        expected = [s for s in steps if s["kv_tokens"] == tokens][-1]["pending_hex"] or "none"
    assert pending.split(" needs")[0].split(" +")[0].split(" dropped")[0] == expected, (pending, expected)


def test_dashboard_in_tmux_shows_the_run_takes_keys_and_quits_cleanly(embedded, isolated_dirs, tmp_path):
    runs_dir = isolated_dirs["TOKENTUI_STATE_DIR"] / "runs"
    pidfile = tmp_path / "pid"
    with Pane("e2e", 160, 48) as pane:
        pane.run_tokentui([], pidfile)
        pid = read_pid(pidfile)
        screen = pane.wait_for(lambda t: "␣Open" in t, timeout=120, what="the prompt tokens")
        assert "Is OpenAI open?" in screen  # the chat-templated text (tall terminal)
        assert "1 chat template · 2 tokenize" in screen and "prompt tokens" in screen

        # The candidates table and the answer as it streams.
        screen = pane.wait_for(lambda t: "▶" in t and "sampled p" in t and re.search(r"\d+\.\d%", t),
                               timeout=120, what="the candidates table")
        assert "4 selection · candidates" in screen and "entropy" in screen
        deadline = time.monotonic() + 120
        while len([e for e in record_of(pid, runs_dir) if e["event"] == "step"]) < 4:
            assert time.monotonic() < deadline, "no steps recorded"
            time.sleep(0.2)
        steps = [e for e in record_of(pid, runs_dir) if e["event"] == "step"]
        opening = "".join(s["text"] for s in steps[:3]).strip()
        assert opening
        pane.wait_for(lambda t: opening in t, timeout=60, what=f"the answer's opening {opening!r}")

        # T raises the temperature: the sampler panel shows it.
        assert re.search(r"temperature\s+0\.70", pane.capture())
        pane.send("T")
        screen = pane.wait_for(lambda t: re.search(r"temperature\s+0\.80", t), timeout=10,
                               what="temperature 0.80 on screen")
        assert re.search(r"changed: (applies|from|next)|step \d+ \S+ \S+→\S+", screen)  # says when it applies

        # 80×24, the default terminal: the KV size, the ms/step figure and the pending bytes in the readings strip,
        # each as the record has it, and the key bar keeps `q quit`.
        pane.resize(80, 24)
        pane.send("Space")  # pause, so the screen holds still (a finished run holds still anyway)
        screen = pane.wait_for(lambda t: "tok/s avg" in t and "q quit" in t and len(t.splitlines()) <= 24,
                               timeout=20, what="the readings strip at 80×24")
        time.sleep(0.5)
        screen = pane.capture()
        check_readings_strip(screen, record_of(pid, runs_dir))
        assert "q quit" in screen.splitlines()[-1] and "? more" in screen.splitlines()[-1]  # help lists the rest

        pane.send("q")
        assert pane.exit_status(timeout=60) == 0
        wait_gone(pid, timeout=30)
        after = pane.capture()
        assert "Traceback" not in after and "of one prompt recorded in" in after
        assert_terminal_restored(pane)

    lines = record_of(pid, runs_dir)
    assert lines[0]["event"] == "model" and lines[-1]["event"] in ("done",)
    steps = [e for e in lines if e["event"] == "step"]
    assert [s["index"] for s in steps] == list(range(len(steps)))
    if any(s["settings"]["temperature"] == 0.8 for s in steps):  # the key landed before the run ended
        first = next(s for s in steps if s["settings"]["temperature"] == 0.8)
        assert first["settings_changed"]
