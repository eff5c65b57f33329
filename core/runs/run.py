"""The run model: everything one run reported, in order, as one navigable object.

A `Run` is built by folding the engine's events (`run.apply(event)`), read back from a run record
(`Run.from_record(path)`, core/runs/record_reader.py) and written to one (`run.save(path)`). It holds the model facts,
notices, the prompt, the prefill (and its progress), every step and the end (done or error); `len(run)`,
`run[i]` / `run.step(i)`, `run[a:b]`, `run.first`, `run.last` and a `Cursor` navigate the steps.

Steps are stored column by column (core/runs/columns.py: arrays of numbers, shared strings), not as one object
each: a step with ten candidates takes a fraction of what its objects would, so a 10,000-step run stays a few MiB
(docs/design-record.md, "Columnar steps"; tests/unit/test_run_model.py holds it under 50 MiB). `run[i]` rebuilds the
`StepEvent` (equal to the one applied); the latest one applied is kept as it came.

A branch run (core/model/branch.py: `Engine.branch`, `tokentui branch`) starts with a `branch` event and its steps start
at the branch point's index: `run.branch` holds that event, `run.offset` the index (0 for a plain run). Navigation
stays by position: `len(run)` counts the steps this run reported, and `run[i]` (a Cursor's index too) is the i-th
of them, whose `.index` is `run.offset + i`. The steps before the offset are the parent's: the branch event holds
their token ids (`tokens`) and text (`prefix_text`), and `run.text` includes that text.

A scored text (core/model/scoring.py) is a run like any other whose steps are all forced: `run.score` holds its
`score` event and `run.score_summary` its figures. A fan-out (core/model/fanout.py) has no steps: `run.fanout`
holds its `fanout` event and `run.samples` its samples, in the order they came. A turn of a conversation
(core/runs/turns.py: a follow-up, a raw run) is a run whose `run.turn` holds its `turn` event (the messages).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from .columns import StepColumns
from .events import (
    BranchEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    FanoutProgress,
    LoadProgress,
    MultiTokenChar,
    Notice,
    PrefillEvent,
    PrefillProgress,
    PromptEvent,
    StepEvent,
)
from .explore_events import (
    FanoutEvent,
    SampleEvent,
    ScoreEvent,
    ScoreSummary,
)
from .facts import ModelFacts
from .turns import TurnEvent
from ..errors import RunError


class Run:
    """One run, as reported: see the module docstring. `apply` is the only way in (events in engine order)."""

    def __init__(self, facts: ModelFacts | None = None) -> None:
        self.facts: ModelFacts | None = None
        self.prompt: PromptEvent | None = None
        self.prefill: PrefillEvent | None = None
        self.prefill_progress: list[PrefillProgress] = []
        self.notices: list[Notice] = []
        self.end: DoneEvent | ErrorEvent | None = None  # the last `done` (an older record: `error` without one)
        self._error: ErrorEvent | None = None
        self.branch: BranchEvent | None = None  # set for a branch run (see the module docstring)
        self.score: ScoreEvent | None = None  # set for a scored text
        self.score_summary: ScoreSummary | None = None
        self.fanout: FanoutEvent | None = None  # set for a fan-out (which has samples, not steps)
        self.samples: list[SampleEvent] = []
        self.turn: TurnEvent | None = None  # set for a turn of a conversation (core/runs/turns.py)
        self._others: list[tuple[int, Event]] = []  # every non-step event, after how many steps it came
        self._steps = StepColumns()
        self._last: StepEvent | None = None
        # set by `from_record`: the file, and the line a record cut short ends in (None: every line whole)
        self.record_path: Path | None = None
        self.cut_line: int | None = None
        if facts is not None:
            self.apply(facts)

    # ---- folding events ------------------------------------------------------------------------------------
    def apply(self, event: Event) -> None:
        """Add one event. A step must be the next one (index == offset + len(run)), else RunError; a `branch`
        event must come before any step, once; a later `done` replaces an earlier one (the end is whatever the run
        last said)."""
        if isinstance(event, StepEvent):
            if self.fanout is not None:
                raise RunError("a fan-out has samples, not steps")
            if event.index != self.offset + len(self):
                raise RunError(f"step {event.index} cannot follow {len(self)} step(s)"
                               + (f" from index {self.offset}" if self.offset else ""))
            self._steps.append(event)
            self._last = event
            return
        if isinstance(event, ModelFacts):
            self.facts = event
        elif isinstance(event, Notice):
            self.notices.append(event)
        elif isinstance(event, PromptEvent):
            self.prompt = event
        elif isinstance(event, PrefillProgress):
            self.prefill_progress.append(event)
        elif isinstance(event, PrefillEvent):
            self.prefill = event
        elif isinstance(event, ErrorEvent):
            self._error = event
            self.end = event  # until its `done` follows it
        elif isinstance(event, DoneEvent):
            self.end = event
        elif isinstance(event, BranchEvent):
            if self.branch is not None or len(self):
                raise RunError("a branch event must come once, before the run's steps")
            self.branch = event
            self._steps.first = event.at
        elif isinstance(event, ScoreEvent):
            if self.score is not None or len(self):
                raise RunError("a score event must come once, before the run's steps")
            self.score = event
        elif isinstance(event, ScoreSummary):
            self.score_summary = event
        elif isinstance(event, FanoutEvent):
            if self.fanout is not None or len(self) or self.branch is not None:
                raise RunError("a fanout event must come once, in a run of no steps")
            self.fanout = event
        elif isinstance(event, SampleEvent):
            if self.fanout is None or len(self):
                raise RunError("a sample must follow its fanout event")
            self.samples.append(event)
        elif isinstance(event, TurnEvent):
            if self.turn is not None or len(self) or self.branch is not None or self.fanout is not None:
                raise RunError("a turn event must come once, before the run's steps")
            self.turn = event
        elif not isinstance(event, (LoadProgress, FanoutProgress)):  # progress: no field of its own
            raise RunError(f"a run has no place for a {type(event).__name__}")
        self._others.append((len(self), event))

    # ---- the end -------------------------------------------------------------------------------------------
    @property
    def done(self) -> DoneEvent | None:
        return self.end if isinstance(self.end, DoneEvent) else None

    @property
    def error(self) -> ErrorEvent | None:
        """The error the run failed with (its `done`, reason "error", follows it)."""
        return self._error

    @property
    def ended(self) -> bool:
        return self.end is not None

    # ---- the steps -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._steps.count

    def __getitem__(self, key: int | slice):
        if isinstance(key, slice):
            return [self.step(i) for i in range(*key.indices(len(self)))]
        return self.step(key)

    def __iter__(self) -> Iterator[StepEvent]:
        for i in range(len(self)):
            yield self.step(i)

    def step(self, i: int) -> StepEvent:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"step {i} is not in this run of {n} step(s)")
        if i == n - 1 and self._last is not None:
            return self._last
        return self._steps.get(i)

    @property
    def first(self) -> StepEvent | None:
        return self.step(0) if len(self) else None

    @property
    def last(self) -> StepEvent | None:
        return self._last

    def values(self, name: str, start: int = 0, stop: int | None = None) -> list:
        """One number or string field of steps start..stop (e.g. "latency_ms", "text", "timing.forward_ms": None
        for a step without a timing split), without rebuilding them."""
        if name == "index":
            return list(range(self.offset, self.offset + len(self)))[start:stop]
        if name.startswith("timing."):
            out = self._steps.timing.slice(name.removeprefix("timing."), start, stop)
            return [v if has else None for v, has in zip(out, self._steps.has_timing[start:stop])]
        return self._steps.scalars.slice(name, start, stop)

    def completed_chars(self, last: int | None = None, upto: int | None = None) -> list[MultiTokenChar]:
        """Characters whose bytes came over several tokens, oldest first (`last`: only the latest so many; `upto`:
        only those completed by the step at that position or before it)."""
        chars: list[MultiTokenChar] = []
        for index in reversed(self._steps.completed):
            if last is not None and len(chars) >= last:
                break
            if upto is None or index <= upto:
                chars[:0] = self._steps.completed[index]
        return chars if last is None else chars[max(0, len(chars) - last):]

    @property
    def text(self) -> str:
        """The answer so far: the texts the steps completed, after a branch's prefix text (the end's own `text`
        once there is one)."""
        if self.done is not None:
            return self.done.text
        prefix = self.branch.prefix_text if self.branch is not None else ""
        return prefix + "".join(self._steps.scalars.columns["text"])

    @property
    def offset(self) -> int:
        """The index of this run's first step: a branch's branch point, 0 for a plain run."""
        return self.branch.at if self.branch is not None else 0

    def cursor(self, index: int | None = None) -> "Cursor":
        return Cursor(self, index)

    # ---- in order ------------------------------------------------------------------------------------------
    def events(self) -> Iterator[Event]:
        """Every event applied, in the order it came (steps rebuilt one at a time)."""
        step = 0
        for before, event in self._others:
            while step < before:
                yield self.step(step)
                step += 1
            yield event
        while step < len(self):
            yield self.step(step)
            step += 1

    def save(self, path: str | Path) -> Path:
        """Write the run as a record (the `model` event first, then the run's events); never overwrites."""
        import json

        from ..paths import open_private

        path = Path(path)
        with open_private(path) as fh:  # 0600: a record holds a prompt and its answer
            for event in self.events():
                fh.write(json.dumps(event.to_dict(), ensure_ascii=False) + "\n")
        return path

    @classmethod
    def from_record(cls, path: str | Path) -> "Run":
        """Read a record (dashboard, `--record-dir` or `--headless --json` output); RecordError when it is not
        one. A record cut short is read up to its last whole line, and `cut_line` says where it was cut."""
        from .record_reader import read_run

        return read_run(path, cls)

    @property
    def record_notice(self) -> str | None:
        """What to tell a reader of a record that ends early (None: the record is whole)."""
        if self.cut_line is not None:
            return f"the record ends early (cut at line {self.cut_line})"
        if self.record_path is not None and self.end is None:
            return "the record ends early (no done or error event)"
        return None


class Cursor:
    """A place in a run: one step, or following the latest (`index` None). Panels read `cursor.step`."""

    def __init__(self, run: Run, index: int | None = None) -> None:
        self.run = run
        self._index: int | None = None
        if index is not None:
            self.go(index)

    @property
    def following(self) -> bool:
        return self._index is None

    @property
    def index(self) -> int | None:
        """The step shown (None while the run has none)."""
        if self._index is None:
            return len(self.run) - 1 if len(self.run) else None
        return self._index

    @property
    def step(self) -> StepEvent | None:
        index = self.index
        return None if index is None else self.run.step(index)

    def go(self, index: int) -> int | None:
        """Hold at `index`, clamped to the run's steps (first..last); None while the run has no step."""
        n = len(self.run)
        if n == 0:
            self._index = None
            return None
        self._index = min(max(0, index), n - 1)
        return self._index

    def move(self, delta: int) -> int | None:
        current = self.index
        return None if current is None else self.go(current + delta)

    def follow(self) -> None:
        self._index = None

    @property
    def at_first(self) -> bool:
        return self.index in (None, 0)

    @property
    def at_last(self) -> bool:
        index = self.index
        return index is None or index == len(self.run) - 1
