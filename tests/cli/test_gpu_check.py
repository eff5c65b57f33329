"""benchmarks/gpu_check.py, the GPU check, dry-run on the CPU (`--device cpu --tiny`): every row it reports on a
CUDA machine runs here too — transformers' generate, the real command line headless, the real dashboard in tmux —
and prints one table with the figures filled in."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tiny_models import REPO
from tmux_pane import have_tmux

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not have_tmux(), reason="no tmux: apt-get install tmux")]


def test_the_gpu_check_dry_run_prints_every_row(tmp_path, embedded):
    out = tmp_path / "check.json"
    # --no-compile: the compiled rows' code is the engine's own (tests/unit/test_fastpaths.py compiles); here it
    # would add minutes of inductor on a tiny model for nothing the table needs
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--tiny",
                             "--tokens", "8", "--no-compile", "--json", str(out), "--workdir", str(tmp_path)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout
    for row in ("generate (eager)", "headless (eager)", "headless --kv-shapes bucketed", "dashboard (eager)",
                "HBM roofline"):
        assert f"| {row} |" in table, table
    figures = json.loads(out.read_text())
    for name in ("generate (eager)", "headless (eager)", "headless --kv-shapes bucketed", "dashboard (eager)"):
        row = figures["rows"][name]
        assert "error" not in row, (name, row)
    assert figures["rows"]["headless (eager)"]["steps"] == 8 and figures["rows"]["dashboard (eager)"]["steps"] == 8
    assert figures["rows"]["dashboard (eager)"]["ui_lag_ms"] >= 0
    assert figures["rows"]["headless (eager)"]["warm_ms"] > 0 and figures["roofline_ms"] > 0
