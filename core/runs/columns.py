"""A run's steps stored column by column: the storage behind `Run` (core/runs/run.py).

Numbers go in arrays, shared strings are kept once, and each step's candidates, logit lens rows and timing split in
columns of their own: a step with ten candidates takes a fraction of what its objects would, so a 10,000-step run
stays a few MiB (docs/design-record.md, "Columnar steps"; tests/unit/test_run_model.py holds it under 50 MiB).
`StepColumns.get(i)` rebuilds the `StepEvent` appended.
"""

from __future__ import annotations

from array import array
from dataclasses import fields

from .events import Candidate, LensRow, MultiTokenChar, StepEvent, StepTiming
from ..errors import RunError
from ..settings import SamplerSettings

_ARRAY_CODES = {"int": "q", "float": "d", "bool": "b"}  # field annotation -> array type code
# optional numbers: arrays too, None kept as a value such a field never takes (NaN, the smallest int64)
_OPTIONAL_CODES = {"int | None": ("q", -(2**63)), "float | None": ("d", float("nan"))}


class Columns:
    """Instances of a dataclass stored as one column per field: numbers in arrays, strings shared (a run's
    pieces and texts come from a vocabulary, so each distinct one is kept once), anything else in a list.
    Fields named in `skip` are stored elsewhere by the owner."""

    def __init__(self, cls, skip: tuple[str, ...] = ()) -> None:
        self.cls = cls
        self.columns: dict[str, array | list] = {}
        self.bools: set[str] = set()
        self.strings: set[str] = set()
        self.optional: dict[str, int | float] = {}  # field -> the value that stands for None in its array
        for f in fields(cls):
            if f.name in skip:
                continue
            code = _ARRAY_CODES.get(f.type)
            if f.type in _OPTIONAL_CODES:
                code, self.optional[f.name] = _OPTIONAL_CODES[f.type]
            self.columns[f.name] = array(code) if code else []
            if f.type == "bool":
                self.bools.add(f.name)
            elif f.type == "str":
                self.strings.add(f.name)
        self._shared: dict[str, str] = {}

    def append(self, item) -> None:
        added = []
        try:
            for name, column in self.columns.items():
                value = getattr(item, name)
                if name in self.strings and isinstance(value, str):
                    value = self._shared.setdefault(value, value)
                elif value is None and name in self.optional:
                    value = self.optional[name]
                column.append(value)
                added.append(column)
        except (TypeError, OverflowError) as err:
            for column in added:  # all columns stay the same length
                column.pop()
            raise RunError(f"{self.cls.__name__}.{name} = {value!r} cannot be stored: {err}") from None

    def values(self, i: int) -> dict:
        out = {name: column[i] for name, column in self.columns.items()}
        for name in self.bools:
            out[name] = bool(out[name])
        for name, none in self.optional.items():
            if out[name] == none or out[name] != out[name]:  # the int sentinel, or NaN
                out[name] = None
        return out

    def get(self, i: int):
        return self.cls(**self.values(i))

    def slice(self, name: str, start: int = 0, stop: int | None = None) -> list:
        """Column `name` of rows start..stop as plain values (bools as bools, None for an optional number's None)."""
        out = self.columns[name][start:stop]
        if name in self.bools:
            return [bool(v) for v in out]
        if name in self.optional:
            none = self.optional[name]
            return [None if v == none or v != v else v for v in out]
        return out if isinstance(out, list) else out.tolist()


_NO_TIMING = StepTiming(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)  # the row of a step without a timing split


class StepColumns:
    """The steps' columns; candidates (and logit lens rows) flattened into their own columns with each step's
    offset; the timing split in columns of its own, one row per step."""

    def __init__(self) -> None:
        self.scalars = Columns(StepEvent,
                                skip=("index", "candidates", "completed_chars", "settings", "lens", "timing"))
        self.timing = Columns(StepTiming)  # a row per step (zeros where `has_timing` says None)
        self.has_timing = array("b")
        self.candidates = Columns(Candidate)
        self.offsets = array("q", [0])  # step i's candidates are rows offsets[i]:offsets[i + 1]
        self.lens = Columns(LensRow)
        self.lens_offsets = array("q", [0])  # step i's lens rows are lens_offsets[i]:lens_offsets[i + 1]...
        self.has_lens = array("b")  # ...and 0 where its lens is None (not an empty list)
        self.completed: dict[int, tuple[MultiTokenChar, ...]] = {}  # few steps complete a character
        self.settings: list[SamplerSettings] = []  # each run of steps with equal settings once...
        self.settings_at = array("q")  # ...and the one in force at each step
        self._interned: dict[SamplerSettings, SamplerSettings] = {}  # one object per distinct settings value
        self.count = 0
        self.first = 0  # the index of the first step (a branch's steps start at its branch point)

    def append(self, step: StepEvent) -> None:
        settings = step.settings
        if not self.settings or self.settings[-1] != settings:
            # equal settings share one object (a record's reader builds one per line; A, B, A keeps two)
            self.settings.append(self._interned.setdefault(settings, settings))
        cands = list(step.candidates)
        lens = list(step.lens) if step.lens is not None else []
        added: list[Columns] = []  # one entry per row appended, to take back if the step cannot be stored
        try:
            for table, rows in ((self.candidates, cands), (self.lens, lens)):
                for row in rows:
                    table.append(row)
                    added.append(table)
            self.timing.append(step.timing if step.timing is not None else _NO_TIMING)
            added.append(self.timing)
            self.scalars.append(step)
        except RunError:
            for table in added:
                for column in table.columns.values():
                    column.pop()
            raise
        self.offsets.append(self.offsets[-1] + len(cands))
        self.lens_offsets.append(self.lens_offsets[-1] + len(lens))
        self.has_lens.append(step.lens is not None)
        self.has_timing.append(step.timing is not None)
        self.settings_at.append(len(self.settings) - 1)
        if step.completed_chars:
            self.completed[self.count] = tuple(step.completed_chars)
        self.count += 1

    def get(self, i: int) -> StepEvent:
        values = self.scalars.values(i)
        rows = range(self.offsets[i], self.offsets[i + 1])
        lens = None
        if self.has_lens[i]:
            lens = [self.lens.get(r) for r in range(self.lens_offsets[i], self.lens_offsets[i + 1])]
        timing = self.timing.get(i) if self.has_timing[i] else None
        return StepEvent(index=self.first + i, candidates=[self.candidates.get(r) for r in rows],
                         completed_chars=list(self.completed.get(i, ())),
                         settings=self.settings[self.settings_at[i]], lens=lens, timing=timing, **values)
