"""The dashboard's reliability figures (tests/dashboard/test_reliability_dashboard.py), printed: the traced Python
heap over a long answer, key press to screen while generating, and 1,000 mixed key presses handled during a run.

The tests that measure them hold each to its bound and keep the figure (their module's FIGURES) for the assertion
message; this script runs those tests under pytest and prints what they measured, a report rather than a check.

    .venv/bin/python benchmarks/reliability_figures.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULE = "test_reliability_dashboard"  # pytest's module name for the file (tests/ is on its python path)
MEASURING = "memory_flat or thousand_rapid_key_presses"  # the tests that fill FIGURES


def main() -> int:
    status = pytest.main(["-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "dashboard" / f"{MODULE}.py"),
                          "-k", MEASURING])
    module = sys.modules.get(MODULE)
    figures = getattr(module, "FIGURES", {}) if module is not None else {}
    for name, figure in figures.items():
        print(f"{name}: {figure}")
    if not figures:
        print("no figures: the measuring tests did not run", file=sys.stderr)
    return int(status) or (0 if figures else 1)


if __name__ == "__main__":
    sys.exit(main())
