"""The messages between the dashboard and its model process (core/link/process_client.py): one frozen dataclass per message,
checked where it is built, so a malformed one cannot be sent, and checked again where it is received, so one that
is not what that side expects is refused with `ProtocolError` instead of being read as something else.

    parent -> child   Load first; then StartRun, StartBranch, StartScore, StartFanout, Stop, Pause, Resume, Step,
                      SetSampler, SetOptions, Tokenize, Quit
    child -> parent   Loading (progress) while loading, then Ready or LoadFailed; then RunEvent and Crash, each with the
                      serial of the run it belongs to (a newer run's serial retires an older run's messages), and
                      Tokenized, the answer to a Tokenize (a phrase's pieces while it is typed)

They travel pickled over a private socket pair (`multiprocessing.connection`) between two processes of the same
program; nothing listens on a port.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from ..errors import ErrorKind, ProtocolError
from ..runs.branch_point import BranchPoint
from ..runs.events import Event, LoadProgress, PromptPiece
from ..runs.facts import ModelFacts
from ..runs.requests import FanoutRequest, ScoreRequest
from ..settings import RunOptions, SamplerSettings


@dataclass(frozen=True)
class EngineSpec:
    """Everything needed to build an engine (core/model/load/build.py): what the command line says about the model and
    the run. Sent to the model process as its first message (Load)."""

    model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    device_map: str | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    compile: bool = False
    threads: int | None = None
    weight_layout: str = "auto"
    kv_shapes: str = "auto"
    quantize: str = "none"  # "int4": a float model's matrices quantized here (core/model/quant/quantize.py)
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    options: RunOptions = field(default_factory=RunOptions)


def _serial(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"a run serial must be an integer >= 0, got {value!r}")


def _text(name: str, value: object, optional: bool = False) -> None:
    if not (isinstance(value, str) or (optional and value is None)):
        raise ProtocolError(f"{name} must be text, got {type(value).__name__}")


# ---- parent -> child -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Load:
    spec: EngineSpec

    def __post_init__(self) -> None:
        if not isinstance(self.spec, EngineSpec):
            raise ProtocolError(f"Load needs an EngineSpec, got {type(self.spec).__name__}")


@dataclass(frozen=True, slots=True)
class StartRun:
    serial: int
    prompt: str
    system: str | None = None

    def __post_init__(self) -> None:
        _serial(self.serial)
        _text("the prompt", self.prompt)
        _text("the system prompt", self.system, optional=True)


@dataclass(frozen=True, slots=True)
class StartBranch:
    """Run `Engine.branch(point)` as run `serial` (core/model/branch.py); its events come back as RunEvent like a run's."""

    serial: int
    point: BranchPoint

    def __post_init__(self) -> None:
        _serial(self.serial)
        if not isinstance(self.point, BranchPoint):
            raise ProtocolError(f"StartBranch needs a BranchPoint, got {type(self.point).__name__}")


@dataclass(frozen=True, slots=True)
class StartScore:
    """Run `Engine.score(request)` as run `serial` (core/model/scoring.py)."""

    serial: int
    request: ScoreRequest

    def __post_init__(self) -> None:
        _serial(self.serial)
        if not isinstance(self.request, ScoreRequest):
            raise ProtocolError(f"StartScore needs a ScoreRequest, got {type(self.request).__name__}")


@dataclass(frozen=True, slots=True)
class StartFanout:
    """Run `Engine.fanout(request)` as run `serial` (core/model/fanout.py)."""

    serial: int
    request: FanoutRequest

    def __post_init__(self) -> None:
        _serial(self.serial)
        if not isinstance(self.request, FanoutRequest):
            raise ProtocolError(f"StartFanout needs a FanoutRequest, got {type(self.request).__name__}")


