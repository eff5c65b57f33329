"""What a running engine obeys from any thread, between its steps: the sampler settings (the next step uses them),
pause / single step (core/gate.py's StepGate), and stop. Every engine keeps them (core/interface.py's BaseEngine
inherits this class): the local engine, the served-model engine, the replay and the tests' scripted engine.

Runs are named by their run id: the id the caller gives (`run(..., run_id=N)`) or the next one counted here. There is
one count per program: the dashboard's engine client counts its runs (core/link/client.py) and the engine, in the
model process or in-process, takes each id it is given (core/link/protocol.py's `run_id` fields); an engine driven
directly (the commands, the tests) counts here. `stop(run_id)` stops that run and every earlier one; a newer run
retires every older one. An engine's loop calls the methods under "for the engine's loop" at its step
boundaries: `wait_at_gate` (pause / step / stop), `take_settings`, `stopping`.
"""

from __future__ import annotations

import time

from .gate import StepGate
from .settings import SamplerSettings


class RunControls:
    def __init__(self, sampler: SamplerSettings | None = None) -> None:
        self._sampler = sampler or SamplerSettings()
        self._sampler_changed = False
        self._step_gate = StepGate()  # pause / single step, shared with the replay (core/gate.py)
        self._cond = self._step_gate.lock  # the sampler settings and the run ids live under the gate's lock
        self._run_id = 0  # the run allowed to continue; a newer run or stop() retires older ones
        self._stopped_up_to = -1  # every run with an id up to this one must stop

    # ---- from any thread ------------------------------------------------------------------------------------
    @property
    def sampler(self) -> SamplerSettings:
        with self._cond:
            return self._sampler

    def set_sampler(self, settings: SamplerSettings) -> SamplerSettings:
        """The settings the next step uses: one SamplerSettings, valid since it was built (core/settings.py)."""
        if not isinstance(settings, SamplerSettings):
            raise TypeError(f"set_sampler needs SamplerSettings, got {type(settings).__name__}")
        with self._cond:
            if settings != self._sampler:
                self._sampler = settings
                self._sampler_changed = True
            return settings

    def update_sampler(self, **changes) -> SamplerSettings:
        """`set_sampler` of the current settings with `changes` (checked as they are built: SettingsError)."""
        return self.set_sampler(self.sampler.with_changes(**changes))

    @property
    def paused(self) -> bool:
        return self._step_gate.paused

    def pause(self) -> None:
        self._step_gate.pause()

    def resume(self) -> None:
        self._step_gate.resume()

    def step_once(self) -> None:
        """While paused, let exactly one more step through."""
        self._step_gate.step_once()

    def stop(self, run_id: int | None = None) -> None:
        """End run `run_id` and every earlier one (None: the current run) at its next step boundary (DoneEvent
        reason "stopped")."""
        with self._cond:
            self._stopped_up_to = max(self._stopped_up_to, self._run_id if run_id is None else run_id)
            self._cond.notify_all()

    @property
    def run_id(self) -> int:
        """The id of the latest run begun (0 before any)."""
        with self._cond:
            return self._run_id

    # ---- for the engine's loop --------------------------------------------------------------------------------
    def begin_run(self, run_id: int | None = None) -> int:
        """A new run: its id (`run_id`, or the next one); older runs see they must stop, and settings changed before
        it are not a change in it. A run whose id was already stopped ends at its first step boundary."""
        with self._cond:
            if run_id is None:
                run_id = self._run_id + 1
            if isinstance(run_id, bool) or not isinstance(run_id, int) or run_id < self._run_id:
                raise ValueError(f"run ids only grow: {run_id!r} after {self._run_id}")
            self._run_id = run_id
            self._sampler_changed = False
            self._cond.notify_all()
            return run_id

    def wait_at_gate(self, run_id: int) -> bool:
        """Block while paused; False when this run must stop (stopped, or retired by a newer run)."""
        return self._step_gate.wait(lambda: self.stopping(run_id))  # the gate's lock is re-entrant

    def timed_gate(self, run_id: int) -> tuple[bool, float]:
        """`wait_at_gate` and the seconds it held the run: paused time (microseconds when not paused), not decode
        time."""
        started = time.perf_counter()
        go = self.wait_at_gate(run_id)
        return go, time.perf_counter() - started

    def sleep_at_gate(self, seconds: float, run_id: int, until_paused: bool = False) -> bool:
        """Wait up to `seconds` (a replay's recorded latency), waking early to stop (and, `until_paused`, at a
        pause: core/gate.py); False when stopping."""
        return self._step_gate.sleep(seconds, lambda: self.stopping(run_id), until_paused)

    def stopping(self, run_id: int) -> bool:
        """True when this run must stop (checked between prefill chunks, which do not wait for pause)."""
        with self._cond:
            return self._stopped_up_to >= run_id or self._run_id != run_id

    def take_settings(self) -> tuple[SamplerSettings, bool]:
        """The settings for the step about to be selected, and whether they changed since the run last took them."""
        with self._cond:
            changed, self._sampler_changed = self._sampler_changed, False
            return self._sampler, changed

    def settings_pending(self) -> bool:
        """Settings changed since the run last took them (a served run re-issues its request for them)."""
        with self._cond:
            return self._sampler_changed
