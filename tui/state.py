"""Everything the panels show, folded from the engine's events (plain Python, no Textual, testable alone)."""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from tokentui.core.events import (
    DoneEvent,
    ErrorEvent,
    Event,
    LoadProgress,
    ModelFacts,
    MultiTokenChar,
    PrefillEvent,
    PrefillProgress,
    PromptEvent,
    StepEvent,
)
from tokentui.core.run import Cursor, Run

from .format import p95

PLOT_POINTS = 512  # the latency plot's window (steps)
MULTI_TOKEN_CHARS_SHOWN = 8  # the latest characters that came over several tokens


@dataclass(slots=True)
class Token:
    """One chosen token as the output panel needs it."""

    text: str
    raw_prob: float
    prob: float
    special: bool
    piece: str


class Tokens(Sequence):
    """The run's chosen tokens as `Token`s, made when asked for (the run holds the one copy)."""

    def __init__(self, run: Run) -> None:
        self._run = run

    def __len__(self) -> int:
        return len(self._run)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, stride = key.indices(len(self._run))
            if stride != 1:
                return [self[i] for i in range(start, stop, stride)]
            columns = [self._run.values(name, start, stop)
                       for name in ("text", "chosen_raw_prob", "chosen_prob", "special", "piece")]
            return [Token(*values) for values in zip(*columns)]
        step = self._run.step(key)
        return Token(step.text, step.chosen_raw_prob, step.chosen_prob, step.special, step.piece)


SETTING_NAMES = ("temperature", "top_k", "top_p", "greedy", "seed")
CHANGES_KEPT = 6  # sampler changes remembered per run (the sampler panel lists the latest)


@dataclass(frozen=True, slots=True)
class SettingsChange:
    """Sampler settings that changed, and the step (numbered from 1, as the panels show it) that first used them."""

    step: int
    changes: tuple[tuple[str, object, object], ...]  # (setting, old value, new value), in SETTING_NAMES order


