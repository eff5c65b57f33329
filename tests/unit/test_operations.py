"""Each engine operation declared once (core/link/operations.py, the `@operation`s of core/link/protocol.py), and
every layer driven by that declaration: the engine's operations are all declared, the dashboard's client sends each
as its declared message by one path, the model process (core/model/process_main.py) dispatches each to the engine
method it names, an undeclared message is refused in one line, and a new operation is one declaration plus its
engine method."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from unittest.mock import call, create_autospec

import pytest

from fakes import FACTS, ScriptedEngine, make_loader
from tokentui.core.errors import ProtocolError, SettingsError
from tokentui.core.interface import BaseEngine
from tokentui.core.link.client import EngineClient
from tokentui.core.link.local_client import LocalClient
from tokentui.core.link.operations import ASK, CONTROL, RUN, operation
from tokentui.core.link.protocol import (COMMANDS, DECLARED, OPERATIONS, RUN_REPLIES, RUN_STARTS, Crash, Pause, Previewed,
                                         PreviewStep, Quit, Resume, RunEvent, SetOptions, SetSampler, StartBranch,
                                         StartFanout, StartRun, StartScore, StartTurn, Step, Stop, Tokenize, Tokenized,
                                         expect)
from tokentui.core.model.process_main import _Child
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.runs.events import Notice, PromptPiece
from tokentui.core.runs.preview import PreviewRequest, StepPreview
from tokentui.core.runs.requests import FanoutRequest, ScoreRequest
from tokentui.core.runs.turns import TurnRequest
from tokentui.core.settings import RunOptions, SamplerSettings

POINT = BranchPoint((1, 2, 3), (7, 8), 2, 9, parent="a run", parent_token=10)
SCORE = ScoreRequest("What is the capital of France?", "Paris.")
FAN = FanoutRequest((1, 2, 3), (7, 8), 2, n=3, m=4, seed=7)
TURN = TurnRequest.first("Once upon", raw=True)
SAMPLER = SamplerSettings(temperature=0.7, top_k=5)
OPTIONS = RunOptions(max_new_tokens=9, ignore_eos=True)
DONE = Notice("one event of the run")
PIECES = [PromptPiece(5, "␣Lyon", False)]
PREVIEW_REQUEST = PreviewRequest((1, 2, 3), (7, 8), SAMPLER, top_n=4)
PREVIEWED = [StepPreview(at=2, settings=SAMPLER, candidates=(), stages=(), kept_count=1, kept_mass=1.0,
                         entropy_bits=0.0, sampled_entropy_bits=0.0, pick=5, pick_piece="␣Lyon", pick_raw_prob=1.0,
                         pick_prob=1.0, pick_rank=0, greedy=False, source="kv")]

# each declared message, and the engine call it must become (written out here: the oracle of the dispatch)
SAMPLES = [
    (StartRun(1, "hi", "be brief"), call.run("hi", "be brief", run_id=1)),
    (StartBranch(2, POINT), call.branch(POINT, run_id=2)),
    (StartScore(3, SCORE), call.score(SCORE, run_id=3)),
    (StartFanout(4, FAN), call.fanout(FAN, run_id=4)),
    (StartTurn(7, TURN), call.turn(TURN, run_id=7)),
    (Tokenize(5, " Lyon"), call.phrase_pieces(" Lyon")),
    (PreviewStep(8, PREVIEW_REQUEST), call.preview_step(PREVIEW_REQUEST)),
    (Stop(6), call.stop(6)),
    (Pause(), call.pause()),
    (Resume(), call.resume()),
    (Step(), call.step_once()),
    (SetSampler(SAMPLER), call.set_sampler(SAMPLER)),
    (SetOptions(OPTIONS), call.set_options(OPTIONS)),
]

# BaseEngine's public methods that are not operations a dashboard sends, and why
NOT_OPERATIONS = {
    "close": "the end of the engine: the client's close(), the model process's Quit",
    "update_sampler": "set_sampler of the current settings with changes, built by the caller",
    # the engine loop's own, at its step boundaries (core/controls.py, "for the engine's loop")
    "begin_run": "", "wait_at_gate": "", "timed_gate": "", "sleep_at_gate": "", "stopping": "",
    "take_settings": "", "settings_pending": "",
}


def recording_engine():
    """A stand-in with BaseEngine's exact signatures (a call that does not fit one raises): it records each call."""
    engine = create_autospec(BaseEngine, instance=True)
    for method in ("run", "branch", "score", "fanout", "turn"):
        getattr(engine, method).return_value = iter([DONE])
    engine.phrase_pieces.return_value = PIECES
    engine.preview_step.return_value = PREVIEWED
    return engine


