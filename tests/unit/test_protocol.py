"""The model process's wire protocol (core/link/protocol.py): typed messages checked where they are built, and a
message that is not what the receiving side expects is refused, not misread. The parent side is driven here by a
stand-in child on a socket pair (no model, no second process)."""

from __future__ import annotations

import socket
import threading
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from client_replies import Replies, RunFailure
from fakes import FACTS, ScriptedEngine
from tokentui.core.model.branch import BranchPoint
from tokentui.core.errors import GenerationError, SettingsError
from tokentui.core.runs.events import BranchEvent, DoneEvent, StepEvent
from tokentui.core.model.process_main import _Child
from tokentui.core.link.process_client import ProcessClient, StartedProcess
from tokentui.core.link.protocol import (COMMANDS, LOADING_REPLIES, RUN_REPLIES, Crash, Load, LoadFailed, ProtocolError,
                                    Ready, RunEvent, SetSampler, StartBranch, StartRun, Stop, expect)
from tokentui.core.settings import RunOptions, SamplerSettings

POINT = BranchPoint((1, 2, 3), (7, 8), 2, 9, parent="a run", parent_token=10)


@pytest.mark.parametrize("build", [
    lambda: StartRun(-1, "hi"),
    lambda: StartRun(True, "hi"),
    lambda: StartRun(1, b"hi"),
    lambda: StartRun(1, "hi", system=3),
    lambda: Stop("1"),
    lambda: RunEvent(1, ("step", 1)),
    lambda: Crash(1, None),
    lambda: Ready(FACTS, SamplerSettings(), None),
    lambda: LoadFailed("ModelLoadError", 42),
    lambda: Load({"model": "x"}),
    lambda: StartBranch(1, None),
    lambda: StartBranch(1, "at 2: token 9"),
    lambda: StartBranch(1, {"prompt_ids": (1, 2, 3), "tokens": (7, 8), "at": 2, "token": 9}),
    lambda: StartBranch(1, (POINT.prompt_ids, POINT.tokens, POINT.at, POINT.token)),
    lambda: StartBranch(-1, POINT),
    lambda: StartBranch(None, POINT),
])
def test_a_malformed_message_cannot_be_built(build):
    with pytest.raises(ProtocolError):
        build()


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_p=0.0),
                                 dict(top_p=1.5), dict(top_k=-1), dict(top_k=2.5), dict(seed=-3), dict(greedy="yes"),
                                 dict(temperature=True)])
def test_invalid_settings_cannot_exist_so_they_are_never_sent(bad):
    """Settings are checked once, as they are built (not by each layer): SetSampler can only carry valid ones."""
    with pytest.raises(SettingsError):
        SetSampler(SamplerSettings(**bad))
    with pytest.raises(SettingsError):
        SamplerSettings().with_changes(**bad)


def test_settings_are_normalised_where_built():
    s = SamplerSettings(temperature=1, top_p=1)
    assert isinstance(s.temperature, float) and isinstance(s.top_p, float)
    with pytest.raises(SettingsError):
        RunOptions(max_new_tokens=0)
    with pytest.raises(SettingsError):
        RunOptions(ignore_eos="no")


def test_the_old_positional_tuples_are_refused():
    for message in (("run", 1, "hi", None), ("stop", 1), ("pause",), None, "quit"):
        with pytest.raises(ProtocolError, match="expected"):
            expect(message, COMMANDS, "the model process")
    assert expect(Stop(3), COMMANDS, "the model process") == Stop(3)


def test_a_branch_is_a_command_for_the_child_only():
    start = StartBranch(4, POINT)
    assert expect(start, COMMANDS, "the model process") is start and start.point == POINT
    for kinds, where in ((RUN_REPLIES, "during a run"), (LOADING_REPLIES, "while loading")):
        with pytest.raises(ProtocolError, match="got StartBranch"):
            expect(start, kinds, where)


def test_the_child_queues_a_branch_like_a_run_in_the_order_asked():
    child = _Child(conn=None)
    child.apply(StartRun(1, "hi"))
    child.apply(StartBranch(2, POINT))
    assert child.runs.get_nowait() == StartRun(1, "hi") and child.runs.get_nowait() == StartBranch(2, POINT)


class FakeProc:
    """What ProcessClient asks of its child's Popen."""

    pid = 0

    def __init__(self) -> None:
        self.ended = threading.Event()

    def poll(self):
        return 0 if self.ended.is_set() else None

    def wait(self, timeout=None):
        self.ended.wait(timeout)
        return 0

    def kill(self):
        self.ended.set()


def stand_in_child(conn: Connection, proc: FakeProc, reply) -> None:
    """Load -> Ready; each StartRun / StartBranch -> whatever `reply(run)` gives; Quit / EOF -> gone."""
    try:
        assert isinstance(conn.recv(), Load)
        conn.send(Ready(FACTS, SamplerSettings(), RunOptions()))
        while True:
            message = conn.recv()
            if isinstance(message, (StartRun, StartBranch)):
                for out in reply(message):
                    conn.send(out)
            elif type(message).__name__ == "Quit":
                break
    except (EOFError, OSError):
        pass
    finally:
        proc.ended.set()
        conn.close()


