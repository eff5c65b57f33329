"""Pause, single step and stop at step boundaries: the one implementation the engine, the replay and the tests'
scripted engine share, so "n lets exactly one token through" means the same everywhere."""

from __future__ import annotations

import threading
from typing import Callable


class StepGate:
    """A run calls `wait(stopping)` at each step boundary; other threads call `pause`, `resume`, `step_once` and,
    after changing what `stopping` reads, `wake`.

    `lock` is the condition's lock: an owner may keep state of its own under it (the engine keeps its sampler
    settings there), and must then call the gate's methods without holding it.
    """

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self._paused = False
        self._credits = 0  # steps granted while paused

    @property
    def paused(self) -> bool:
        with self.lock:
            return self._paused

    def pause(self) -> None:
        with self.lock:
            self._paused = True
            self._credits = 0
            self.lock.notify_all()  # a sleep `until_paused` ends here

    def resume(self) -> None:
        with self.lock:
            self._paused = False
            self.lock.notify_all()

    def step_once(self) -> None:
        """While paused, let exactly one more step through (ignored while running)."""
        with self.lock:
            if self._paused:
                self._credits += 1
                self.lock.notify_all()

    def wake(self) -> None:
        """Something `stopping` reads has changed: let a waiting run look again."""
        with self.lock:
            self.lock.notify_all()

    def wait(self, stopping: Callable[[], bool]) -> bool:
        """Block while paused without a granted step; False once `stopping()` (called under the lock) is true."""
        with self.lock:
            while True:
                if stopping():
                    return False
                if not self._paused:
                    return True
                if self._credits > 0:
                    self._credits -= 1
                    return True
                self.lock.wait()

    def sleep(self, seconds: float, stopping: Callable[[], bool], until_paused: bool = False) -> bool:
        """Wait up to `seconds` (a replay's recorded latency), waking early to stop; False when stopping.
        `until_paused`: not at all while paused, and no longer once paused (a replay's wait: the paused run is then
        held at `wait`, where n or space lets its next step through at once)."""
        # a recorded latency is a number from a file: NaN waits nothing, and a wait longer than the platform's
        # longest timeout (inf, 1e300 s) waits that long, never an OverflowError
        seconds = min(seconds, threading.TIMEOUT_MAX) if seconds == seconds else 0.0
        with self.lock:
            if seconds > 0:
                self.lock.wait_for(lambda: stopping() or (until_paused and self._paused), timeout=seconds)
            return not stopping()
