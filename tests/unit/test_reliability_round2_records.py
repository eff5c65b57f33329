"""Issue 35, items 5, 12 and 13: what a hostile record or tree still got through, and a disk full from the start.

- 5: a tree file names its records by plain file name in its own folder: `../x.jsonl`, `/etc/passwd`, a symlink out
  of the folder are refused, with one line that reads the same whether or not the file named exists;
- 12: a step's latency is a finite time up to a day and `vocab_rows` a vocabulary size (then every token id is
  checked against it); a replay's wait is capped, and pausing ends it: n and space never wait for a recorded time;
- 13: a record nothing could be written to is removed, and the user is told the run was not recorded.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
from pathlib import Path

import pytest

from fake_openai_server import FakeServer
from fakes import ScriptedEngine, record_scripted
from tokentui.cli import main
from tokentui.core.errors import RecordError
from tokentui.core.runs import record_writer, replay, tree
from tokentui.core.runs.events import DoneEvent, StepEvent
from tokentui.core.runs.explore_events import SampleEvent
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.recording import RecordedRun
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.requests import FanoutRequest
from tokentui.core.runs.run import Run
from tokentui.core.runs.tree import RunTree, TreeNode, TreeWriter, relative_record
from tokentui.core.settings import SamplerSettings

RECORD = Path(__file__).resolve().parent.parent / "data" / "record.jsonl"  # a real record (4 steps)
HEADER = {"event": "tree", "version": 1, "prompt": "Is OpenAI open?", "system": None, "model": "m"}


def replay_headless(path, capsys) -> tuple[int, str]:
    status = main(["replay", str(path), "--headless", "--speed", "0"])
    return status, capsys.readouterr().err


def one_line(status: int, err: str) -> str:
    lines = err.splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("tokentui: ") and "Traceback" not in err, err
    return lines[0]


# ---- item 5: a tree names only records beside it ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["../x.jsonl", "/etc/passwd", "../../../../etc/shadow", "sub/x.jsonl", "..", ".",
                                  "", "a\x00b.jsonl", "a\\b.jsonl", 5])
def test_a_tree_node_names_its_record_by_a_plain_file_name_only(name):
    with pytest.raises(ValueError, match="is not a file in the tree's folder"):
        TreeNode(1, record=name)
    assert TreeNode(1, record="20261201-101500-4242.jsonl").record == "20261201-101500-4242.jsonl"


def tree_naming(folder: Path, record_name: str) -> Path:
    path = folder / "t.tree.jsonl"
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps({"event": "tree_run", "number": 1,
                                                             "record": record_name}) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def beside(tmp_path):
    """A tree's folder, with a valid record outside it (tmp_path/outside.jsonl) and one inside (real.jsonl)."""
    folder = tmp_path / "trees"
    folder.mkdir()
    shutil.copy(RECORD, tmp_path / "outside.jsonl")
    shutil.copy(RECORD, folder / "real.jsonl")
    return folder


def test_a_tree_naming_a_record_outside_its_folder_is_one_line_whether_or_not_it_exists(beside, capsys):
    said = {}
    for name in ("../outside.jsonl", "../missing.jsonl", "/etc/passwd", "/no/such/file", "missing.jsonl"):
        line = one_line(*replay_headless(tree_naming(beside, name), capsys))
        said[name] = line.replace(json.dumps(name), "NAME")
    assert len(set(said.values())) == 1, said  # the same line for an existing file and a missing one
    assert said["/etc/passwd"] == (f"tokentui: {beside / 't.tree.jsonl'}: line 2: run 1's record NAME is not a file "
                                   "in the tree's folder (a tree names each record by its file name, beside the tree)")
    assert replay_headless(tree_naming(beside, "real.jsonl"), capsys)[0] == 0  # a record beside it plays


def test_a_symlink_out_of_the_folder_is_refused_as_a_missing_file_is(beside, capsys):
    (beside / "out.jsonl").symlink_to(beside.parent / "outside.jsonl")
    (beside / "in.jsonl").symlink_to(beside / "real.jsonl")
    out = one_line(*replay_headless(tree_naming(beside, "out.jsonl"), capsys))
    missing = one_line(*replay_headless(tree_naming(beside, "gone.jsonl"), capsys))
    assert out.replace('"out.jsonl"', "NAME") == missing.replace('"gone.jsonl"', "NAME")
    assert replay_headless(tree_naming(beside, "in.jsonl"), capsys)[0] == 0  # a symlink within the folder plays


def test_the_dashboard_names_only_a_record_beside_its_tree(tmp_path):
    other = tmp_path / "elsewhere"
    assert relative_record(tmp_path / "t.tree.jsonl", tmp_path / "r.jsonl") == "r.jsonl"
    assert relative_record(tmp_path / "t.tree.jsonl", other / "r.jsonl") is None  # never a name the reader refuses


# ---- item 12: times and vocabulary sizes a run can have; a replay's wait always skippable -----------------------
def edited(tmp_path, line: int, field: str, raw: str) -> Path:
    """RECORD with `field` of line `line` (1-based) set to the JSON text `raw` (written as is: 1e400 stays 1e400)."""
    lines = RECORD.read_text().splitlines()
    data = json.loads(lines[line - 1])
    data[field] = "@@"
    lines[line - 1] = json.dumps(data).replace('"@@"', raw)
    path = tmp_path / "edited.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("raw", ["1e300", "1e400", "1" + "0" * 400, "86400001"])
