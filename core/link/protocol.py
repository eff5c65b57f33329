"""The messages between the dashboard and its model process (core/link/process_client.py): one frozen dataclass per message,
checked where it is built, so a malformed one cannot be sent, and checked again where it is received, so one that
is not what that side expects is refused with `ProtocolError` instead of being read as something else.

Each engine operation is declared here once, by the `@operation` on its request (core/link/operations.py says what
is derived from it): the client sends it, the model process dispatches it, and the sets of messages each side
accepts below (COMMANDS, RUN_REPLIES) are read off the declarations.

    parent -> child   Load first; then the declared operations (runs: StartRun, StartBranch, StartScore,
                      StartFanout, StartTurn; controls: Stop, Pause, Resume, Step, SetSampler, SetOptions; asked:
                      Tokenize, PreviewStep); Quit
    child -> parent   Loading (progress) while loading, then Ready or LoadFailed; then RunEvent and Crash, each with the
                      id of the run it belongs to (a newer run's id retires an older run's messages), and
                      the answer of each ASK (Tokenized, a phrase's pieces while it is typed; Previewed, a step under
                      other sampler settings)

They travel pickled over a private socket pair (`multiprocessing.connection`) between two processes of the same
program; nothing listens on a port.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ErrorKind, ProtocolError, SettingsError
from ..runs.branch_point import BranchPoint
from ..runs.events import Event, LoadProgress, PromptPiece
from ..runs.facts import ModelFacts
from ..runs.preview import PreviewRequest, StepPreview
from ..runs.requests import FanoutRequest, ScoreRequest
from ..runs.turns import TurnRequest
from ..settings import RunOptions, SamplerSettings
from .operations import ASK, CONTROL, DECLARED, RUN, operation


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


def _whole(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"{what} must be an integer >= 0, got {value!r}")


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


@operation("run", RUN)
@dataclass(frozen=True, slots=True)
class StartRun:
    run_id: int
    prompt: str
    system: str | None = None

    def __post_init__(self) -> None:
        _whole(self.run_id, "a run id")
        _text("the prompt", self.prompt)
        _text("the system prompt", self.system, optional=True)


@operation("branch", RUN, refusal="branch")
@dataclass(frozen=True, slots=True)
class StartBranch:
    """Run `Engine.branch(point)` as run `run_id` (core/model/branch.py); its events come back as RunEvent like a
    run's."""

    run_id: int
    point: BranchPoint

    def __post_init__(self) -> None:
        _whole(self.run_id, "a run id")
        if not isinstance(self.point, BranchPoint):
            raise ProtocolError(f"StartBranch needs a BranchPoint, got {type(self.point).__name__}")


@operation("score", RUN, refusal="score")
@dataclass(frozen=True, slots=True)
class StartScore:
    """Run `Engine.score(request)` as run `run_id` (core/model/scoring.py)."""

    run_id: int
    request: ScoreRequest

    def __post_init__(self) -> None:
        _whole(self.run_id, "a run id")
        if not isinstance(self.request, ScoreRequest):
            raise ProtocolError(f"StartScore needs a ScoreRequest, got {type(self.request).__name__}")


@operation("fanout", RUN, refusal="fanout")
@dataclass(frozen=True, slots=True)
class StartFanout:
    """Run `Engine.fanout(request)` as run `run_id` (core/model/fanout.py)."""

    run_id: int
    request: FanoutRequest

    def __post_init__(self) -> None:
        _whole(self.run_id, "a run id")
        if not isinstance(self.request, FanoutRequest):
            raise ProtocolError(f"StartFanout needs a FanoutRequest, got {type(self.request).__name__}")


@operation("turn", RUN, refusal="turn")
@dataclass(frozen=True, slots=True)
class StartTurn:
    """Run `Engine.turn(request)` as run `run_id` (core/model/turn.py): a follow-up turn, or a raw run."""

    run_id: int
    request: TurnRequest

    def __post_init__(self) -> None:
        _whole(self.run_id, "a run id")
        if not isinstance(self.request, TurnRequest):
            raise ProtocolError(f"StartTurn needs a TurnRequest, got {type(self.request).__name__}")


@dataclass(frozen=True, slots=True)
class Tokenized:  # child -> parent: here because Tokenize's declaration names it
    """The answer to Tokenize `asked`: the pieces, or the one line that says why there are none."""

    asked: int
    pieces: tuple[PromptPiece, ...] = ()
    error: str | None = None

    def __post_init__(self) -> None:
        _whole(self.asked, "a question's number")
        if not isinstance(self.pieces, tuple) or not all(isinstance(p, PromptPiece) for p in self.pieces):
            raise ProtocolError("Tokenized needs a tuple of PromptPiece")
        _text("the tokenize error", self.error, optional=True)

    def result(self) -> list[PromptPiece]:
        """The pieces; SettingsError with the one line that says why there are none."""
        if self.error is not None:
            raise SettingsError(self.error)
        return list(self.pieces)


