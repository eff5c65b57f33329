"""A run tree file is outside input, like a record (a shared file, a hand-edited one): it is read as records are
(a line at a time, strict JSON, the line cap) and whatever is wrong is one RecordError line naming the file and the
line; a last line cut short by a crash is ignored. The tree and its records are written 0600."""

from __future__ import annotations

import json
import os
import stat

import pytest

from tokentui.core.errors import RecordError
from tokentui.core.runs import record_reader
from tokentui.core.runs.tree import RunTree, TreeEnd, TreeNode, TreeWriter, is_tree_file

HEADER = {"event": "tree", "version": 1, "prompt": "Is OpenAI open?", "system": None, "model": "m"}
RUN = {"event": "tree_run", "number": 1, "record": None}


def write_lines(path, *lines: str) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def read_error(path) -> str:
    with pytest.raises(RecordError) as caught:
        RunTree.read(path, with_runs=False)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    return message


def test_a_written_tree_reads_back_and_is_private(tmp_path):
    path = tmp_path / "a.tree.jsonl"
    tree = RunTree(prompt="Is OpenAI open?", system=None, model="m")
    writer = TreeWriter(path, tree)
    writer.add(TreeNode(number=1, record="a.jsonl"))
    writer.end(TreeEnd(number=1, reason="eos", steps=3))
    writer.close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    back = RunTree.read(path, with_runs=False)
    assert back.prompt == "Is OpenAI open?" and [n.record for n in back.nodes] == ["a.jsonl"]
    assert is_tree_file(path)


@pytest.mark.parametrize("bad, said", [
    ('{"event": "tree_run", "number": NaN, "record": null}', "NaN is not JSON"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('["a list"]', "not a JSON object"),
])
def test_a_bad_line_in_the_middle_is_one_line_naming_it(tmp_path, bad, said):
    path = tmp_path / "t.tree.jsonl"
    write_lines(path, json.dumps(HEADER), bad, json.dumps(RUN))
    message = read_error(path)
    assert "line 2" in message and said in message


def test_a_line_past_the_cap_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(record_reader, "MAX_LINE_BYTES", 1024)
    path = tmp_path / "t.tree.jsonl"
    write_lines(path, json.dumps(HEADER), json.dumps({**RUN, "record": "x" * 5000}))
    assert "line 2 is longer than" in read_error(path)


def test_a_last_line_cut_by_a_crash_is_ignored(tmp_path):
    path = tmp_path / "t.tree.jsonl"
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(RUN) + "\n" + '{"event": "tree_end", "num', "utf-8")
    tree = RunTree.read(path, with_runs=False)
    assert len(tree) == 1


def test_a_hostile_first_line_is_not_a_tree(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("[" * 100_000 + "\n", encoding="utf-8")
    assert not is_tree_file(path)
