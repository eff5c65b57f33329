"""Everything the panels show, folded from the engine's events (plain Python, no Textual, testable alone).

`RunState` holds the dashboard's model and changes it: it folds the engine's events in and moves the time-travel
cursor. The readings the panels take from it (the run's parts, speed and latency, the KV figures, a served model's
readings, everything as of the step in view) are computed by `RunReadings` (tui/state_readings.py), which RunState
inherits.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from tokentui.core.runs.events import (
    DoneEvent,
    ErrorEvent,
    Event,
    LoadProgress,
    PrefillEvent,
    PrefillProgress,
    PromptEvent,
    StepEvent,
)
from tokentui.core.runs.facts import ModelFacts
from tokentui.core.runs.run import Cursor, Run
from tokentui.core.samplers import PARAMS

from .state_readings import RunReadings

__all__ = ["CHANGES_KEPT", "SETTING_NAMES", "RunState", "SettingsChange"]

SETTING_NAMES = tuple(p.name for p in PARAMS)  # the sampler's settings (core/samplers.py), in the chain's order
CHANGES_KEPT = 6  # sampler changes remembered per run (the sampler panel lists the latest)


@dataclass(frozen=True, slots=True)
class SettingsChange:
    """Sampler settings that changed, and the step (numbered from 1, as the panels show it) that first used them."""

    step: int
    changes: tuple[tuple[str, object, object], ...]  # (setting, old value, new value), in SETTING_NAMES order


@dataclass
class RunState(RunReadings):
    """The dashboard's model: the loaded model, the current run, and totals over the session."""

    facts: ModelFacts | None = None
    show_special_tokens: bool = False  # --ignore-eos: special tokens stay in the answer, marked (kept across runs)
    phase: str = "loading"  # loading, load-failed, starting, prefill, decoding, done, error
    load_stage: str = "starting"
    load_fraction: float | None = None
    runs_started: int = 0
    # A branch's run starts with its parent's steps before the branch point (tui/branches.py): positions before
    # `own_from` are the parent's, and the run's time to first token and speed figures are its own steps' only.
    own_from: int = 0
    record_path: Path | None = None
    run: Run = field(default_factory=Run)  # the current run: prompt, prefill, every step, the end (core/runs/run.py)
    prefill_started: float | None = None  # time.monotonic() when the prompt went in (the status line's clock)
    prefill_progress: PrefillProgress | None = None  # the latest chunk of a long prompt's prefill, if chunked
    prefill_progress_at: float | None = None  # time.monotonic() when it came
    settings_changed_at: int | None = None  # step number (from 1) at which the latest sampler change took effect
    settings_changes: deque = field(default_factory=lambda: deque(maxlen=CHANGES_KEPT))  # SettingsChange, oldest first
    ttft_ms: float | None = None
    kv_tokens: int = 0
    kv_bytes: int | None = 0  # None: not reported (a served model)
    kv_growth: int = 0  # bytes added by the latest step (0: none, or not known)
    # a served model (core/server/): the latest KV cache use its server reported, (fraction, step position)
    server_kv: tuple[float, int] | None = None
    reissues: int = 0  # a served model: requests re-issued from the prefix in this run
    error_message: str | None = None
    # the time-travel cursor over the run's steps (core/runs/run.py's Cursor: following the newest step, or held at
    # one); read it through `cursor` / `view_step` (the readings' mixin), move it with the cursor_* methods below
    _cursor: Cursor | None = field(default=None, init=False, repr=False, compare=False)

    # ---- run lifecycle -------------------------------------------------------------------------------------
    def next_run(self) -> "RunState":
        """A state for the next run (the prompt again, a new prompt or a branch), started: the model facts and the
        session's totals carry over; everything about this run stays here."""
        fresh = RunState(facts=self.facts, show_special_tokens=self.show_special_tokens,
                         runs_started=self.runs_started)
        fresh.start_run()
        return fresh

    def start_run(self) -> None:
        """Forget the previous run (the model facts stay). Which run is current is the engine client's to say: only
        its events reach the state."""
        self.runs_started += 1
        self.phase = "starting"
        self.record_path = None
        self.run = Run(self.facts)
        self.prefill_started = None
        self.prefill_progress = None
        self.prefill_progress_at = None
        self.settings_changed_at = None
        self.settings_changes.clear()
        self.ttft_ms = None
        self.kv_tokens = 0
        self.kv_bytes = 0
        self.kv_growth = 0
        self.server_kv = None
        self.reissues = 0
        self.error_message = None
        self._cursor = None  # a new run is watched live

    def prefill_elapsed(self, now: float | None = None) -> float | None:
        """Seconds since the prefill began (None before the prompt went in): the engine's own count at its latest
        progress event plus the time since, else the dashboard's clock since the prompt event."""
        now = time.monotonic() if now is None else now
        if self.prefill_progress is not None and self.prefill_progress_at is not None:
            return self.prefill_progress.elapsed_ms / 1000 + max(0.0, now - self.prefill_progress_at)
        if self.prefill_started is None:
            return None
        return max(0.0, now - self.prefill_started)

    @property
    def running(self) -> bool:
        return self.phase in ("starting", "prefill", "decoding")

    # ---- folding events ------------------------------------------------------------------------------------
    def apply(self, event: Event) -> None:
        if isinstance(event, LoadProgress):
            self.load_stage = event.stage
            self.load_fraction = event.fraction
            return
        if isinstance(event, StepEvent):
            previous = self.run.last
            self.run.apply(event)
            self._step(event, previous)
            return
        self.run.apply(event)
        if isinstance(event, PromptEvent):
            self.phase = "prefill"
            self.prefill_started = time.monotonic()
        elif isinstance(event, PrefillProgress):
            self.prefill_progress = event
            self.prefill_progress_at = time.monotonic()
        elif isinstance(event, PrefillEvent):
            self._kv(event.kv_tokens, event.kv_bytes)
        elif isinstance(event, DoneEvent):
            self.phase = "error" if event.reason == "error" else "done"  # a failed run's done follows its error
            self.ttft_ms = event.ttft_ms or self.ttft_ms
            if event.kv_tokens:
                self._kv(event.kv_tokens, event.kv_bytes, growth=False)
        elif isinstance(event, ErrorEvent):
            self.error_message = event.message
            self.phase = "error"
        elif isinstance(event, ModelFacts):
            self.facts = event

    def _kv(self, tokens: int, nbytes: int | None, growth: bool = True) -> None:
        if nbytes is None:  # not reported (a served model): no growth to tell either
            self.kv_growth = 0
        elif growth and self.kv_bytes:
            self.kv_growth = nbytes - self.kv_bytes
        self.kv_tokens, self.kv_bytes = tokens, nbytes

    def _step(self, step: StepEvent, previous: StepEvent | None) -> None:
        self.phase = "decoding"
        if step.settings_changed:
            self.settings_changed_at = step.index + 1
            before = previous.settings if previous is not None else None  # SamplerSettings (None: no step before)
            diff = tuple((name, getattr(before, name, None), getattr(step.settings, name)) for name in SETTING_NAMES
                         if getattr(before, name, None) != getattr(step.settings, name))
            if diff:
                self.settings_changes.append(SettingsChange(step.index + 1, diff))
        if len(self.run) - 1 == self.own_from:  # the run's first own token (a branch's: the forced one)
            self.ttft_ms = step.latency_ms
        self._kv(step.kv_tokens, step.kv_bytes)
        if step.server_kv_usage is not None:
            self.server_kv = (step.server_kv_usage, len(self.run) - 1)
        if step.reissue_ttft_ms is not None:
            self.reissues += 1

    # ---- time travel: the cursor over the steps ------------------------------------------------------------
    # One cursor per run (core/runs/run.py's Cursor): following the newest step (live, the default) or held at a past
    # step. Every panel reads the step it shows through `view_step` and the readings "as of" it
    # (tui/state_readings.py), so a held cursor shows that step as it was while the run goes on underneath.
    # Positions are the run's (0 = its first step); the panels number steps from 1 by `step.index + 1`.
    @property
    def _travel(self) -> Cursor:
        cursor = self._cursor
        if cursor is None or cursor.run is not self.run:  # a new run (or one swapped in) starts live
            cursor = self._cursor = self.run.cursor()
        return cursor

    @property
    def cursor(self) -> int | None:
        """The position the cursor holds, or None while it follows the newest step (live)."""
        cursor = self._travel
        return None if cursor.following else cursor.index

    @property
    def live(self) -> bool:
        return self.cursor is None

    @property
    def view_index(self) -> int | None:
        """The position shown: the cursor's, or the newest step's while live (None: no step yet)."""
        return self._travel.index

    def cursor_move(self, delta: int) -> bool:
        """Move the cursor `delta` steps (clamped to the first and the newest step); moving back from live holds
        the step before the newest. Forward from live stays live. True when the view changed."""
        before = self.cursor
        if before is None and delta >= 0:
            return False
        self._travel.move(delta)
        return self.cursor != before

    def cursor_go(self, position: int) -> bool:
        """Hold the cursor at `position` (clamped); True when the view changed."""
        before = self.cursor
        self._travel.go(position)
        return self.cursor != before

    @property
    def cursor_at_newest(self) -> bool:
        """The cursor holds the newest step (moving forward onto it rejoins live)."""
        position = self.cursor
        return position is not None and position == len(self.run) - 1

    def cursor_first(self) -> bool:
        return self.cursor_go(0)

    def cursor_live(self) -> bool:
        """Back to live: follow the newest step. True when the cursor was held."""
        before = self.cursor
        self._travel.follow()
        return before is not None
