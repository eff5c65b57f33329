"""Branches through the dashboard's engine clients (core/link/client.py `EngineClient.branch`): a branch is a run like any
other (its own id, record and replies; the run it supersedes is stopped and never heard from again), an engine that
cannot branch (a replay) refuses in one line before anything changes, and the model process branches on its own
held KV cache (no re-prefill) with the same tokens as the in-process engine."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from client_replies import Replies
from fakes import ScriptedEngine, make_loader, slow_engine
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.link.client import RunEnded, RunOpened, RunUpdate
from tokentui.core.link.local_client import LocalClient
from tokentui.core.model.engine import Engine
from tokentui.core.errors import SettingsError
from tokentui.core.runs.events import BranchEvent, DoneEvent, Notice, PrefillEvent, PromptEvent, StepEvent
from tokentui.core.link.process_client import ProcessClient
from tokentui.core.link.protocol import EngineSpec
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.run import Run
from tokentui.core.settings import RunOptions, SamplerSettings

pytestmark = pytest.mark.asyncio(loop_scope="module")

GREEDY = SamplerSettings(temperature=0.0)
TWELVE = RunOptions(max_new_tokens=12, ignore_eos=True)
AT = 4  # step 5, 0-based


def of(kind, events) -> list:
    return [e for e in events if isinstance(e, kind)]


def run_id_of(reply) -> int:
    return reply.run_id


def run_of(facts, events) -> Run:
    run = Run(facts)
    for event in events:
        run.apply(event)
    return run


async def local_client(engine, recorder=None) -> LocalClient:
    """A loaded client for `engine`, asking for the engine's own settings (the client's are handed to it)."""
    client = LocalClient(make_loader(engine, stages=0), engine.sampler, engine.options, recorder)
    await client.load()
    return client


# ------------------------------------------------------------------------------------------- LocalClient
async def test_a_branch_after_a_run_is_a_new_run_with_its_own_id_and_record(tmp_path):
    engine = ScriptedEngine(sampler=GREEDY, options=TWELVE)
    client = await local_client(engine, RunRecorder(tmp_path))
    try:
        assert client.can_branch
        replies = Replies(client)
        parent_id = client.start("Is OpenAI open?")
        parent = run_of(client.facts, await replies.rest())
        assert parent.done.reason == "length" and len(parent) == 12
        token = parent[AT].candidates[1].id
        point = BranchPoint.of_run(parent, AT, token, parent="the parent")
        branch_id = client.branch(point, prompt=parent.prompt)
        assert branch_id == parent_id + 1 == client.run_id
        opened = replies.queue.get_nowait()
        assert isinstance(opened, RunOpened) and opened.run_id == branch_id and opened.record_path is not None
        got = []
        while not got or not isinstance(got[-1].event, DoneEvent):
            got.append(await asyncio.wait_for(replies.queue.get(), 10))
        assert all(isinstance(r, RunUpdate) and r.run_id == branch_id for r in got)
        events = [r.event for r in got]
        assert events[0] == parent.prompt  # given first, for the record; not run by the engine
        assert engine.branches == [point] and len(engine.runs) == 1
        branch_event = events[1]
        assert isinstance(branch_event, BranchEvent)
        n_prompt = len(parent.prompt.ids)
        assert branch_event.kv_reused_tokens == n_prompt + AT - 1  # the fake keeps what the engine's cache would
        assert branch_event.parent_id == parent[AT].id and branch_event.id == token
        assert of(PrefillEvent, events)[0].reused_tokens == n_prompt + AT - 1
        steps = of(StepEvent, events)
        assert [s.index for s in steps] == list(range(AT, AT + 12))
        assert steps[0].forced and steps[0].id == token and not any(s.forced for s in steps[1:])
        assert steps[0].candidates == parent[AT].candidates  # the step's own candidates
        assert of(Notice, events)  # greedy gives the 2nd candidate probability 0: said, as the engine says it
        done = events[-1]
        assert done.text == branch_event.prefix_text + "".join(s.text for s in steps) and done.tokens == 12
        assert branch_event.prefix_text == "".join(s.text for s in parent[:AT])
        record = Run.from_record(opened.record_path)  # the branch's record reads back as the branch
        assert record.branch == branch_event and record.prompt == parent.prompt and record.offset == AT
        assert [s.id for s in record] == [s.id for s in steps] and record.done == done
        assert record.text == done.text and record.record_notice is None
        # a branch of the branch: BranchPoint.of_run goes on from the branch's own prefix, and reuses its cache
        again = BranchPoint.of_run(record, AT + 2, record[2].candidates[0].id)
        client.branch(again)
        events = await replies.rest()
        assert events[0].kv_reused_tokens == n_prompt + AT + 1
        assert of(StepEvent, events)[0].index == AT + 2
    finally:
        client.close()


async def test_a_branch_supersedes_the_current_run_whose_events_never_arrive_after(tmp_path):
    engine = slow_engine(delay=0.02, steps=400)
    client = await local_client(engine, RunRecorder(tmp_path))
    try:
        replies = Replies(client)
        first = client.start("Is OpenAI open?")
        parent = Run(client.facts)
        while len(parent) < AT + 2:
            parent.apply(await replies.next_event())
        point = BranchPoint.of_run(parent, AT, parent[AT].candidates[2].id)
        second = client.branch(point)
        assert second == first + 1
        arrived = []
        while not arrived or not (isinstance(arrived[-1], RunUpdate) and isinstance(arrived[-1].event, BranchEvent)):
            arrived.append(await asyncio.wait_for(replies.queue.get(), 10))
        assert isinstance(arrived[0], RunOpened) and arrived[0].run_id == second
        # nothing of the first run after the branch began, but how it ended (RunEnded: the branch's parent keeps it)
        ended = [r for r in arrived if run_id_of(r) != second]
        assert ended and all(isinstance(r, RunEnded) and r.run_id == first and r.event.reason == "stopped"
                             for r in ended)
        client.halt()  # stop the branch (400 slow steps) and let it end
        rest = await replies.rest()
        assert isinstance(rest[-1], DoneEvent) and rest[-1].reason == "stopped"
        assert engine.max_active == 1  # the run ended before the branch began
        records = sorted(tmp_path.glob("*.jsonl"))
        assert len(records) == 2
        runs = [Run.from_record(path) for path in records]
        (old,) = [r for r in runs if r.branch is None]
        assert old.done.reason == "stopped"  # the superseded run is still recorded to its end
    finally:
        client.close()


async def test_a_replay_cannot_branch_and_nothing_changes(tmp_path):
    engine = ScriptedEngine(options=RunOptions(max_new_tokens=30, ignore_eos=True))
    recorded = run_of(engine.facts, engine.run("Is OpenAI open?"))
    replay = ReplayEngine(recorded, speed=1.0)
    client = LocalClient(make_loader(replay, stages=0), replay.sampler, replay.options)
    assert not client.can_branch  # not known before loading
    with pytest.raises(SettingsError, match="not loaded yet"):
        client.branch(BranchPoint.of_run(recorded, 2, 13))
    await client.load()
    try:
        assert not client.can_branch
        replies = Replies(client)
        run_id = client.start("Is OpenAI open?")
        await replies.next_step()
        with pytest.raises(SettingsError) as refused:
            client.branch(BranchPoint.of_run(recorded, 2, 13))
        message = str(refused.value)
        assert message.startswith("a replay cannot branch: ") and "\n" not in message
        assert client.run_id == run_id
        rest = await replies.rest()
        assert isinstance(rest[-1], DoneEvent) and rest[-1].reason == "length"  # the replay went on to its end
        assert len(of(StepEvent, rest)) == 29
    finally:
        client.close()


async def test_branch_takes_a_branch_point_only():
    client = await local_client(ScriptedEngine())
    try:
        with pytest.raises(TypeError):
            client.branch({"at": 1})
        assert client.run_id == 0
    finally:
        client.close()


# ------------------------------------------------------------------------------------------- ProcessClient
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def child(embedded):
    client = ProcessClient(EngineSpec(sampler=GREEDY, options=TWELVE))
    await client.load()
    yield client
    client.close()


async def test_the_model_process_branches_on_its_held_cache_like_the_engine(embedded, child):
    assert child.can_branch
    replies = Replies(child)
    parent = run_of(child.facts, await replies.run("Is OpenAI open?"))
    assert len(parent) == 12 and parent.done.reason == "length"
    token = parent[AT].candidates[1].id
    point = BranchPoint.of_run(parent, AT, token)
    child.branch(point)
    events = await replies.rest()
    branch = events[0]
    assert isinstance(branch, BranchEvent)
    assert branch.kv_reused_tokens == len(point.prompt_ids) + AT - 1  # the child's own cache: no re-prefill
    assert of(PrefillEvent, events)[0].tokens == 1
    steps = of(StepEvent, events)
    assert steps[0].forced and steps[0].id == token and steps[0].index == AT
    # the oracle: the in-process engine, same run then same branch
    local = Engine(embedded, GREEDY, TWELVE)
    here_parent = [s.id for s in of(StepEvent, local.run("Is OpenAI open?"))]
    assert here_parent == [s.id for s in parent]
    here = list(local.branch(point))
    assert [s.id for s in of(StepEvent, here)] == [s.id for s in steps]
    assert here[-1].text == events[-1].text and events[-1].tokens == 12
    assert not of(PromptEvent, events)  # no prompt given: the branch's events alone


async def test_a_branch_record_replays_with_its_prefix(tmp_path, capsys):
    """A branch's record stands alone: replayed as text, its answer starts with the parent's prefix and equals the
    branch's own `done.text` (prefix + branch tokens)."""
    from tokentui.commands.replay import replay_headless

    engine = ScriptedEngine(sampler=SamplerSettings(temperature=0.0))
    client = await local_client(engine, RunRecorder(tmp_path))
    try:
        replies = Replies(client)
        parent = run_of(client.facts, await replies.run("Is OpenAI open?"))
        step = parent[AT]
        client.branch(BranchPoint.of_run(parent, AT, step.candidates[1].id))
        events = await replies.rest()
    finally:
        client.close()
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.reason != "stopped"
    (path,) = [p for p in tmp_path.glob("*.jsonl") if Run.from_record(p).branch is not None]
    capsys.readouterr()
    assert replay_headless(ReplayEngine.from_record(path, speed=0), as_json=False) == 0
    out = capsys.readouterr().out
    prefix = Run.from_record(path).branch.prefix_text
    assert prefix and out.startswith(prefix) and out == done.text + done.flushed + "\n"
