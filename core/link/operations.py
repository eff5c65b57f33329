"""The engine operations, each declared once: the `@operation` on its request dataclass in core/link/protocol.py
names the engine method it calls (core/interface.py, core/controls.py) and how it is answered. Everything else is
derived from that declaration, not restated:

    the protocol     the messages the model process accepts (protocol.COMMANDS) and answers (protocol.RUN_REPLIES)
    the client       one send path for every operation (core/link/client.py's `begin`, `ask` and the controls;
                     core/link/process_client.py posts the message, core/link/local_client.py calls `call`)
    the model side   one dispatch for every operation (core/model/process_main.py: the message's `Operation.call`)

Adding an operation is one declared dataclass in protocol.py plus the engine method it names.

The kinds of operation:
    RUN       streams a run's events (run, branch, score, fan-out): the message's first field is `run_id`, the run's
              id, passed as the method's `run_id=`; a new run supersedes the current one; the model process queues
              them and runs one at a time
    CONTROL   applied at once between the engine's steps (stop, pause, settings); nothing comes back
    ASK       answered at once, also while a run is paused (a phrase's tokens): the first field is `asked`, the
              asker's number for the question, echoed in the answer (the declared `answer` class: built as
              answer(asked, tuple(returned)) or answer(asked, error=line); its `result()` is the returned value)
The message's other fields are the method's arguments, in their order.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable

from ..errors import ProtocolError


class Kind(enum.Enum):
    RUN = "run"
    CONTROL = "control"
    ASK = "ask"


RUN, CONTROL, ASK = Kind.RUN, Kind.CONTROL, Kind.ASK
_ADDRESS = {RUN: "run_id", ASK: "asked"}  # the first field of a RUN / ASK message: not an argument of the method


@dataclass(frozen=True)
class Operation:
    """One engine operation: its request message, the engine method the message calls, its kind, the `what` of the
    engine's `<what>_refusal` property that says why an engine cannot (None: every engine can; core/interface.py)
    and, for an ASK, the message that answers it."""

    message: type
    method: str
    kind: Kind
    refusal: str | None = None
    answer: type | None = None
    arguments: tuple[str, ...] = ()  # the message's fields passed to the method, in order

    def call(self, engine: Any, message: object) -> Any:
        """`message` applied to `engine`: the method named, with the message's fields (a RUN's `run_id` passed on
        as `run_id=`)."""
        method = getattr(engine, self.method)
        values = [getattr(message, name) for name in self.arguments]
        if self.kind is RUN:
            return method(*values, run_id=message.run_id)
        return method(*values)


DECLARED: dict[type, Operation] = {}  # filled by the declarations of core/link/protocol.py, in their order


def operation(method: str, kind: Kind, *, refusal: str | None = None,
              answer: type | None = None) -> Callable[[type], type]:
    """Declare the dataclass below as the request of engine method `method` (see the module docstring)."""

    def declare(message: type) -> type:
        if not is_dataclass(message):
            raise TypeError(f"{message.__name__}: an operation's request is a dataclass")
        names = tuple(f.name for f in fields(message))
        address = _ADDRESS.get(kind)
        if address is not None and names[:1] != (address,):
            raise TypeError(f"{message.__name__}: the first field of an operation of kind {kind.name} is `{address}`")
        if (answer is not None) != (kind is ASK):
            raise TypeError(f"{message.__name__}: an ASK operation, and only one, declares its answer")
        if answer is not None and not (is_dataclass(answer) and fields(answer)[0].name == "asked"
                                       and callable(getattr(answer, "result", None))):
            raise TypeError(f"{answer.__name__}: an answer is a dataclass: `asked` first, then what the method "
                            "returned (a tuple) or an `error` line; `result()` gives it back or raises that line")
        if message in DECLARED or any(op.method == method for op in DECLARED.values()):
            raise TypeError(f"{message.__name__}: {method} is declared once")
        DECLARED[message] = Operation(message, method, kind, refusal, answer,
                                      names[1:] if address is not None else names)
        return message

    return declare


def operation_of(message: object) -> Operation:
    """The declared operation of `message`; ProtocolError (one line) for a message that is none."""
    op = DECLARED.get(type(message))
    if op is None:
        raise ProtocolError(f"the model process protocol: {type(message).__name__} is not a declared engine operation "
                            "(core/link/protocol.py)")
    return op


def call(engine: Any, message: object) -> Any:
    """Dispatch `message` to `engine` as declared (ProtocolError for one that is not declared)."""
    return operation_of(message).call(engine, message)