@dataclass(frozen=True, slots=True)
class Tokenize:
    """The pieces of `text` tokenized on its own (a phrase being typed); answered at once with Tokenized, also while
    a run is in progress or paused."""

    asked: int  # the parent's number for this question, echoed in the answer
    text: str

    def __post_init__(self) -> None:
        _serial(self.asked)
        _text("the phrase", self.text)


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop every run up to and including `serial` (at its next step boundary)."""

    serial: int

    def __post_init__(self) -> None:
        _serial(self.serial)


@dataclass(frozen=True, slots=True)
class Pause:
    pass


@dataclass(frozen=True, slots=True)
class Resume:
    pass


@dataclass(frozen=True, slots=True)
class Step:
    """While paused: let exactly one more step through."""


@dataclass(frozen=True, slots=True)
class SetSampler:
    settings: SamplerSettings

    def __post_init__(self) -> None:
        if not isinstance(self.settings, SamplerSettings):
            raise ProtocolError(f"SetSampler needs SamplerSettings, got {type(self.settings).__name__}")


@dataclass(frozen=True, slots=True)
class SetOptions:
    options: RunOptions

    def __post_init__(self) -> None:
        if not isinstance(self.options, RunOptions):
            raise ProtocolError(f"SetOptions needs RunOptions, got {type(self.options).__name__}")


@dataclass(frozen=True, slots=True)
class Quit:
    pass


Command = Union[StartRun, StartBranch, StartScore, StartFanout, Stop, Pause, Resume, Step, SetSampler, SetOptions,
                Tokenize, Quit]
COMMANDS: tuple[type, ...] = (StartRun, StartBranch, StartScore, StartFanout, Stop, Pause, Resume, Step, SetSampler,
                              SetOptions, Tokenize, Quit)
RUN_STARTS: tuple[type, ...] = (StartRun, StartBranch, StartScore, StartFanout)  # queued: one run at a time


# ---- child -> parent -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Loading:
    progress: LoadProgress

    def __post_init__(self) -> None:
        if not isinstance(self.progress, LoadProgress):
            raise ProtocolError(f"Loading needs a LoadProgress, got {type(self.progress).__name__}")


@dataclass(frozen=True, slots=True)
class Ready:
    facts: ModelFacts
    sampler: SamplerSettings
    options: RunOptions

    def __post_init__(self) -> None:
        if not (isinstance(self.facts, ModelFacts) and isinstance(self.sampler, SamplerSettings)
                and isinstance(self.options, RunOptions)):
            raise ProtocolError("Ready needs ModelFacts, SamplerSettings and RunOptions")


@dataclass(frozen=True, slots=True)
class LoadFailed:
    """The load failed: `kind` says why (the parent raises that kind's error, core/errors.py's error_of_kind)."""

    kind: ErrorKind
    message: str

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ErrorKind):
            raise ProtocolError(f"LoadFailed needs an ErrorKind, got {type(self.kind).__name__}")
        _text("the error message", self.message)


@dataclass(frozen=True, slots=True)
class RunEvent:
    serial: int
    event: Event

    def __post_init__(self) -> None:
        _serial(self.serial)
        if not isinstance(self.event, Event):
            raise ProtocolError(f"RunEvent needs an engine Event, got {type(self.event).__name__}")


@dataclass(frozen=True, slots=True)
class Crash:
    """The run `serial` failed with an exception the engine did not turn into an ErrorEvent (the log has more)."""

    serial: int
    message: str

    def __post_init__(self) -> None:
        _serial(self.serial)
        _text("the crash message", self.message)


@dataclass(frozen=True, slots=True)
class Tokenized:
    """The answer to Tokenize `asked`: the pieces, or the one line that says why there are none."""

    asked: int
    pieces: tuple[PromptPiece, ...] = ()
    error: str | None = None

    def __post_init__(self) -> None:
        _serial(self.asked)
        if not isinstance(self.pieces, tuple) or not all(isinstance(p, PromptPiece) for p in self.pieces):
            raise ProtocolError("Tokenized needs a tuple of PromptPiece")
        _text("the tokenize error", self.error, optional=True)


LOADING_REPLIES: tuple[type, ...] = (Loading, Ready, LoadFailed)
RUN_REPLIES: tuple[type, ...] = (RunEvent, Crash, Tokenized)


def expect(message: object, kinds: tuple[type, ...], where: str) -> object:
    """`message` if it is one of `kinds`; otherwise ProtocolError (never guessed at)."""
    if not isinstance(message, kinds):
        names = ", ".join(k.__name__ for k in kinds)
        raise ProtocolError(f"the model process protocol: {where} expected {names}, got {type(message).__name__}")
    return message