async def process_client(reply) -> ProcessClient:
    from tokentui.core.link.protocol import EngineSpec

    parent_end, child_end = socket.socketpair()
    parent, child = Connection(parent_end.detach()), Connection(child_end.detach())
    proc = FakeProc()
    parent.send(Load(EngineSpec()))
    threading.Thread(target=stand_in_child, args=(child, proc, reply), daemon=True).start()
    client = ProcessClient(EngineSpec(), started=StartedProcess(proc, parent, Path("/dev/null")))
    await client.load()
    return client


def scripted_events(prompt: str):
    return list(ScriptedEngine().run(prompt))


async def test_a_stale_run_s_events_are_dropped_and_a_new_run_gets_only_its_own():
    events = scripted_events("Is OpenAI open?")

    def reply(run: StartRun):
        # the tail of an older run arrives first: it must not show up in this one
        yield RunEvent(run.run_id - 1, events[-1])
        for event in events:
            yield RunEvent(run.run_id, event)

    client = await process_client(reply)
    try:
        replies = Replies(client)
        assert await replies.run("Is OpenAI open?") == events
        again = await replies.run("Is OpenAI open?")
        assert again == events and sum(isinstance(e, DoneEvent) for e in again) == 1
        assert replies.queue.empty()
    finally:
        client.close()


async def test_a_message_outside_the_protocol_ends_the_run_with_an_error_not_a_misreading():
    events = scripted_events("Is OpenAI open?")

    def reply(run: StartRun):
        yield RunEvent(run.run_id, events[0])
        yield ("event", run.run_id, events[1])  # the old positional form: refused

    client = await process_client(reply)
    try:
        replies = Replies(client)
        client.start("Is OpenAI open?")
        got = [await replies.next_event()]
        with pytest.raises(RunFailure, match="expected RunEvent, Crash, Tokenized, Previewed, got tuple"):
            got.append(await replies.next_event())
        assert got == events[:1] and not any(isinstance(e, StepEvent) for e in got[1:])
    finally:
        client.close()


async def test_a_crash_message_ends_its_run_with_the_child_s_words():
    def reply(run: StartRun):
        yield Crash(run.run_id, "the model process failed: RuntimeError: boom")

    client = await process_client(reply)
    try:
        with pytest.raises(RunFailure, match="RuntimeError: boom"):
            await Replies(client).run("hi")
    finally:
        client.close()


async def test_a_child_that_goes_away_mid_run_ends_the_run_at_once():
    """The socket's end closing wakes the event loop: the run in progress says so, and so does a later one."""
    events = scripted_events("Is OpenAI open?")

    def reply(run: StartRun):
        yield RunEvent(run.run_id, events[0])
        raise EOFError  # the stand-in child ends here, mid-run

    client = await process_client(reply)
    try:
        replies = Replies(client)
        with pytest.raises(RunFailure, match="ended unexpectedly"):
            await replies.run("hi")
        with pytest.raises(RunFailure, match="ended unexpectedly"):  # and so does any later run, at once
            await replies.run("hi")
    finally:
        client.close()


async def test_a_branch_travels_to_the_child_whole_and_its_events_come_back_under_its_id():
    got: list = []
    events = scripted_events("Is OpenAI open?")

    def reply(run):
        got.append(run)
        if isinstance(run, StartBranch):
            yield RunEvent(run.run_id - 1, events[-1])  # the superseded run's tail: not shown
            yield RunEvent(run.run_id, BranchEvent(run.point.at, run.point.token, "x", 10, "y", 4, [1, 2, 3], [7, 8],
                                                   "ab"))
            yield RunEvent(run.run_id, events[-1])
        else:
            yield from (RunEvent(run.run_id, event) for event in events)

    client = await process_client(reply)
    try:
        assert client.can_branch
        replies = Replies(client)
        await replies.run("Is OpenAI open?")
        run_id = client.branch(POINT)
        branch, done = await replies.rest()
        assert isinstance(branch, BranchEvent) and branch.at == 2 and done == events[-1]
        assert got[-1] == StartBranch(run_id, POINT) and got[-1].point is not POINT  # pickled across, equal
        assert replies.queue.empty()
    finally:
        client.close()


async def test_a_branch_sent_back_to_the_parent_is_refused():
    def reply(run):
        yield StartBranch(run.run_id, POINT)  # a command, from the child: not a reply

    client = await process_client(reply)
    try:
        with pytest.raises(RunFailure, match="expected RunEvent, Crash, Tokenized, Previewed, got StartBranch"):
            await Replies(client).run("hi")
    finally:
        client.close()
