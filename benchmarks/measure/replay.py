"""9: `tokentui replay FILE` (no model): launch to the dashboard's first frame in tmux, and headless to its first line."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from tokentui.core.model.engine import Engine  # noqa: E402
from tokentui.core.settings import RunOptions, SamplerSettings  # noqa: E402
from measure.common import NEW_TOKENS, PROMPT, ROOT, log, med  # noqa: E402


REPLAY_SIZE = (80, 24)  # the smallest terminal the dashboard is laid out for


def _replay_dashboard_seconds(record: Path, env: dict) -> float:
    """Seconds from pressing Enter on `python -m tokentui replay RECORD` in a fresh tmux pane (80x24) to the first
    captured screen that shows the dashboard: the prompt panel's title and the key bar. The pane's shell is
    started first (not timed); the replay is quit with q once seen, and must exit 0."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tmux_pane import EXIT_MARK, Pane

    import shlex

    with Pane("bench-replay", *REPLAY_SIZE, env=env) as pane:
        command = shlex.join([sys.executable, "-m", "tokentui", "replay", str(record)])
        pane.tmux("send-keys", "-t", pane.session, "-l", f"{command}; echo {EXIT_MARK}$?")
        start = time.perf_counter()
        pane.send("Enter")
        seconds = None
        while time.perf_counter() - start < 60:
            text = pane.capture()  # one tmux call, ~5-10 ms: the resolution of this figure
            if "chat template" in text and "q quit" in text:
                seconds = time.perf_counter() - start
                break
        if seconds is None:
            raise RuntimeError(f"no dashboard after 60 s; the screen:\n{pane.capture()}")
        pane.send("q")
        if pane.exit_status(30.0) != 0:
            raise RuntimeError(f"tokentui replay failed: {pane.capture()[-500:]}")
    return seconds


def _replay_headless_seconds(record: Path, env: dict) -> tuple[float, float]:
    """`tokentui replay RECORD --headless --json --speed 0` in a fresh process: seconds to its first line (the
    model event: the record read, the replay started) and to its first step line."""
    cmd = [sys.executable, "-m", "tokentui", "replay", str(record), "--headless", "--json", "--speed", "0"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = step = None
    for line in proc.stdout:
        now = time.perf_counter() - start
        first = now if first is None else first
        if step is None and line.startswith('{"event": "step"'):
            step = now
    err = proc.stderr.read()
    if proc.wait() != 0 or first is None or step is None:
        raise RuntimeError(f"tokentui replay --headless failed: {err.strip()[-500:]}")
    return first, step


def bench_replay_first_frame(loaded, reps: int) -> dict:
    """`tokentui replay FILE` (no torch, no model: tokentui/commands/replay.py) on a record of this benchmark's run
    (NEW_TOKENS greedy tokens, recorded here in-process): launch to the dashboard's first frame in a real
    terminal, and `--headless --json` to its first line, fresh processes, interleaved, medians."""
    from tokentui.core.runs.run import Run

    engine = Engine(loaded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    series: dict[str, list[float]] = {"dashboard": [], "headless_first": [], "headless_step": []}
    with tempfile.TemporaryDirectory(prefix="tokentui-bench-replay-") as tmp:
        run = Run(engine.facts)
        for event in engine.run(PROMPT):
            run.apply(event)
        record = run.save(Path(tmp) / "record.jsonl")
        env = dict(os.environ, TOKENTUI_CONFIG_DIR=tmp, TOKENTUI_STATE_DIR=tmp, TOKENTUI_CACHE_DIR=tmp)
        _replay_headless_seconds(record, env)  # once untimed: the page cache warm, as for the launch rows
        for rep in range(reps):
            series["dashboard"].append(_replay_dashboard_seconds(record, env))
            first, step = _replay_headless_seconds(record, env)
            series["headless_first"].append(first)
            series["headless_step"].append(step)
            log(f"  replay rep {rep + 1}/{reps}: dashboard first frame {series['dashboard'][-1]:.2f} s, headless "
                f"first line {first:.2f} s, first step line {step:.2f} s")
        out = {name: med(values) for name, values in series.items()}
        out.update(dashboard_all=series["dashboard"], reps=reps, record_lines=len(record.read_text().splitlines()),
                   record_kib=record.stat().st_size / 1024)
    return out
