"""The dashboard's one engine client: what the app talks to, on its asyncio event loop.

The client is the one owner, in the dashboard's process, of the run ids and of the sampler settings and run options
asked for (before the model is loaded too: they are handed to the engine when it is ready). Each run (or branch)
gets the next run id here; the id travels to the engine, which uses it as its own (core/controls.py), so there is
one count of runs. Commands are method calls that take effect at the engine's next step boundary (`start` a run,
`branch` an earlier one at a step, `score` a text, `fanout` from a step, a `turn` of a conversation, stop, pause,
step, settings; `tokenize` a
phrase is answered at once, also while a run is paused). Each is the message of core/link/protocol.py that declares
that engine operation, sent by one path (`begin` for a run, `ask` for a question, `_send` for a control) that both
transports implement once. Replies come back as typed dataclasses through one `listener`, called on the event loop:

    RunOpened(run_id, record_path)  a run (or a branch) started (its record, if recorded)
    RunUpdate(run_id, event)        one event of the current run
    RunNote(run_id, message)        something about the run that is not an event of it (its record failed)
    RunEnded(run_id, event)         how a run that a newer one superseded ended (its `done`)

Every run's events end with `done`, and a failed run's with `error` then `done` — also when the failure is not the
engine's own (its process died, it raised, it sent what the protocol does not allow): the run's record writes those
two events (core/runs/recording.py) and they reach the listener like the engine's. Events of a run that a newer one
superseded are still recorded but not passed on, except its end (`RunEnded`), so the app never filters stale events
itself and can still say how an earlier run (e.g. the parent of a branch) ended.

Two transports: `ProcessClient` (core/link/process_client.py), the model in a child process read with
`loop.add_reader` — no thread in this process; and `LocalClient` (core/link/local_client.py), an in-process engine
(a replay, the tests' scripted engine) stepped on one executor thread.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

from ..errors import ErrorKind, SettingsError
from ..runs.branch_point import BranchPoint
from ..runs.events import DoneEvent, Event, LoadProgress, PromptEvent, PromptPiece
from ..runs.facts import ModelFacts
from ..runs.record_writer import RunRecorder
from ..runs.preview import PreviewRequest, StepPreview
from ..runs.recording import RecordedRun
from ..runs.requests import FanoutRequest, ScoreRequest
from ..runs.turns import TurnRequest
from ..settings import RunOptions, SamplerSettings
from .operations import ASK, RUN, Operation
from .protocol import (DECLARED, Pause, PreviewStep, Resume, SetOptions, SetSampler, StartBranch, StartFanout,
                       StartRun, StartScore, StartTurn, Step, Stop, Tokenize)

Progress = Callable[[LoadProgress], None]


@dataclass(frozen=True, slots=True)
class RunOpened:
    run_id: int
    record_path: Path | None


@dataclass(frozen=True, slots=True)
class RunUpdate:
    run_id: int
    event: Event


@dataclass(frozen=True, slots=True)
class RunNote:
    run_id: int
    message: str
    severity: str = "warning"


@dataclass(frozen=True, slots=True)
class RunEnded:
    run_id: int
    event: DoneEvent


Reply = Union[RunOpened, RunUpdate, RunNote, RunEnded]
Listener = Callable[[Reply], None]


class EngineClient:
    """What both transports share: the run ids, the settings, the records, stale-run filtering. Subclasses carry the
    declared messages (`_send`, `_ask`) and report what the engine says through `_event` / `_failed`."""

    def __init__(self, sampler: SamplerSettings | None = None, options: RunOptions | None = None,
                 recorder: RunRecorder | None = None) -> None:
        self.facts: ModelFacts | None = None  # once loaded
        self._sampler = sampler or SamplerSettings()
        self._options = options or RunOptions()
        self._recorder = recorder
        self.listener: Listener = lambda reply: None
        self._run_id = 0
        self._records: dict[int, RecordedRun] = {}  # runs not yet ended, by id (a superseded one may still run)
        self._ended: dict[int, asyncio.Future] = {}
        self._paused = False
        self._questions = 0  # the ASK messages sent so far: each one's number

    # ---- state this client owns ---------------------------------------------------------------------------
    @property
    def run_id(self) -> int:
        """The current run's id (0 before the first); only its events reach the listener."""
        return self._run_id

    @property
    def loaded(self) -> bool:
        return self.facts is not None

    @property
    def sampler(self) -> SamplerSettings:
        return self._sampler

    def set_sampler(self, settings: SamplerSettings) -> SamplerSettings:
        """The settings the engine uses from its next step: one SamplerSettings, valid since it was built. An engine
        that cannot change them (a replay) raises SettingsError and nothing changes."""
        if not isinstance(settings, SamplerSettings):
            raise TypeError(f"set_sampler needs SamplerSettings, got {type(settings).__name__}")
        if settings != self._sampler:
            if self.loaded:
                self._send(SetSampler(settings))
            self._sampler = settings
        return settings

    @property
    def options(self) -> RunOptions:
        return self._options

    def set_options(self, options: RunOptions) -> None:
        if not isinstance(options, RunOptions):
            raise TypeError(f"options must be RunOptions, got {type(options).__name__}")
        self._options = options
        if self.loaded:
            self._send(SetOptions(options))

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def branch_refusal(self) -> str | None:
        """Why `branch()` cannot run on this engine (None: it can; before loading: not loaded yet)."""
        return self.refusal("branch")

    @property
    def can_branch(self) -> bool:
        return self.branch_refusal is None

    def refusal(self, what: str | None) -> str | None:
        """Why this engine cannot do `what` ("branch", "phrase", "score", "fanout": an operation's declared refusal,
        core/interface.py's `<what>_refusal`), one line; None when it can (before loading: not loaded yet; `what`
        None: an operation every loaded engine can do)."""
        if not self.loaded:
            return "the model is not loaded yet"
        return None if what is None else self._refusal(what)

    # ---- loading ------------------------------------------------------------------------------------------
    async def load(self, progress: Progress = lambda p: None) -> ModelFacts:
        """Load the model (raises TokentuiError with one line when it cannot); then the settings asked for so far
        are the engine's."""
        self.facts = None
        facts, sampler, options = await self._load(progress)
        self.facts = facts
        if options != self._options:
            self._send(SetOptions(self._options))
        if sampler != self._sampler:
            try:
                self._send(SetSampler(self._sampler))
            except SettingsError as err:  # e.g. a replay plays its recorded settings: those are the ones in force
                self._sampler = sampler
                self.listener(RunNote(self._run_id, str(err)))
        return facts

    # ---- runs: the RUN operations (core/link/protocol.py) -------------------------------------------------------
    def start(self, prompt: str, system: str | None = None) -> int:
        """Stop the current run (it ends at its next step, recorded) and start `prompt`; returns the new run's id."""
        return self.begin(StartRun, prompt, system)

    def branch(self, point: BranchPoint, prompt: PromptEvent | None = None) -> int:
        """Stop the current run and start a branch of an earlier one at `point` (its events: BranchEvent,
        PrefillEvent, the forced StepEvent at `point.at`, steps, done), as a new run with its own id and record,
        exactly like `start`; returns that id. `prompt`: the parent's PromptEvent goes first into the branch's
        record and to the listener, so the record says what was asked and replays on its own; the engine is not
        sent it.

        An engine that cannot branch (see `branch_refusal`) raises SettingsError (one line) before anything
        changes: the current run goes on and the run id stays."""
        if not isinstance(point, BranchPoint):
            raise TypeError(f"branch() needs a BranchPoint, got {type(point).__name__}")
        if prompt is not None and not isinstance(prompt, PromptEvent):
            raise TypeError(f"prompt must be a PromptEvent, got {type(prompt).__name__}")
        return self.begin(StartBranch, point, first=prompt)

    def score(self, request: ScoreRequest) -> int:
        """Stop the current run and score `request`'s text as a new run (core/model/scoring.py); returns its id.
        SettingsError (one line) before anything changes when the engine cannot score."""
        if not isinstance(request, ScoreRequest):
            raise TypeError(f"score() needs a ScoreRequest, got {type(request).__name__}")
        return self.begin(StartScore, request)

    def fanout(self, request: FanoutRequest) -> int:
        """Stop the current run and draw `request.n` samples from its step as a new run (core/model/fanout.py);
        returns its id. SettingsError (one line) before anything changes when the engine cannot fan out."""
        if not isinstance(request, FanoutRequest):
            raise TypeError(f"fanout() needs a FanoutRequest, got {type(request).__name__}")
        return self.begin(StartFanout, request)

    def turn(self, request: TurnRequest) -> int:
        """Stop the current run and start a turn of a conversation (a follow-up, or a raw run: core/runs/turns.py) as
        a new run; returns its id. SettingsError (one line) before anything changes when the engine cannot."""
        if not isinstance(request, TurnRequest):
            raise TypeError(f"turn() needs a TurnRequest, got {type(request).__name__}")
        return self.begin(StartTurn, request)

    def begin(self, message: type, *arguments, first: Event | None = None) -> int:
        """Stop the current run and start the RUN operation whose request is `message` (a class of
        core/link/protocol.py) with `arguments` (its fields after the run_id) as a new run; returns its id. `first`:
        an event that goes first into its record and to the listener (not sent to the engine). Before anything
        changes: SettingsError (one line) when the engine cannot do it (its declared refusal, or not loaded yet),
        ProtocolError when `arguments` do not make that message."""
        op = self._declared(message, RUN)
        self._check(op)
        request = message(self._run_id + 1, *arguments)  # checked as built, with the id _open gives it
        run_id = self._open()
        if first is not None:
            self._event(run_id, first)
        self._send(request)
        return run_id

    async def tokenize(self, text: str) -> list[PromptPiece]:
        """The pieces of `text` tokenized on its own, as a forced phrase's (SettingsError, one line, when they
        cannot be had); answered while a run is paused too."""
        return await self.ask(Tokenize, text)

    async def preview(self, request: PreviewRequest) -> StepPreview:
        """A step of a run under other sampler settings, the run unchanged (core/runs/preview.py); answered while
        the run is paused or has ended. SettingsError (one line) when it cannot be had (the engine's
        `preview_refusal`, or a run that is generating)."""
        if not isinstance(request, PreviewRequest):
            raise TypeError(f"preview() needs a PreviewRequest, got {type(request).__name__}")
        return (await self.ask(PreviewStep, request))[0]

    async def ask(self, message: type, *arguments):
        """The answer of the ASK operation whose request is `message` (core/link/protocol.py) with `arguments` (its
        fields after `asked`); SettingsError (one line) when it cannot be had."""
        op = self._declared(message, ASK)
        self._check(op)
        self._questions += 1
        return await self._ask(message(self._questions, *arguments))

    @staticmethod
    def _declared(message: type, kind) -> Operation:
        op = DECLARED.get(message)
        if op is None or op.kind is not kind:
            raise TypeError(f"{getattr(message, '__name__', message)!r} is not a declared {kind.value} operation "
                            "(core/link/protocol.py)")
        return op

    def _check(self, op: Operation) -> None:
        refusal = self.refusal(op.refusal)
        if refusal is not None:
            raise SettingsError(refusal)

    def _open(self) -> int:
        """Stop the current run and open the next one: its id, its record, its RunOpened reply."""
        self.stop()
        self._run_id += 1
        run_id = self._run_id
        # each run its own recorder (file handle) in the recorder's folder: a superseded run still ending writes
        # its `done` to its own record, not into this one (a RunRecorder holds one file; opening the next closes it)
        recorder = self._recorder.fresh() if self._recorder is not None else None
        record = RecordedRun(self.facts, recorder, on_note=lambda message: self._reply(run_id, RunNote(run_id, message)))
        self._records[run_id] = record
        self._ended[run_id] = asyncio.get_running_loop().create_future()
        self._reply(run_id, RunOpened(run_id, record.open()))
        return run_id

    def stop(self) -> None:
        if self._run_id in self._records:
            self._send(Stop(self._run_id))

    def pause(self) -> None:
        self._paused = True
        self._send(Pause())

    def resume(self) -> None:
        self._paused = False
        self._send(Resume())

    def step_once(self) -> None:
        if self.paused:
            self._send(Step())

    def halt(self) -> None:
        """Stop the current run and let it end (a paused one is resumed so it can)."""
        self.stop()
        if self._paused:
            self.resume()

    async def finish(self, timeout: float) -> bool:
        """Stop the current run and wait up to `timeout` s for it to end (its record then ends with the engine's
        own `done`); False if it did not (one long model run, e.g. a long prompt's prefill, cannot stop half-way)."""
        self.halt()
        pending = [future for future in self._ended.values() if not future.done()]
        if not pending:
            return True
        done, _ = await asyncio.wait(pending, timeout=timeout)
        return len(done) == len(pending)

    def record_of(self, run_id: int) -> RecordedRun | None:
        """The record of a run not yet ended (None once it has)."""
        return self._records.get(run_id)

    def close_records(self) -> None:
        """End every record still open: a run cut off before its `done` gets a "stopped" one from its steps."""
        for run_id in list(self._records):
            self._cut_off(run_id)

    # ---- what subclasses report ---------------------------------------------------------------------------
    def _event(self, run_id: int, event: Event) -> None:
        record = self._records.get(run_id)
        if record is None:
            return  # a run already ended (or never started here): nothing to record or show
        record.feed(event)
        self._pass_on(run_id, event)
        if record.ended:
            self._end(run_id)

    def _pass_on(self, run_id: int, event: Event) -> None:
        if run_id == self._run_id:
            self.listener(RunUpdate(run_id, event))
        elif isinstance(event, DoneEvent):
            self.listener(RunEnded(run_id, event))

    def _failed(self, run_id: int, message: str, kind: ErrorKind) -> None:
        """The run failed outside its engine's own events: its record ends with `error` and `done`, which are passed
        on as the engine's would be."""
        record = self._records.get(run_id)
        if record is None:
            return
        for event in record.fail(message, kind):
            self._pass_on(run_id, event)
        self._end(run_id)

    def _cut_off(self, run_id: int) -> None:
        """The engine's stream of `run_id` ended without `done` (its process was closed on purpose): the record's
        "stopped" done is passed on as the run's end."""
        record = self._records.get(run_id)
        if record is None:
            return
        record.close()
        if record.cut_off is not None:
            self._pass_on(run_id, record.cut_off)
        self._end(run_id)

    def _end(self, run_id: int) -> None:
        record = self._records.pop(run_id, None)
        if record is not None:
            record.close()
        future = self._ended.pop(run_id, None)
        if future is not None and not future.done():
            future.set_result(None)

    def _reply(self, run_id: int, reply: Reply) -> None:
        if run_id == self._run_id:
            self.listener(reply)

    # ---- the transport ------------------------------------------------------------------------------------
    async def _load(self, progress: Progress) -> tuple[ModelFacts, SamplerSettings, RunOptions]:
        raise NotImplementedError

    def _send(self, message) -> None:
        """Carry `message`, a declared RUN or CONTROL operation (core/link/protocol.py), to the engine: a RUN's
        events come back through `_event` under its run_id."""
        raise NotImplementedError

    async def _ask(self, message):
        """The engine's answer to `message`, a declared ASK operation (SettingsError when it has none)."""
        raise NotImplementedError

    def _refusal(self, what: str) -> str | None:
        """Why this (loaded) engine cannot do `what` (see `refusal`); None when it can."""
        return None

    def close(self) -> None:
        """End the engine (and its process, if any); records still open end with a "stopped" done."""
        self.close_records()