def test_a_step_latency_past_a_day_is_one_line_naming_the_field_and_line(tmp_path, capsys, raw):
    line = one_line(*replay_headless(edited(tmp_path, 4, "latency_ms", raw), capsys))
    assert "line 4: step.latency_ms should be" in line, line


@pytest.mark.parametrize("raw", ["-1", str(2**31 + 1), str(10**18)])
def test_vocab_rows_outside_a_vocabulary_size_is_one_line(tmp_path, capsys, raw):
    line = one_line(*replay_headless(edited(tmp_path, 1, "vocab_rows", raw), capsys))
    assert "line 1: model.vocab_rows should be a vocabulary size in 1..2147483648" in line, line


def test_a_fan_outs_sample_ids_are_checked_against_the_vocabulary(tmp_path):
    engine = ScriptedEngine(sampler=SamplerSettings(temperature=0.8, seed=2))
    run = Run(engine.facts)
    for event in engine.run("Is OpenAI open?"):
        run.apply(event)
    with RecordedRun(engine.facts, RunRecorder(tmp_path), on_note=pytest.fail) as recorded:
        path = recorded.open()
        samples = [e for e in recorded.record(engine.fanout(FanoutRequest.of_run(run, 3, n=3, m=4, seed=9)))
                   if isinstance(e, SampleEvent)]
    lines = path.read_text().splitlines()
    facts = json.loads(lines[0])
    facts["vocab_rows"] = max(samples[0].ids)  # the largest id of a sample is outside
    path.write_text("\n".join([json.dumps(facts)] + lines[1:]) + "\n")
    with pytest.raises(RecordError, match=f"is outside the model's vocabulary of {facts['vocab_rows']}"):
        Run.from_record(path)


def hour_steps(tmp_path) -> Path:
    """A scripted record whose every step took an hour (a long step, but one a run can have)."""
    path, _ = record_scripted(tmp_path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for data in lines:
        if data["event"] == "step":
            data["latency_ms"] = 3_600_000.0
    path.write_text("".join(json.dumps(data) + "\n" for data in lines))
    return path


def next_step(events: queue.Queue, within: float) -> StepEvent:
    deadline = time.monotonic() + within
    while True:
        event = events.get(timeout=max(0.01, deadline - time.monotonic()))
        if isinstance(event, StepEvent):
            return event


def playing(engine: ReplayEngine) -> tuple[queue.Queue, threading.Thread]:
    events: queue.Queue = queue.Queue()
    thread = threading.Thread(target=lambda: [events.put(e) for e in engine.run()], daemon=True)
    thread.start()
    return events, thread


def test_pausing_ends_a_long_wait_and_n_and_space_let_the_next_step_through_at_once(tmp_path):
    engine = ReplayEngine.from_record(hour_steps(tmp_path), speed=1)
    events, thread = playing(engine)
    with pytest.raises(queue.Empty):
        next_step(events, 0.3)  # waiting on the first step's hour
    engine.pause()
    engine.step_once()  # n
    assert next_step(events, 3).index == 0
    engine.step_once()
    assert next_step(events, 3).index == 1
    engine.resume()  # space
    assert next_step(events, 3).index == 2
    engine.stop()
    thread.join(5)
    assert not thread.is_alive()


def test_no_recorded_wait_holds_a_replay_longer_than_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(replay, "MAX_WAIT_S", 0.1)
    engine = ReplayEngine.from_record(hour_steps(tmp_path), speed=1)
    events, thread = playing(engine)
    thread.join(20)
    assert not thread.is_alive()
    played = list(events.queue)
    assert isinstance(played[-1], DoneEvent) and played[-1].reason == "eos"


# ---- item 13: a disk full from the start leaves no empty record -------------------------------------------------
@pytest.fixture
def full_disk(monkeypatch):
    """Files are created as ever (0600, never overwritten), but every write to them fails as a full disk's does:
    their handle writes to /dev/full."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full: not a Linux machine")

    def patch(module):
        real = module.open_private

        def opened(path):
            real(path).close()
            return open("/dev/full", "w", encoding="utf-8")

        monkeypatch.setattr(module, "open_private", opened)

    return patch


def test_a_record_nothing_could_be_written_to_is_removed_and_said(tmp_path, full_disk):
    full_disk(record_writer)
    notes: list[str] = []
    engine = ScriptedEngine()
    with RecordedRun(engine.facts, RunRecorder(tmp_path), on_note=notes.append) as run:
        assert run.open() is None
        events = list(run.record(engine.run("Is OpenAI open?")))
    assert notes == [f"run not recorded: No space left on device writing to {tmp_path}"]
    assert list(tmp_path.iterdir()) == [] and run.path is None and not run.cut_short
    assert isinstance(events[-1], DoneEvent) and events[-1].reason == "eos"  # the run went on


def test_headless_on_a_full_disk_says_the_run_was_not_recorded_and_leaves_no_file(tmp_path, full_disk, capsys):
    full_disk(record_writer)
    with FakeServer() as server:
        status = main(["--server", server.url, "--headless", "--greedy", "--record-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 0 and list(tmp_path.iterdir()) == []
    assert err.splitlines()[0] == f"tokentui: run not recorded: No space left on device writing to {tmp_path}"
    assert "run recorded in" not in err


def test_a_tree_file_nothing_could_be_written_to_is_removed(tmp_path, full_disk):
    full_disk(tree)
    with pytest.raises(OSError):
        TreeWriter(tmp_path / "t.tree.jsonl", RunTree(prompt="p", model="m"))
    assert list(tmp_path.iterdir()) == []
