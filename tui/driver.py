"""Textual's Linux driver, made safe for a terminal that goes away (the SSH connection drops).

Textual writes the screen from a writer thread through a bounded queue. When the terminal is gone a write fails
(EIO), the writer thread dies, the queue fills and the next screen update blocks the app for ever — the process
hangs, holding its run. Here output errors are swallowed (nothing can be shown any more) and the first sign of a
lost terminal — a failed write or read — quits the app like `q` does, so the run stops at a step boundary and its
record is closed. SIGHUP does the same through the app's own signal handler; whichever comes first wins.

Its size is asked of the terminal it draws on (see `_get_terminal_size`).
"""

from __future__ import annotations

import asyncio
import os
import threading

from textual.drivers.linux_driver import LinuxDriver


class _GuardedOutput:
    """A file proxy whose write/flush never raise: after the first failure output is dropped."""

    def __init__(self, file, on_lost) -> None:
        self._file = file
        self._on_lost = on_lost
        self.lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self._file.write(text)
            except (OSError, ValueError):
                self._lost()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._file.flush()
            except (OSError, ValueError):
                self._lost()

    def _lost(self) -> None:
        self.lost = True
        self._on_lost()

    def __getattr__(self, name):  # fileno, isatty, encoding, ...
        return getattr(self._file, name)


class TerminalDriver(LinuxDriver):
    def __init__(self, app, **kwargs) -> None:
        super().__init__(app, **kwargs)
        self._file = _GuardedOutput(self._file, self._terminal_lost)
        self._lost = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _get_terminal_size(self) -> tuple[int, int]:
        """(columns, lines) of the terminal the dashboard draws on (its output: stderr), asked of that terminal.
        Textual's own answer comes from `shutil.get_terminal_size`, which takes LINES and COLUMNS from the
        environment first (exported by a shell or a parent program, they pinned the dashboard to the size it started
        at: every resize was laid out for it) and then asks stdout, which `tokentui > file` makes a file (the
        dashboard then drew 80x24 on any terminal). Where the terminal cannot be asked, Textual's answer."""
        try:
            columns, lines = os.get_terminal_size(self._file.fileno())
        except (AttributeError, ValueError, OSError):
            return super()._get_terminal_size()
        return (columns, lines) if columns and lines else super()._get_terminal_size()

    def start_application_mode(self) -> None:
        self._loop = asyncio.get_running_loop()
        super().start_application_mode()

    def run_input_thread(self) -> None:
        try:
            super().run_input_thread()
        except OSError:  # reading a terminal that has gone away (EIO)
            self._terminal_lost()

    def _terminal_lost(self) -> None:
        """Called from the writer or input thread: quit the app on its own loop (once)."""
        if self._lost.is_set():
            return
        self._lost.set()
        loop = self._loop
        quit_app = getattr(self._app, "action_quit", None)
        if loop is not None and quit_app is not None:
            try:
                loop.call_soon_threadsafe(quit_app)
            except RuntimeError:  # the loop has already closed: the app is ending anyway
                pass