@operation("phrase_pieces", ASK, refusal="phrase", answer=Tokenized)
@dataclass(frozen=True, slots=True)
class Tokenize:
    """The pieces of `text` tokenized on its own (a phrase being typed); answered at once with Tokenized, also while
    a run is in progress or paused."""

    asked: int  # the parent's number for this question, echoed in the answer
    text: str

    def __post_init__(self) -> None:
        _whole(self.asked, "a question's number")
        _text("the phrase", self.text)


@dataclass(frozen=True, slots=True)
class Previewed:  # child -> parent: here because PreviewStep's declaration names it
    """The answer to PreviewStep `asked`: the step previewed (a tuple of one), or the one line that says why not."""

    asked: int
    previews: tuple[StepPreview, ...] = ()
    error: str | None = None

    def __post_init__(self) -> None:
        _whole(self.asked, "a question's number")
        if not isinstance(self.previews, tuple) or not all(isinstance(p, StepPreview) for p in self.previews):
            raise ProtocolError("Previewed needs a tuple of StepPreview")
        _text("the preview error", self.error, optional=True)

    def result(self) -> list[StepPreview]:
        """The preview (a list of one); SettingsError with the one line that says why there is none."""
        if self.error is not None:
            raise SettingsError(self.error)
        return list(self.previews)


@operation("preview_step", ASK, refusal="preview", answer=Previewed)
@dataclass(frozen=True, slots=True)
class PreviewStep:
    """A step of a run under other sampler settings (core/runs/preview.py, core/model/preview.py): answered at once
    with Previewed, while the run waits paused (or has ended); the run does not advance."""

    asked: int
    request: PreviewRequest

    def __post_init__(self) -> None:
        _whole(self.asked, "a question's number")
        if not isinstance(self.request, PreviewRequest):
            raise ProtocolError(f"PreviewStep needs a PreviewRequest, got {type(self.request).__name__}")


@operation("stop", CONTROL)
@dataclass(frozen=True, slots=True)
class Stop:
    """Stop every run up to and including `run_id` (at its next step boundary)."""

    run_id: int

    def __post_init__(self) -> None:
        _whole(self.run_id, "a run id")


@operation("pause", CONTROL)
@dataclass(frozen=True, slots=True)
class Pause:
    pass


@operation("resume", CONTROL)
@dataclass(frozen=True, slots=True)
class Resume:
    pass


@operation("step_once", CONTROL)
@dataclass(frozen=True, slots=True)
class Step:
    """While paused: let exactly one more step through."""


@operation("set_sampler", CONTROL)
@dataclass(frozen=True, slots=True)
class SetSampler:
    settings: SamplerSettings

    def __post_init__(self) -> None:
        if not isinstance(self.settings, SamplerSettings):
            raise ProtocolError(f"SetSampler needs SamplerSettings, got {type(self.settings).__name__}")


@operation("set_options", CONTROL)
@dataclass(frozen=True, slots=True)
class SetOptions:
    options: RunOptions

    def __post_init__(self) -> None:
        if not isinstance(self.options, RunOptions):
            raise ProtocolError(f"SetOptions needs RunOptions, got {type(self.options).__name__}")


@dataclass(frozen=True, slots=True)
class Quit:
    pass


# the messages the model process accepts: the declared operations, and Quit (the end of the process, not an engine
# operation: the client's close)
COMMANDS: tuple[type, ...] = (*DECLARED, Quit)
RUN_STARTS: tuple[type, ...] = tuple(m for m, op in DECLARED.items() if op.kind is RUN)  # queued: one run at a time
OPERATIONS = tuple(DECLARED.values())


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
    run_id: int
    event: Event

    def __post_init__(self) -> None:
        _whole(self.run_id, "a run id")
        if not isinstance(self.event, Event):
            raise ProtocolError(f"RunEvent needs an engine Event, got {type(self.event).__name__}")


@dataclass(frozen=True, slots=True)
class Crash:
    """The run `run_id` failed with an exception the engine did not turn into an ErrorEvent (the log has more)."""

    run_id: int
    message: str

    def __post_init__(self) -> None:
        _whole(self.run_id, "a run id")
        _text("the crash message", self.message)


LOADING_REPLIES: tuple[type, ...] = (Loading, Ready, LoadFailed)
RUN_REPLIES: tuple[type, ...] = (RunEvent, Crash, *(op.answer for op in OPERATIONS if op.kind is ASK))


def expect(message: object, kinds: tuple[type, ...], where: str) -> object:
    """`message` if it is one of `kinds`; otherwise ProtocolError (never guessed at)."""
    if not isinstance(message, kinds):
        names = ", ".join(k.__name__ for k in kinds)
        raise ProtocolError(f"the model process protocol: {where} expected {names}, got {type(message).__name__}")
    return message
