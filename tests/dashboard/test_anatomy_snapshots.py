"""Snapshots of the one-pass panel (issue 16; docs/dashboard.md, "The one-pass panel"): on by default at 160×48 in a row of
its own, and at 80×24 after `a`, in the candidates' place. Both at step 4 of the scripted run."""

from __future__ import annotations

from snapshot_apps_anatomy import anatomy_app, press_a_at_step_4, view_step_4


def test_one_pass_snapshot_160x48(snap_compare):
    assert snap_compare(anatomy_app(), terminal_size=(160, 48), run_before=view_step_4)


def test_one_pass_snapshot_80x24(snap_compare):
    assert snap_compare(anatomy_app(), terminal_size=(80, 24), run_before=press_a_at_step_4)
