"""Sections of the main thread that a signal's KeyboardInterrupt does not cut in two (`unbroken`), and the one way a
signal handler raises it (`interrupt`).

Why: Python runs a signal handler on the main thread between any two bytecodes, so a handler that raises
KeyboardInterrupt (a second Ctrl-C or SIGHUP while a run decodes, tokentui/commands/common.py's SignalStop; any
signal while starting up, tokentui/cli.py) can land between two statements that must go together. The one that
matters: core/runs/recording.py writes an event to the run's record and then counts it for the `done` it writes if
the run is cut off; an interrupt between the two left a record whose `done` counted one step fewer than it holds.
Inside `unbroken()` the handler's interrupt is held and raised as the section ends (at once, on the same thread), so
the section runs whole or not at all; elsewhere, and on other threads (no handler runs there), nothing changes.
"""

from __future__ import annotations

import threading

__all__ = ["interrupt", "unbroken"]


class _Held:
    """The main thread's open sections and whether an interrupt waits for them to end."""

    depth = 0
    pending = False


def interrupt() -> None:
    """For a signal handler: raise KeyboardInterrupt now, or, inside an `unbroken()` section of the main thread,
    as that section ends."""
    if _Held.depth > 0 and threading.current_thread() is threading.main_thread():
        _Held.pending = True
        return
    raise KeyboardInterrupt


class unbroken:
    """`with unbroken(): ...` on the main thread: an `interrupt()` meanwhile is raised when the (outermost) section
    ends, after its last statement; an exception the section raised itself is then the interrupt's context. On
    another thread it does nothing (signal handlers run on the main thread only)."""

    def __enter__(self) -> "unbroken":
        self._main = threading.current_thread() is threading.main_thread()
        if self._main:
            _Held.depth += 1
        return self

    def __exit__(self, *exc) -> None:
        if not self._main:
            return
        _Held.depth -= 1
        if _Held.depth == 0 and _Held.pending:
            _Held.pending = False
            raise KeyboardInterrupt
