"""The real `tokentui` command run in a subprocess, and the shape of its one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys


def tokentui(*args, env_extra=None, timeout=300):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "tokentui", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def one_line_error(result, needle, code=2):
    assert result.returncode == code, (result.returncode, result.stderr[-800:])
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip() and "run recorded in" not in ln]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tokentui: ") and needle in lines[0], lines[0]


def record_files(folder):
    """The run records in `folder`, oldest first (not the dashboard's tree files, `*.tree.jsonl`, beside them)."""
    return sorted(p for p in folder.glob("*.jsonl") if not p.name.endswith(".tree.jsonl")) if folder.exists() else []
