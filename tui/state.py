"""Everything the panels show, folded from the engine's events (plain Python, no Textual, testable alone)."""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from tokentui.core.events import (
    DoneEvent,
    ErrorEvent,
    Event,
    LoadProgress,
    ModelFacts,
    Notice,
    PrefillEvent,
    PrefillProgress,
    PromptEvent,
    StepEvent,
)

from .format import p95

PLOT_POINTS = 512  # bounded latency history for the plot


@dataclass(slots=True)
class Token:
    """One chosen token as the output panel needs it."""

    text: str
    raw_prob: float
    prob: float
    special: bool
    piece: str


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
    run_id: int = 0
    runs_started: int = 0
    record_path: Path | None = None
    prompt: PromptEvent | None = None
    notices: list[str] = field(default_factory=list)
    prefill: PrefillEvent | None = None
    prefill_started: float | None = None  # time.monotonic() when the prompt went in (the status line's clock)
    prefill_progress: PrefillProgress | None = None  # the latest chunk of a long prompt's prefill, if chunked
    prefill_progress_at: float | None = None  # time.monotonic() when it came
    tokens: list[Token] = field(default_factory=list)
    last_step: StepEvent | None = None
    settings_changed_at: int | None = None  # step number (from 1) at which the latest sampler change took effect
    settings_changes: deque = field(default_factory=lambda: deque(maxlen=CHANGES_KEPT))  # SettingsChange, oldest first
    ttft_ms: float | None = None
    decode_latencies: list[float] = field(default_factory=list)  # decode steps (index >= 1), all of them
    plot_points: deque = field(default_factory=lambda: deque(maxlen=PLOT_POINTS))  # (index, latency ms)
    multi_token_chars: deque = field(default_factory=lambda: deque(maxlen=8))
    kv_tokens: int = 0
    kv_bytes: int = 0
    kv_growth: int = 0  # bytes added by the latest step
    done: DoneEvent | None = None
    error: ErrorEvent | None = None
    error_message: str | None = None

    # ---- run lifecycle -------------------------------------------------------------------------------------
    def start_run(self, run_id: int) -> None:
        """Forget the previous run (the model facts stay)."""
        self.run_id = run_id
        self.runs_started += 1
        self.phase = "starting"
        self.record_path = None
        self.prompt = None
        self.notices = []
        self.prefill = None
        self.prefill_started = None
        self.prefill_progress = None
        self.prefill_progress_at = None
        self.tokens = []
        self.last_step = None
        self.settings_changed_at = None
        self.settings_changes.clear()
        self.ttft_ms = None
        self.decode_latencies = []
        self.plot_points.clear()
        self.multi_token_chars.clear()
        self.kv_tokens = 0
        self.kv_bytes = 0
        self.kv_growth = 0
        self.done = None
        self.error = None
        self.error_message = None

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
        if isinstance(event, StepEvent):
            self._step(event)
        elif isinstance(event, PromptEvent):
            self.prompt = event
            self.phase = "prefill"
            self.prefill_started = time.monotonic()
        elif isinstance(event, PrefillProgress):
            self.prefill_progress = event
            self.prefill_progress_at = time.monotonic()
        elif isinstance(event, PrefillEvent):
            self.prefill = event
            self._kv(event.kv_tokens, event.kv_bytes)
        elif isinstance(event, DoneEvent):
            self.done = event
            self.phase = "done"
            self.ttft_ms = event.ttft_ms or self.ttft_ms
            if event.kv_tokens:
                self._kv(event.kv_tokens, event.kv_bytes, growth=False)
        elif isinstance(event, ErrorEvent):
            self.error = event
            self.error_message = event.message
            self.phase = "error"
        elif isinstance(event, Notice):
            self.notices.append(event.message)
        elif isinstance(event, ModelFacts):
            self.facts = event
        elif isinstance(event, LoadProgress):
            self.load_stage = event.stage
            self.load_fraction = event.fraction

    def _kv(self, tokens: int, nbytes: int, growth: bool = True) -> None:
        if growth and self.kv_bytes:
            self.kv_growth = nbytes - self.kv_bytes
        self.kv_tokens, self.kv_bytes = tokens, nbytes

    def _step(self, step: StepEvent) -> None:
        self.phase = "decoding"
        previous = self.last_step
        self.last_step = step
        self.tokens.append(Token(step.text, step.chosen_raw_prob, step.chosen_prob, step.special, step.piece))
        if step.settings_changed:
            self.settings_changed_at = step.index + 1
            before = previous.settings if previous is not None else {}
            diff = tuple((name, before.get(name), step.settings.get(name)) for name in SETTING_NAMES
                         if before.get(name) != step.settings.get(name))
            if diff:
                self.settings_changes.append(SettingsChange(step.index + 1, diff))
        if step.index == 0:
            self.ttft_ms = step.latency_ms
        else:
            self.decode_latencies.append(step.latency_ms)
            self.plot_points.append((step.index + 1, step.latency_ms))  # step numbers from 1, as shown
        self.multi_token_chars.extend(step.completed_chars)
        self._kv(step.kv_tokens, step.kv_bytes)

    # ---- derived numbers -----------------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        """Model runs so far in this run (prefill counts as one: it scores the first token)."""
        return len(self.tokens)

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
        if self.done is not None:
            return self.done.text
        return "".join(t.text for t in self.tokens)

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

    def latency_stats(self) -> dict[str, float | None]:
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
