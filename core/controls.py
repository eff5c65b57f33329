"""What a running engine obeys from any thread, between its steps: the sampler settings (the next step uses them),
pause / single step (core/gate.py's StepGate), stop, and the serial that retires an older run when a newer one
starts. The local engine (core/model/engine.py) and the served-model engine (core/server/engine.py) share it."""

from __future__ import annotations

import time

from .gate import StepGate
from .settings import SamplerSettings


class RunControls:
    def __init__(self, sampler: SamplerSettings | None = None) -> None:
        self._sampler = sampler or SamplerSettings()
        self._sampler_changed = False
        self._steps = StepGate()  # pause / single step, shared with the replay (core/gate.py)
        self._cond = self._steps.lock  # the sampler settings and the run serials live under the gate's lock
        self._run_serial = 0  # the run allowed to continue; a newer run or stop() retires older ones
        self._stop_serial = -1

    @property
    def sampler(self) -> SamplerSettings:
        with self._cond:
            return self._sampler

    def update_sampler(self, **changes) -> SamplerSettings:
        """Change settings mid-run (validated; raises SettingsError). The next step uses them."""
        with self._cond:
            new = self._sampler.with_changes(**changes)
            if new != self._sampler:
                self._sampler = new
                self._sampler_changed = True
            return new

    @property
    def paused(self) -> bool:
        return self._steps.paused

    def pause(self) -> None:
        self._steps.pause()

    def resume(self) -> None:
        self._steps.resume()

    def step_once(self) -> None:
        """While paused, let exactly one more step through."""
        self._steps.step_once()

    def stop(self) -> None:
        """End the current run at the next step boundary (DoneEvent reason "stopped")."""
        with self._cond:
            self._stop_serial = self._run_serial
            self._cond.notify_all()

    def _new_run(self) -> int:
        """A new run's serial (older runs see they must stop); settings changed before it are not a change in it."""
        with self._cond:
            self._run_serial += 1
            self._sampler_changed = False
            self._cond.notify_all()
            return self._run_serial

    def _gate(self, serial: int) -> bool:
        """Block while paused; False when this run must stop (stopped, or retired by a newer run)."""
        return self._steps.wait(lambda: self._stopping(serial))  # the gate's lock is re-entrant

    def _timed_gate(self, serial: int) -> tuple[bool, float]:
        """`_gate` and the seconds it held the run: paused time (microseconds when not paused), not decode time."""
        started = time.perf_counter()
        go = self._gate(serial)
        return go, time.perf_counter() - started

    def _stopping(self, serial: int) -> bool:
        """True when this run must stop (checked between prefill chunks, which do not wait for pause)."""
        with self._cond:
            return self._stop_serial >= serial or self._run_serial != serial

    def _take_settings(self) -> tuple[SamplerSettings, bool]:
        with self._cond:
            changed, self._sampler_changed = self._sampler_changed, False
            return self._sampler, changed

    def _settings_pending(self) -> bool:
        """Settings changed since the run last took them (a served run re-issues its request for them)."""
        with self._cond:
            return self._sampler_changed
