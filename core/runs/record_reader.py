"""Reading a run record back: JSON lines (core/runs/record_writer.py's, or `--headless --json` output) into typed events.

Fields a newer schema added are ignored (the schema only ever adds fields); a field this version needs but the
line lacks, a value of the wrong type, an unknown event, a line that is not JSON: RecordError, one line naming the
file and the line. A step's `settings` object is read the same way, as a SamplerSettings: keys it does not know are
ignored, a missing one takes its default, and a value of the wrong type or out of range (SettingsError, e.g. top_p
1.5) refuses the record. Only the last line may be cut short (a crash mid-write): the record is then read up to the
last whole line and the run's `cut_line` says so.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from pathlib import Path

from ..errors import ErrorKind, RecordError, RunError
from .events import (
    BranchEvent,
    Candidate,
    DoneEvent,
    ErrorEvent,
    Event,
    FanoutEvent,
    LensRow,
    LoadProgress,
    ModelFacts,
    MultiTokenChar,
    Notice,
    PrefillEvent,
    PrefillProgress,
    PromptEvent,
    PromptPiece,
    SampleEvent,
    ScoredToken,
    ScoreEvent,
    ScoreSummary,
    StepEvent,
    ServerFacts,
    StepTiming,
)
from ..settings import SamplerSettings
from .architecture import BlockGroup, KVGroup, ModelAnatomy

EVENT_TYPES: dict[str, type] = {cls.event: cls for cls in (
    LoadProgress, ModelFacts, Notice, PromptEvent, PrefillProgress, PrefillEvent, StepEvent, DoneEvent, ErrorEvent,
    BranchEvent, ScoreEvent, ScoreSummary, FanoutEvent, SampleEvent)}
NESTED: dict[str, type] = {"PromptPiece": PromptPiece, "Candidate": Candidate, "MultiTokenChar": MultiTokenChar,
                           "LensRow": LensRow, "SamplerSettings": SamplerSettings, "StepTiming": StepTiming,
          "ServerFacts": ServerFacts, "KVGroup": KVGroup, "BlockGroup": BlockGroup, "ModelAnatomy": ModelAnatomy,
          "ScoredToken": ScoredToken}
_SCALARS = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "dict": (dict,)}


def _value(value, annotation: str, where: str):
    """`value` checked against a field annotation such as "int", "float | None", "list[Candidate]"."""
    if value is None and annotation.endswith(" | None"):
        return None
    annotation = annotation.removesuffix(" | None")
    if annotation.startswith("list[") and annotation.endswith("]"):
        if not isinstance(value, list):
            raise ValueError(f"{where} should be a list, got {type(value).__name__}")
        inner = annotation[5:-1]
        return [_value(v, inner, f"{where}[{n}]") for n, v in enumerate(value)]
    if annotation in NESTED:
        return build(NESTED[annotation], value, where)
    if annotation == "ErrorKind":
        if not isinstance(value, str):
            raise ValueError(f"{where} should be an error kind, got {json.dumps(value, ensure_ascii=False)[:40]}")
        return ErrorKind.of(value)  # an older record's class name, or a newer kind: read, never refused
    kinds = _SCALARS.get(annotation)
    if kinds is None:
        return value  # an annotation this reader does not check
    if not isinstance(value, kinds) or (isinstance(value, bool) and annotation in ("int", "float")):
        raise ValueError(f"{where} should be {annotation}, got {json.dumps(value, ensure_ascii=False)[:40]}")
    return float(value) if annotation == "float" else value


def build(cls: type, data, where: str):
    """An instance of dataclass `cls` from a JSON object: unknown keys ignored, types checked."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} should be an object")
    values = {}
    missing = []
    for f in fields(cls):
        if f.name in data:
            values[f.name] = _value(data[f.name], f.type, f"{where}.{f.name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            missing.append(f.name)
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)} (a schema this version cannot read)")
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None


def event_from_dict(data) -> Event:
    """One record line's object as its typed event; ValueError (one line) when it is not one."""
    if not isinstance(data, dict):
        raise ValueError("it is not a JSON object")
    name = data.get("event")
    if not isinstance(name, str):
        raise ValueError("it has no event name")
    cls = EVENT_TYPES.get(name)
    if cls is None:
        raise ValueError(f"unknown event {name!r} (from a newer tokentui?)")
    return build(cls, data, name)


def read_lines(path: Path) -> tuple[list[tuple[int, Event]], int | None]:
    """(line number, event) for each whole line, and the number of a last line cut short (None if none)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise RecordError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise RecordError(f"{path}: is a folder, not a run record") from None
    except OSError as err:
        raise RecordError(f"{path}: {err.strerror or err}") from None
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    events: list[tuple[int, Event]] = []
    cut = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            if number == len(lines) and events:  # a crash mid-write: keep what came before
                cut = number
                break
            raise RecordError(f"{path}: line {number} is not JSON: not a tokentui run record") from None
        try:
            events.append((number, event_from_dict(data)))
        except ValueError as err:
            raise RecordError(f"{path}: line {number}: {err}") from None
    return events, cut


def read_run(path: str | Path, run_class):
    """The run a record holds (`Run.from_record`): one run, its `model` event first."""
    path = Path(path)
    events, cut = read_lines(path)
    run = run_class()
    run.record_path, run.cut_line = path, cut
    started = False
    for number, event in events:
        where = f"{path}: line {number}"
        if isinstance(event, LoadProgress) and not started:
            continue  # `--headless --json` output: loading, before the model event
        if not started:
            if not isinstance(event, ModelFacts):
                raise RecordError(f"{path}: not a tokentui run record (line {number} is a {event.event!r} event, "
                                  "not the model event a record starts with)")
            started = True
        elif isinstance(event, ModelFacts):
            raise RecordError(f"{where}: a second model event (a record holds one run)")
        elif run.end is not None and not (isinstance(run.end, ErrorEvent) and isinstance(event, DoneEvent)):
            raise RecordError(f"{where}: a {event.event!r} event after the run's end")
        elif isinstance(event, PromptEvent) and run.prompt is not None:
            raise RecordError(f"{where}: a second prompt event (a record holds one run)")
        try:
            run.apply(event)
        except RunError as err:
            raise RecordError(f"{where}: {err}") from None
    if not started:
        raise RecordError(f"{path}: not a tokentui run record (no model event)")
    if run.prompt is None and run.branch is None and run.fanout is None and run.end is None:  # a branch's (or a
        # fan-out's) record may have no prompt
        raise RecordError(f"{path}: not a tokentui run record (no prompt event)" if cut is None else
                          f"{path}: the record was cut before its prompt (line {cut}): nothing to replay")
    return run
