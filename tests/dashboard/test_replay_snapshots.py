"""The dashboard driven by a replayed record (no model, deterministic): the scripted run is recorded to a file
in the test, then replayed as fast as it can be read, at 80×24 and 160×48. Update the baselines with
`pytest tests/dashboard/test_replay_snapshots.py --snapshot-update` after looking at the report."""

from __future__ import annotations

import pytest

from fakes import ScriptedEngine, FACTS
from snapshot_apps import SnapshotApp, wait_until_done
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.run import Run
from tokentui.commands.replay import replay_config

SIZES = [(80, 24), (160, 48)]


def replay_app(directory) -> SnapshotApp:
    run = Run(FACTS)
    for event in ScriptedEngine().run("Is OpenAI open?"):
        run.apply(event)
    path = run.save(directory / "run.jsonl")  # a fixed name: the model panel shows it
    engine = ReplayEngine.from_record(path, speed=0)
    return SnapshotApp(replay_config(engine, user_theme_dir=None))


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_replayed_dashboard_snapshot(snap_compare, tmp_path, size):
    assert snap_compare(replay_app(tmp_path), terminal_size=size, run_before=wait_until_done)
