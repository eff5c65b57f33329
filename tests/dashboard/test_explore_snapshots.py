"""Snapshots of exploring a run (docs/runs.md, "Exploring a run"): two branches compared, and the logit lens panel."""

from __future__ import annotations

import pytest

from snapshot_apps_explore import branch_and_compare, branch_app, lens_app, lens_done


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_branch_comparison_snapshot(snap_compare, size):
    assert snap_compare(branch_app(), terminal_size=size, run_before=branch_and_compare)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_logit_lens_snapshot(snap_compare, size):
    assert snap_compare(lens_app(), terminal_size=size, run_before=lens_done)