@dataclass
class RunState:
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
    run: Run = field(default_factory=Run)  # the current run: prompt, prefill, every step, the end (core/run.py)
    prefill_started: float | None = None  # time.monotonic() when the prompt went in (the status line's clock)
    prefill_progress: PrefillProgress | None = None  # the latest chunk of a long prompt's prefill, if chunked
    prefill_progress_at: float | None = None  # time.monotonic() when it came
    settings_changed_at: int | None = None  # step number (from 1) at which the latest sampler change took effect
    settings_changes: deque = field(default_factory=lambda: deque(maxlen=CHANGES_KEPT))  # SettingsChange, oldest first
    ttft_ms: float | None = None
    kv_tokens: int = 0
    kv_bytes: int = 0
    kv_growth: int = 0  # bytes added by the latest step
    error_message: str | None = None
    # the time-travel cursor over the run's steps (core/run.py's Cursor: following the newest step, or held at
    # one); read it through `cursor` / `view_step`, move it with the cursor_* methods below
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
            self.phase = "done"
            self.ttft_ms = event.ttft_ms or self.ttft_ms
            if event.kv_tokens:
                self._kv(event.kv_tokens, event.kv_bytes, growth=False)
        elif isinstance(event, ErrorEvent):
            self.error_message = event.message
            self.phase = "error"
        elif isinstance(event, ModelFacts):
            self.facts = event

    def _kv(self, tokens: int, nbytes: int, growth: bool = True) -> None:
        if growth and self.kv_bytes:
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
        if step.index == self.own_from:  # the run's first own token (a branch's: the forced one)
            self.ttft_ms = step.latency_ms
        self._kv(step.kv_tokens, step.kv_bytes)

    # ---- the run's parts, read from the run (one copy of each) ----------------------------------------------
    @property
    def prompt(self) -> PromptEvent | None:
        return self.run.prompt

    @property
    def prefill(self) -> PrefillEvent | None:
        return self.run.prefill

    @property
    def notices(self) -> list[str]:
        return [notice.message for notice in self.run.notices]

    @property
    def last_step(self) -> StepEvent | None:
        return self.run.last

    @property
    def done(self) -> DoneEvent | None:
        return self.run.done

    @property
    def error(self) -> ErrorEvent | None:
        return self.run.error

    @property
    def tokens(self) -> "Tokens":
        """The chosen tokens as the output panel needs them (built on demand from the run)."""
        return Tokens(self.run)

    @property
    def decode_latencies(self) -> list[float]:
        """Latencies of the run's own decode steps (after its first own token), all of them."""
        return self.run.values("latency_ms", self.own_from + 1)

    @property
    def plot_points(self) -> list[tuple[int, float]]:
        """(step number from 1, latency ms) of the latest PLOT_POINTS decode steps: the plot's bounded window."""
        return self.latency_points(max(1, len(self.run) - PLOT_POINTS), len(self.run))

    def latency_points(self, start: int, stop: int) -> list[tuple[int, float]]:
        """(step number from 1, latency ms) of the decode steps at positions start..stop (position 0, the step
        prefill scored, is never plotted)."""
        start, stop = max(1, start), min(len(self.run), stop)
        if stop <= start:
            return []
        first = self.run.offset + start + 1
        return list(zip(range(first, first + stop - start), self.run.values("latency_ms", start, stop)))

    @property
    def multi_token_chars(self) -> list[MultiTokenChar]:
        return self.run.completed_chars(last=MULTI_TOKEN_CHARS_SHOWN)

    # ---- derived numbers -----------------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        """Model runs so far in this run (prefill counts as one: it scores the first token)."""
        return len(self.run)

    @property
    def model_runs(self) -> int:
        return self.done.runs if self.done else self.steps

    @property
    def scores(self) -> int:
        if self.done:
            return self.done.scores
        return self.model_runs * (self.facts.vocab_rows if self.facts else 0)

    @property
    def answer_text(self) -> str:
        return self.run.text

    @property
    def pending(self) -> tuple[str, int]:
        """(hex bytes, bytes still needed) of an incomplete character after the latest step."""
        if self.last_step is None or self.phase in ("done",):
            return "", 0
        return self.last_step.pending_hex, self.last_step.pending_needed

    @property
    def dropped(self) -> tuple[str, str]:
        """(hex bytes, why) of an incomplete character the run ended on: held, never completed, and dropped from
        the answer (not shown as U+FFFD). ("", "") when there was none."""
        done = self.done
        hex_ = getattr(done, "dropped_hex", "") if done is not None else ""
        if not hex_:
            return "", ""
        why = {"length": "at the length limit", "context": "at the full context", "stopped": "when the run stopped",
               "eos": "at the end token"}.get(done.reason, "at the end of the run")
        return hex_, f"incomplete character {why}"

    @property
    def decode_steps(self) -> int:
        """How many decode steps (index >= 1) the run has taken."""
        return max(0, len(self.run) - 1)

    def latency_stats(self) -> dict[str, float | None]:
        """Last, mean, median, p95 and tok/s over the whole run. Two panels ask at every repaint; the sorts behind
        median and p95 are done once per new step (or end), not once per panel per frame."""
        key = (id(self.run), len(self.run), self.done)
        cached = self.__dict__.get("_latency_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        stats = self._latency_stats()
        self.__dict__["_latency_cache"] = (key, stats)
        return stats

    def _latency_stats(self) -> dict[str, float | None]:
        lat = self.decode_latencies
        mean = sum(lat) / len(lat) if lat else None
        tok_s = (1000.0 / mean) if mean else None
        if self.done is not None and self.done.decode_tok_s:
            tok_s = self.done.decode_tok_s
        return {
            "last": lat[-1] if lat else None,
            "mean": mean,
            "median": statistics.median(lat) if lat else None,  # whole run, like p95 (the plot shows a window)
            "p95": p95(lat),
            "tok_s": tok_s,
        }

    # ---- time travel: the cursor over the steps ------------------------------------------------------------
    # One cursor per run (core/run.py's Cursor): following the newest step (live, the default) or held at a past
    # step. Every panel reads the step it shows through `view_step` and the readings "as of" it below, so a held
    # cursor shows that step as it was while the run goes on underneath. Positions are the run's (0 = its first
    # step); the panels number steps from 1 by `step.index + 1`.
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

    @property
    def view_step(self) -> StepEvent | None:
        """The step every panel shows: the cursor's, or the newest while live. A past step is rebuilt from the
        run's columns once per cursor position (not once per panel)."""
        position = self.cursor
        if position is None:
            return self.run.last
        key = (id(self.run), position)
        cached = self.__dict__.get("_view_cache")
        if cached is not None and cached[0] == key and cached[2] is self.run:
            return cached[1]
        step = self.run.step(position)
        self.__dict__["_view_cache"] = (key, step, self.run)
        return step

    @property
    def step_total(self) -> int:
        """The number (from 1) of the newest step: "viewing step 37 of 120"."""
        return self.run.offset + len(self.run)

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

    def cursor_first(self) -> bool:
        return self.cursor_go(0)

    def cursor_live(self) -> bool:
        """Back to live: follow the newest step. True when the cursor was held."""
        before = self.cursor
        self._travel.follow()
        return before is not None

    # the readings as of the viewed step (while live: the run's latest, exactly as before)
    @property
    def view_kv(self) -> tuple[int, int, int]:
        """(tokens, bytes, bytes the step added) in the KV cache after the viewed step."""
        position = self.cursor
        if position is None:
            return self.kv_tokens, self.kv_bytes, self.kv_growth
        step = self.view_step
        if position > 0:
            before = self.run.values("kv_bytes", position - 1, position)[0]
        else:
            before = self.prefill.kv_bytes if self.prefill is not None else 0
        return step.kv_tokens, step.kv_bytes, (step.kv_bytes - before) if before else 0

    @property
    def view_pending(self) -> tuple[str, int]:
        """(hex bytes, bytes still needed) of an incomplete character held after the viewed step."""
        if self.cursor is None:
            return self.pending
        step = self.view_step
        return step.pending_hex, step.pending_needed

    @property
    def view_dropped(self) -> tuple[str, str]:
        """The incomplete character the run ended on: only at the end (live), never at a past step."""
        return self.dropped if self.cursor is None else ("", "")

    @property
    def view_latency(self) -> float | None:
        step = self.view_step
        return step.latency_ms if step is not None else None

    @property
    def view_multi_token_chars(self) -> list[MultiTokenChar]:
        """The latest characters that came over several tokens, as of the viewed step."""
        position = self.cursor
        if position is None:
            return self.multi_token_chars
        completed = getattr(getattr(self.run, "_steps", None), "completed", None)  # {position: chars}
        if completed is None:
            return []
        chars: list[MultiTokenChar] = []
        for at in sorted((at for at in completed if at <= position), reverse=True):
            chars[:0] = completed[at]
            if len(chars) >= MULTI_TOKEN_CHARS_SHOWN:
                break
        return chars[-MULTI_TOKEN_CHARS_SHOWN:]