class Sent:
    """The model process's end of the socket: what it sends back."""

    def __init__(self) -> None:
        self.messages: list = []

    def send(self, message) -> None:
        self.messages.append(message)


def test_every_engine_operation_is_declared_once():
    public = {name for name, member in inspect.getmembers(BaseEngine)
              if not name.startswith("_") and inspect.isfunction(member)}
    declared = [op.method for op in OPERATIONS]
    assert len(declared) == len(set(declared))
    assert set(declared) == public - set(NOT_OPERATIONS)
    refusals = {name.removesuffix("_refusal") for name in dir(BaseEngine) if name.endswith("_refusal")}
    assert {op.refusal for op in OPERATIONS if op.refusal} == refusals


def test_the_protocol_s_message_sets_are_the_declarations():
    assert set(COMMANDS) == set(DECLARED) | {Quit}
    assert set(RUN_STARTS) == {m for m, op in DECLARED.items() if op.kind is RUN} == {StartRun, StartBranch,
                                                                                       StartScore, StartFanout,
                                                                                       StartTurn}
    assert set(RUN_REPLIES) == {RunEvent, Crash, Tokenized, Previewed}
    assert {type(message) for message, _ in SAMPLES} == set(DECLARED)  # every declaration has its oracle here


@pytest.mark.parametrize("message, expected", SAMPLES, ids=[type(m).__name__ for m, _ in SAMPLES])
def test_the_model_process_dispatches_each_declared_message_to_its_engine_method(message, expected):
    child, engine = _Child(conn=Sent()), recording_engine()
    child.engine = engine
    child.apply(message)
    kind = DECLARED[type(message)].kind
    if kind is RUN:  # queued for the main thread, which runs it to its end
        assert engine.mock_calls == [] and child.runs.get_nowait() is message
        child.run(engine, message)
        assert child.conn.messages == [RunEvent(message.run_id, DONE)]
    elif kind is ASK:  # answered at once, with what the engine returned
        answer = {Tokenize: Tokenized(message.asked, tuple(PIECES)), PreviewStep: Previewed(message.asked,
                                                                                            tuple(PREVIEWED))}
        assert child.conn.messages == [answer[type(message)]]
    else:
        assert kind is CONTROL and child.conn.messages == []
    assert engine.mock_calls == [expected]


def test_an_ask_the_engine_refuses_is_answered_with_its_line():
    child, engine = _Child(conn=Sent()), recording_engine()
    child.engine = engine
    engine.phrase_pieces.side_effect = SettingsError("this engine cannot force a phrase")
    child.apply(Tokenize(3, "x"))
    assert child.conn.messages == [Tokenized(3, error="this engine cannot force a phrase")]
    with pytest.raises(SettingsError, match="cannot force a phrase"):
        child.conn.messages[0].result()


@dataclass(frozen=True)
class Teleport:
    run_id: int


def test_an_undeclared_message_is_refused_in_one_line_and_nothing_runs():
    child, engine = _Child(conn=Sent()), recording_engine()
    child.engine = engine
    with pytest.raises(ProtocolError) as refused:
        child.apply(Teleport(1))
    assert str(refused.value) == ("the model process protocol: Teleport is not a declared engine operation "
                                  "(core/link/protocol.py)")
    assert engine.mock_calls == [] and child.runs.empty() and child.conn.messages == []
    with pytest.raises(ProtocolError, match="expected StartRun, .*, Quit, got Teleport"):
        expect(Teleport(1), COMMANDS, "the model process")


