"""Progress on stderr, for a person at a terminal: the model's loading (the headless text stream, `tokentui --headless`
without --json; `tokentui fanout`) and a fan-out's decode (`tokentui fanout`).

As git does with its progress: shown only when stderr is a terminal, on one line rewritten in place (what is under
way in words, a percentage where one is measured, the seconds so far, redrawn each second while nothing new comes),
and erased once the work is done or fails — so the terminal keeps only the answer and the one-line messages, and a
redirected stderr (a log, a script) gets nothing it did not get before.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, TextIO

ERASE = "\r\x1b[K"  # back to the line's start, clear to its end


class ProgressLine:
    def __init__(self, stream: TextIO, write: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, what: str = "loading the model") -> None:
        try:
            self.shown = stream.isatty()
        except (AttributeError, ValueError, OSError):  # closed or not a file
            self.shown = False
        self.what = what
        self._write = write or (lambda text: _write_to(stream, text))
        self._clock = clock
        self._started = clock()
        self._drawn = False
        self._last: tuple[str, float | None] | None = None
        self._lock = threading.Lock()  # the ticker and the caller both draw
        self._done = threading.Event()
        self._ticker: threading.Thread | None = None

    def line(self, stage: str, fraction: float | None) -> str:
        """What the line says at `stage` (and `fraction`, 0..1, where measured)."""
        seconds = self._clock() - self._started
        share = f" {fraction:.0%}" if fraction is not None else ""
        return f"tokentui: {self.what} — {stage.strip()}{share} ({seconds:.0f} s)"

    def update(self, stage: str, fraction: float | None = None) -> None:
        if not self.shown:
            return
        with self._lock:
            if self._done.is_set():
                return
            self._last = (stage, fraction)
            self._write(ERASE + self.line(stage, fraction))
            self._drawn = True
        if self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="progress-line", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        while not self._done.wait(1.0):
            with self._lock:
                if self._last is not None and not self._done.is_set():
                    self._write(ERASE + self.line(*self._last))

    def clear(self) -> None:
        """Erased for other output (a message, the result); the next `update` draws it again."""
        with self._lock:
            self._last = None
            if self._drawn:
                self._write(ERASE)
                self._drawn = False

    def finish(self) -> None:
        """The work is done (or failed): the line erased, and not drawn again."""
        with self._lock:
            self._done.set()
            if self._drawn:
                self._write(ERASE)
                self._drawn = False
        if self._ticker is not None:
            self._ticker.join(timeout=2)


LoadProgressLine = ProgressLine  # the model's loading: the default `what`


def _write_to(stream: TextIO, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):  # the terminal is gone: progress is not worth an error
        pass
