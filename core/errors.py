"""User-facing errors: one line that says what was wrong and what to do, never a traceback.

Every error has a kind (`ErrorKind`), which travels with it: in an `error` event (core/runs/events.py), across the
model process's socket (core/link/protocol.py) and into the exit status (`exit_status`, the one table). A kind is a
cause, not a class name, so a message from the model process or a record is read back as the same kind.
"""

from __future__ import annotations

from enum import Enum


class ErrorKind(str, Enum):
    """Why a run (or a start) failed. The value is what records and `--json` output carry as `kind`."""

    INPUT = "input"  # a flag, a file or a value the user gave cannot be used
    PROMPT = "prompt"  # the prompt cannot be run (empty, longer than the context, unreadable file)
    SETTINGS = "settings"  # a sampler / generation setting out of range, or an id not in the vocabulary
    MODEL_LOAD = "model_load"  # the model named could not be found or loaded
    RECORD = "record"  # a file that is not a record this version can read
    SERVER = "server"  # a served model's server could not be reached, refused, or broke its answer
    GENERATION = "generation"  # a fault inside the engine (NaN logits)
    OOM = "oom"  # out of (GPU) memory
    PROCESS = "process"  # the model process ended unexpectedly
    PROTOCOL = "protocol"  # a message between the dashboard and its model process that is not what it should be
    CRASH = "crash"  # an exception nobody turned into one of the above (the log has the traceback)
    OTHER = "other"  # a kind this version does not know (a record from a newer tokentui)

    @classmethod
    def of(cls, value: object) -> "ErrorKind":
        """The kind named by `value` (an ErrorKind, its value, or a class name older records wrote: PromptError ->
        prompt); OTHER when it names none."""
        if isinstance(value, ErrorKind):
            return value
        if isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                return _LEGACY.get(value, cls.OTHER)
        return cls.OTHER


# the class names records written before kinds existed carry (ErrorEvent.kind was `type(err).__name__`)
_LEGACY = {"TokentuiError": ErrorKind.INPUT, "PromptError": ErrorKind.PROMPT, "SettingsError": ErrorKind.SETTINGS,
           "ModelLoadError": ErrorKind.MODEL_LOAD, "GenerationError": ErrorKind.GENERATION,
           "ServerError": ErrorKind.SERVER, "RecordError": ErrorKind.RECORD, "ProtocolError": ErrorKind.PROTOCOL,
           "error": ErrorKind.OTHER, "nan": ErrorKind.GENERATION}

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1
# The one table: what a command exits with when a run ends with an error of this kind (what the user gave cannot
# work: 2; the run failed: 1). A TokentuiError raised before any run started is bad input whatever its kind (2).
EXIT_STATUS: dict[ErrorKind, int] = {
    ErrorKind.INPUT: EXIT_BAD_INPUT, ErrorKind.PROMPT: EXIT_BAD_INPUT, ErrorKind.SETTINGS: EXIT_BAD_INPUT,
    ErrorKind.MODEL_LOAD: EXIT_BAD_INPUT, ErrorKind.RECORD: EXIT_BAD_INPUT,
    ErrorKind.SERVER: EXIT_RUN_FAILED, ErrorKind.GENERATION: EXIT_RUN_FAILED, ErrorKind.OOM: EXIT_RUN_FAILED,
    ErrorKind.PROCESS: EXIT_RUN_FAILED, ErrorKind.PROTOCOL: EXIT_RUN_FAILED, ErrorKind.CRASH: EXIT_RUN_FAILED,
    ErrorKind.OTHER: EXIT_RUN_FAILED,
}


def exit_status(kind: ErrorKind | str) -> int:
    return EXIT_STATUS[ErrorKind.of(kind)]


class TokentuiError(Exception):
    """An error the user can act on. `str(err)` is the whole message, one line; `kind` says what failed. `step`:
    where in a run it happened (-1: before the first token)."""

    kind: ErrorKind = ErrorKind.INPUT
    step: int = -1


class SettingsError(TokentuiError, ValueError):
    """A sampler / generation setting out of range."""

    kind = ErrorKind.SETTINGS


class ModelLoadError(TokentuiError):
    """The model named could not be found or loaded."""

    kind = ErrorKind.MODEL_LOAD


class PromptError(TokentuiError):
    """The prompt cannot be run (empty, longer than the context, unreadable file)."""

    kind = ErrorKind.PROMPT


class GenerationError(TokentuiError):
    """A run stopped because of a fault inside the engine (NaN logits, out of memory)."""

    kind = ErrorKind.GENERATION

    def __init__(self, message: str, step: int = -1, kind: ErrorKind = ErrorKind.GENERATION) -> None:
        super().__init__(message)
        self.step = step
        self.kind = kind


class RecordError(TokentuiError):
    """A file that is not a run record (or run tree) this version can read. `str(err)` starts with the file's
    path."""

    kind = ErrorKind.RECORD


class RunError(ValueError):
    """An event that cannot be part of a run (a step out of order): a record's reader turns it into a RecordError
    naming the line."""


class ServerError(TokentuiError):
    """The server could not be reached, refused a request, or broke a stream. One line; `status` is the HTTP
    status when the server answered (None otherwise)."""

    kind = ErrorKind.SERVER

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ProtocolError(TokentuiError):
    """A message that is not one the receiving side expects at this point (a bug, or not our peer)."""

    kind = ErrorKind.PROTOCOL


ERROR_TYPES: dict[ErrorKind, type[TokentuiError]] = {
    cls.kind: cls for cls in (TokentuiError, SettingsError, ModelLoadError, PromptError, GenerationError,
                              RecordError, ServerError, ProtocolError)}


def error_of_kind(kind: ErrorKind, message: str) -> TokentuiError:
    """The error to raise for `kind` (one received from the model process): its class when it has one of its own."""
    cls = ERROR_TYPES.get(kind, TokentuiError)
    err = cls(message)
    err.kind = kind
    return err
