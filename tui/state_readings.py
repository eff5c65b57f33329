"""What the panels read from a run's state: the figures computed from the run's steps, live or as of the step in view.

tui/state.py's `RunState` holds the dashboard's model (the loaded model, the current run, the session's totals, the
time-travel cursor) and changes it: it folds the engine's events in and moves the cursor. This module is the other
half, the readings: `RunReadings`, a mixin RunState inherits, computes every figure the panels show from what the
state holds and changes none of it (its only writes are its own caches). The seam is write / read: the fields
and the code that writes them stay in tui/state.py; what is only read (the run's parts, the speed and latency
statistics, the KV figures, a served model's readings such as server_kv and the re-issued steps, the step in view
and every reading "as of" it) is here.

The mixin declares no fields (RunState is a dataclass; its fields are all declared there): it reads `run`, `facts`,
`own_from`, `phase`, `kv_tokens`, `kv_bytes`, `kv_growth`, `server_kv` and the cursor (`cursor`) off the instance.
Its caches (the latency statistics, the step in view, the rate as of it) live in the instance's `__dict__`, outside
the dataclass's fields, so they take no part in its `__init__`, `repr` or `==`. Plain Python, no Textual, testable
alone.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from tokentui.core.runs.events import DoneEvent, ErrorEvent, MultiTokenChar, PrefillEvent, PromptEvent, StepEvent
from tokentui.core.runs.run import Run

from .format import p95

PLOT_POINTS = 512  # the latency plot's window (steps)
MULTI_TOKEN_CHARS_SHOWN = 8  # the latest characters that came over several tokens


@dataclass(slots=True)
class Token:
    """One chosen token as the output panel needs it."""

    text: str
    raw_prob: float | None  # None: not reported (a served model gives one of the two)
    prob: float | None
    special: bool
    piece: str

    @property
    def heat_prob(self) -> float | None:
        """The probability the heat map colours the token by: the raw one (a served model's only one when the
        server gives no raw probability; None: it reported neither)."""
        return self.raw_prob if self.raw_prob is not None else self.prob


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


class RunReadings:
    """The readings of a `RunState` (tui/state.py), computed from the run and the state's fields; see the module's
    docstring for what it reads."""

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
        """Latencies of the run's own decode steps (after its first own token), all of them; a served model's
        merged steps (tokens that arrived with the next one, latency 0 by arrival) are left out: no latency of their
        own was measured."""
        start = self.own_from + 1
        lat = self.run.values("latency_ms", start)
        merged = self.run.values("merged", start)
        return [ms for ms, m in zip(lat, merged) if not m] if any(merged) else lat

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

    def reissue_steps(self, start: int, stop: int) -> list[int]:
        """Step numbers (from 1) of the steps at positions start..stop that began a request re-issued from the
        prefix (a served model)."""
        start, stop = max(0, start), min(len(self.run), stop)
        if stop <= start:
            return []
        first = self.run.offset + start + 1
        return [first + n for n, ttft in enumerate(self.run.values("reissue_ttft_ms", start, stop))
                if ttft is not None]

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
    def scores(self) -> int | None:
        """Scores computed (vocab rows × model runs); None when the vocabulary's size is not known (a served
        model whose server does not report it)."""
        if self.done:
            return self.done.scores
        rows = self.facts.vocab_rows if self.facts else 0
        return None if rows is None else self.model_runs * rows

    @property
    def inherited_text(self) -> str:
        """The answer's text before this run's first step that no step here holds: a branch played back alone (its
        run starts at its branch point; the text its record carries for the steps before). "" otherwise."""
        branch = self.run.branch
        return branch.prefix_text if branch is not None else ""

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

    # ---- time travel: the step in view and the readings as of it ---------------------------------------------
    # The cursor itself (where it is, how it moves) is RunState's (tui/state.py). Every panel reads the step it shows
    # through `view_step` and the readings "as of" it below, so a held cursor shows that step as it was while the
    # run goes on underneath.
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
    def own_tokens(self) -> int:
        """The tokens this run chose itself (a branch's: from its branch point on, the forced one included)."""
        return len(self.run) - self.own_from

    @property
    def total_tokens(self) -> int:
        """Its answer's tokens from the prompt on (a branch's: the parent's before the branch point too)."""
        return self.run.offset + len(self.run)

    @property
    def step_total(self) -> int:
        """The number (from 1) of the newest step: "viewing step 37 of 120"."""
        return self.run.offset + len(self.run)

    # the readings as of the viewed step (while live: the run's latest, exactly as before)
    @property
    def view_kv(self) -> tuple[int, int | None, int]:
        """(tokens, bytes, bytes the step added) in the KV cache after the viewed step (bytes None: not reported,
        a served model; the growth is then 0)."""
        position = self.cursor
        if position is None:
            return self.kv_tokens, self.kv_bytes, self.kv_growth
        step = self.view_step
        if position > 0:
            before = self.run.values("kv_bytes", position - 1, position)[0]
        else:
            before = self.prefill.kv_bytes if self.prefill is not None else 0
        growth = (step.kv_bytes - before) if before and step.kv_bytes is not None else 0
        return step.kv_tokens, step.kv_bytes, growth

    @property
    def view_server_kv(self) -> tuple[float, int] | None:
        """A served model: the latest KV cache use its server reported as of the viewed step, (fraction, position
        of the step it came with); None when it reported none by then."""
        position = self.cursor
        latest = self.server_kv
        if position is None or latest is None:  # live, or the run has no report at all
            return latest if position is None else None
        if latest[1] <= position:
            return latest
        stop = position + 1
        while stop > 0:  # back from the viewed step, a window at a time
            start = max(0, stop - 256)
            values = self.run.values("server_kv_usage", start, stop)
            for offset in range(len(values) - 1, -1, -1):
                if values[offset] is not None:
                    return values[offset], start + offset
            stop = start
        return None

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
    def view_scored_by_prefill(self) -> bool:
        """The step in view was scored by a prefill — the run's first (a branch's: its first own one, after its
        KV cache was cut back) — so its latency is a time to first token, not a decode step's."""
        position = self.view_index
        return position is not None and position in (0, self.own_from)

    def decode_latencies_upto(self, position: int) -> list[float]:
        """The run's own decode steps' latencies up to the step at `position` (merged steps left out, as in
        `decode_latencies`)."""
        start, stop = self.own_from + 1, position + 1
        if stop <= start:
            return []
        lat = self.run.values("latency_ms", start, stop)
        merged = self.run.values("merged", start, stop)
        return [ms for ms, m in zip(lat, merged) if not m] if any(merged) else lat

    @property
    def view_tok_s(self) -> float | None:
        """Decode tokens per second as of the step in view: live, the run's (`latency_stats`); at a past step, its
        rate up to that step (1000 / the mean latency of its decode steps so far), as it read then."""
        position = self.cursor
        if position is None:
            return self.latency_stats()["tok_s"]
        key = (id(self.run), position)
        cached = self.__dict__.get("_view_rate_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        lat = self.decode_latencies_upto(position)
        rate = 1000.0 * len(lat) / sum(lat) if lat and sum(lat) > 0 else None
        self.__dict__["_view_rate_cache"] = (key, rate)
        return rate

    @property
    def view_multi_token_chars(self) -> list[MultiTokenChar]:
        """The latest characters that came over several tokens, as of the viewed step."""
        position = self.cursor
        if position is None:
            return self.multi_token_chars
        return self.run.completed_chars(last=MULTI_TOKEN_CHARS_SHOWN, upto=position)
