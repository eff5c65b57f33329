"""test.sh's requirements (tests/conftest.py): with TOKENTUI_REQUIRE_TMUX=1, a machine without tmux stops the run at
its start in one line that says how to install it, instead of skipping the end-to-end tests; without the switch it
collects as ever."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()


def collect_this_file(path_dirs: str, **switches: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTUI_REQUIRE_")}
    env.update(PATH=path_dirs, **switches)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", str(HERE)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=HERE.parents[2])


def test_without_tmux_the_required_run_stops_in_one_line(tmp_path):
    result = collect_this_file(str(tmp_path), TOKENTUI_REQUIRE_TMUX="1")  # an empty PATH: no tmux on it
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert lines == ["ERROR: tmux is not installed (the end-to-end tests drive the dashboard in it): "
                     "apt-get install tmux"], lines


def test_with_tmux_or_without_the_switch_it_runs(tmp_path):
    tmux = shutil.which("tmux")
    if tmux is None:  # test.sh's run cannot get here: it stops at its start without tmux
        pytest.skip("no tmux on this machine (apt-get install tmux)")
    assert collect_this_file(str(Path(tmux).parent), TOKENTUI_REQUIRE_TMUX="1").returncode == 0
    assert collect_this_file(str(tmp_path)).returncode == 0  # not required: no tmux is no stop
