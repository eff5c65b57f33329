"""Follow-up turns in records and run trees (issue 40, 13; core/runs/turns.py, core/runs/tree.py): a turn's record
carries its `turn` event (the whole conversation, what was reused) and reads back to the same events; a tree names
a turn as a child of the run it follows, with its message, and reads back; a replay plays a turn's record, and a
tree's recorded follow-up when it is asked again. Bad turn lines are one RecordError line. Torch-free: the scripted
engine's run stands in for an answer."""

from __future__ import annotations

import json

import pytest

from fakes import ScriptedEngine
from tokentui.core.errors import RecordError
from tokentui.core.runs.events import PrefillEvent, PromptEvent
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.run import Run
from tokentui.core.runs.tree import RunTree, TreeEnd, TreeNode, TreeWriter
from tokentui.core.runs.turns import Message, TurnEvent, TurnRequest, follow_up, history_of

AGAIN = "And Anthropic?"


def scripted_run() -> tuple[ScriptedEngine, Run]:
    engine = ScriptedEngine()
    run = Run(engine.facts)
    for event in engine.run("Is OpenAI open?"):
        run.apply(event)
    return engine, run


def turn_events(engine: ScriptedEngine, first: Run) -> list:
    """A follow-up's events as an engine reports them: its turn event, then a run's (the scripted prompt stands in
    for the conversation's)."""
    request = follow_up(first, AGAIN, parent="first.jsonl")
    events = list(engine.run(AGAIN))
    turn = TurnEvent(turn=2, messages=list(request.messages), parent=request.parent, reused_tokens=3,
                     reused_kv_bytes=3 * 1024, turn_starts=[0, 2])
    prefill = next(e for e in events if isinstance(e, PrefillEvent))
    events[events.index(prefill)] = PrefillEvent(tokens=prefill.tokens - 3, ms=prefill.ms,
                                                 kv_tokens=prefill.kv_tokens, kv_bytes=prefill.kv_bytes,
                                                 reused_tokens=3)
    return [turn, *events]


def record(folder, facts, events):
    recorder = RunRecorder(folder)
    path = recorder.open_run()
    recorder.write(facts)
    for event in events:
        recorder.write(event)
    recorder.close()
    return path


def test_a_turns_record_reads_back_to_the_same_events(tmp_path):
    engine, first = scripted_run()
    events = turn_events(engine, first)
    run = Run.from_record(record(tmp_path, engine.facts, events))
    assert run.turn == events[0] and run.turn.messages[1] == Message("assistant", first.done.text, ended="eos")
    assert [e.to_dict() for e in run.events() if not hasattr(e, "vocab_rows")] == [e.to_dict() for e in events]
    # its history goes on: a third turn holds both answers
    assert [m.role for m in history_of(run)] == ["user", "assistant", "user", "assistant"]


def test_a_replay_of_a_turns_record_plays_its_turn_event_first(tmp_path):
    engine, first = scripted_run()
    events = turn_events(engine, first)
    played = list(ReplayEngine(Run.from_record(record(tmp_path, engine.facts, events)), speed=0).run())
    assert isinstance(played[0], TurnEvent) and played[0].user == AGAIN
    assert isinstance(played[1], PromptEvent) and played[-1].reason == first.done.reason


@pytest.mark.parametrize("bad, said", [
    ({"turn": 0}, "numbered from 1"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"reused_tokens": -1}, "reused_tokens"),
    ({"messages": "hello"}, "should be a list"),
])
def test_a_bad_turn_line_is_one_record_error(tmp_path, bad, said):
    engine, first = scripted_run()
    events = turn_events(engine, first)
    path = record(tmp_path, engine.facts, events)
    lines = path.read_text(encoding="utf-8").splitlines()
    turn = json.loads(lines[1])
    lines[1] = json.dumps({**turn, **bad})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(RecordError) as caught:
        Run.from_record(path)
    message = str(caught.value)
    assert "\n" not in message and "line 2" in message and said in message, message


def test_a_tree_names_a_turn_as_a_child_with_its_message(tmp_path):
    engine, first = scripted_run()
    first_path = record(tmp_path, engine.facts, list(first.events())[1:])
    turn_path = record(tmp_path, engine.facts, turn_events(engine, first))
    tree = RunTree(prompt="Is OpenAI open?", model=engine.facts.name)
    writer = TreeWriter(tmp_path / "t.tree.jsonl", tree)
    writer.add(TreeNode(1, record=first_path.name))
    node = TreeNode(2, parent=1, turn=2, user=AGAIN, record=turn_path.name)
    assert node.to_dict() == {"event": "tree_run", "number": 2, "parent": 1, "record": turn_path.name, "turn": 2,
                              "user": AGAIN}
    writer.add(node)
    writer.end(TreeEnd(2, "eos", len(first)))
    writer.close()
    back = RunTree.read(tmp_path / "t.tree.jsonl")
    assert back.node(2) == node and back.node(2).is_turn and not back.node(2).is_branch
    assert back.runs[2].turn.user == AGAIN
    # a replay of the tree plays the recorded follow-up when it is asked again, and refuses another
    replay = ReplayEngine.from_file(tmp_path / "t.tree.jsonl", speed=0)
    assert replay.turn_refusal is None
    again = follow_up(replay.source, AGAIN)
    assert [type(e).__name__ for e in replay.turn(again)][:2] == ["TurnEvent", "PromptEvent"]
    other = list(replay.turn(follow_up(replay.source, "Something else?")))
    assert other[-2].event == "error" and "only the follow-ups it recorded" in other[-2].message


@pytest.mark.parametrize("fields, said", [
    ({"turn": 1, "user": "x"}, "turn is an integer >= 2"),
    ({"turn": 2, "user": None}, "names its user message"),
    ({"turn": 2, "user": "x", "at": 3}, "no step, token or phrase"),
    ({"turn": 2, "user": "x", "parent": None}, "names the run it follows"),
])
def test_a_bad_turn_node_is_refused(fields, said):
    with pytest.raises(ValueError, match=said):
        TreeNode(**{"number": 2, "parent": 1, **fields})


def test_a_replay_without_turns_refuses_a_follow_up_in_one_line(tmp_path):
    engine, first = scripted_run()
    replay = ReplayEngine(first, speed=0)
    events = list(replay.turn(TurnRequest((Message("user", "a"), Message("assistant", "b"), Message("user", "c")))))
    assert events[-2].event == "error" and "--follow-up" in events[-2].message
    assert events[-1].reason == "error" and len(events) == 2  # nothing played
