"""The dashboard after the scripted run has finished: 80×24 (small: the readings strip stands in for the speed, KV
and pending panels) and 160×48 (every panel) for each built-in theme, and 100×30 and 120×36 (the sizes in between:
the chat template appears at 30 rows, the model panel at 120 columns, the bottom row at 120×36) in one theme.
Update the baselines with `pytest tests/dashboard/test_tui_snapshots.py --snapshot-update` after looking at the report."""

from __future__ import annotations

import pytest

from snapshot_apps import make_app, view_step_10, wait_until_done

THEMES = ["tokentui-dark", "tokentui-light", "tokentui-contrast"]
SIZES = [(80, 24), (160, 48)]
BETWEEN = [(100, 30), (120, 36)]


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_dashboard_snapshot(snap_compare, size, theme):
    assert snap_compare(make_app(theme), terminal_size=size, run_before=wait_until_done)


@pytest.mark.parametrize("size", BETWEEN, ids=[f"{w}x{h}" for w, h in BETWEEN])
def test_dashboard_snapshot_between(snap_compare, size):
    assert snap_compare(make_app("tokentui-dark"), terminal_size=size, run_before=wait_until_done)


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_time_travel_snapshot(snap_compare, size):
    """The cursor held at step 10 of the finished run: every panel shows that step, the token marked in the answer,
    the status line says "viewing step 10 of 14 — run ended"."""
    assert snap_compare(make_app("tokentui-dark"), terminal_size=size, run_before=view_step_10)
