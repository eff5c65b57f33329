"""The dashboard after the scripted run has finished: 80×24 (essentials) and 160×48 (every panel), for each
built-in theme. Update the baselines with `pytest tests/test_tui_snapshots.py --snapshot-update` after looking
at the report."""

from __future__ import annotations

import pytest

from snapshot_apps import make_app, wait_until_done

THEMES = ["tokentui-dark", "tokentui-light", "tokentui-contrast"]
SIZES = [(80, 24), (160, 48)]


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_dashboard_snapshot(snap_compare, size, theme):
    assert snap_compare(make_app(theme), terminal_size=size, run_before=wait_until_done)