class Carrier(EngineClient):
    """A client whose transport only keeps what it is asked to carry."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list = []

    async def _load(self, progress):
        return FACTS, SamplerSettings(), RunOptions()

    def _send(self, message) -> None:
        self.sent.append(message)

    async def _ask(self, message):
        self.sent.append(message)
        return PIECES


async def test_the_client_sends_each_operation_as_its_declared_message():
    client = Carrier()
    await client.load()
    client.start("hi", "be brief")
    client.branch(POINT)
    client.score(SCORE)
    client.fanout(FAN)
    client.turn(TURN)
    assert await client.tokenize(" Lyon") == PIECES
    await client.preview(PREVIEW_REQUEST)
    client.pause()
    client.step_once()
    client.resume()
    client.set_sampler(SAMPLER)
    client.set_options(OPTIONS)
    client.stop()
    assert client.sent == [StartRun(1, "hi", "be brief"), Stop(1), StartBranch(2, POINT), Stop(2),
                           StartScore(3, SCORE), Stop(3), StartFanout(4, FAN), Stop(4), StartTurn(5, TURN),
                           Tokenize(1, " Lyon"), PreviewStep(2, PREVIEW_REQUEST), Pause(), Step(), Resume(),
                           SetSampler(SAMPLER), SetOptions(OPTIONS), Stop(5)]
    assert {type(m) for m in client.sent} == set(DECLARED)
    with pytest.raises(TypeError, match="not a declared run operation"):
        client.begin(Teleport)
    with pytest.raises(TypeError, match="not a declared run operation"):
        client.begin(Tokenize, "x")  # declared, but not a run
    assert client.run_id == 5
    client.close()


class NoFanout(Carrier):
    def _refusal(self, what: str) -> str | None:  # the transport's word for the engine's `<what>_refusal`
        return "fan-out needs the local engine" if what == "fanout" else None


async def test_a_refused_operation_sends_nothing_and_changes_nothing():
    client = NoFanout()
    with pytest.raises(SettingsError, match="not loaded yet"):
        client.start("hi")
    await client.load()
    client.start("hi")
    with pytest.raises(SettingsError, match="fan-out needs the local engine"):
        client.fanout(FAN)
    assert client.refusal("fanout") == "fan-out needs the local engine" and client.refusal("branch") is None
    assert client.sent == [StartRun(1, "hi", None)] and client.run_id == 1
    client.close()


# ---- a new operation: one declaration, plus the engine method it names ----------------------------------------
@dataclass(frozen=True)
class Echoed:
    asked: int
    words: tuple = ()
    error: str | None = None

    def result(self) -> list:
        if self.error is not None:
            raise SettingsError(self.error)
        return list(self.words)


class NotADataclass:
    pass


class EchoingEngine(ScriptedEngine):
    def echo(self, text: str) -> list[str]:
        return text.split()


@pytest.fixture
def echo():
    """An ASK operation declared for one test (and undeclared after it)."""

    @dataclass(frozen=True)
    class Echo:
        asked: int
        text: str

    operation("echo", ASK, answer=Echoed)(Echo)
    yield Echo
    del DECLARED[Echo]


async def test_a_new_operation_is_one_declaration_and_its_engine_method(echo):
    client = LocalClient(make_loader(EchoingEngine(), stages=0))
    await client.load()
    try:
        assert await client.ask(echo, "a new operation") == ["a", "new", "operation"]
    finally:
        client.close()
    child = _Child(conn=Sent())
    child.engine = EchoingEngine()
    child.apply(echo(7, "through the model process"))
    assert child.conn.messages == [Echoed(7, ("through", "the", "model", "process"))]


def test_a_declaration_is_checked_as_it_is_made():
    @dataclass(frozen=True)
    class NoSerial:
        prompt: str

    @dataclass(frozen=True)
    class Again:
        run_id: int

    @dataclass(frozen=True)
    class Question:
        asked: int

    with pytest.raises(TypeError, match="first field of an operation of kind RUN is `run_id`"):
        operation("jump", RUN)(NoSerial)
    with pytest.raises(TypeError, match="run is declared once"):
        operation("run", RUN)(Again)
    with pytest.raises(TypeError, match="a dataclass"):
        operation("jump", CONTROL)(NotADataclass)
    with pytest.raises(TypeError, match="first field of an operation of kind ASK is `asked`"):
        operation("jump", ASK, answer=Echoed)(NoSerial)
    with pytest.raises(TypeError, match="declares its answer"):
        operation("jump", ASK)(Question)
    with pytest.raises(TypeError, match="an answer is a dataclass"):
        operation("jump", ASK, answer=NotADataclass)(Question)
    assert not {NoSerial, Again, Question} & set(DECLARED)
