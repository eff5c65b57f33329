"""Snapshots of issue 26 (docs/runs.md, "What else could it have said?"): the phrase dialog with the pieces typed, the
fan-out list, the scored answer with its summary — at 80×24 and 160×48."""

from __future__ import annotations

import pytest

from snapshot_apps_what_else import fanned_out, fanout_app, phrase_app, phrase_typed, scored, scored_app


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_phrase_dialog_snapshot(snap_compare, size):
    assert snap_compare(phrase_app(), terminal_size=size, run_before=phrase_typed)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_fanout_list_snapshot(snap_compare, size):
    assert snap_compare(fanout_app(), terminal_size=size, run_before=fanned_out)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_scored_answer_snapshot(snap_compare, size):
    assert snap_compare(scored_app(), terminal_size=size, run_before=scored)
