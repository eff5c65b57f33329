"""Reading a run record back: JSON lines (core/runs/record_writer.py's, or `--headless --json` output) into typed events.

Fields a newer schema added are ignored (the schema only ever adds fields); a field this version needs but the
line lacks, a value of the wrong type, an unknown event, a line that is not JSON: RecordError, one line naming the
file and the line. A step's `settings` object is read the same way, as a SamplerSettings: keys it does not know are
ignored, a missing one takes its default, and a value of the wrong type or out of range (SettingsError, e.g. min_p
1.5) refuses the record. Only the last line may be cut short (a crash mid-write): the record is then read up to the
last whole line and the run's `cut_line` says so.

A record is outside input (a shared file, a hand-edited one): it is read a line at a time, no line longer than
MAX_LINE_BYTES; each line is strict JSON (core/strict_json.py: no NaN / Infinity, nothing nested past the recursion
limit); integers must fit 64 bits and numbers be finite (1e400 reads as infinity: refused), token ids 0..2^31-1
(and below the model's `vocab_rows`, when the record gives it: 1..2^31, 0 or null for not known), probabilities
0..1, a step's or a prefill's times 0 ms to a day (`MAX_DURATION_MS`: a replay waits them out) and other times >= 0
(`_RANGES`). Whatever is wrong is one RecordError line naming the file and the line, never another exception.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Iterator

from ..errors import ErrorKind, RecordError, RunError
from ..strict_json import loads as strict_loads
from .events import (
    BranchEvent,
    Candidate,
    DoneEvent,
    ErrorEvent,
    Event,
    FanoutProgress,
    LensRow,
    LoadProgress,
    MultiTokenChar,
    Notice,
    PrefillEvent,
    PrefillProgress,
    PromptEvent,
    PromptPiece,
    StepEvent,
    StepTiming,
)
from .explore_events import (
    FanoutEvent,
    SampleEvent,
    ScoredToken,
    ScoreEvent,
    ScoreSummary,
)
from .facts import ModelFacts, QuantFacts, ServerFacts
from .turns import Message, TurnEvent
from ..settings import SamplerSettings
from .architecture import BlockGroup, KVGroup, ModelAnatomy
from .attention import LayerAttention, SublayerRow
from .truths import ModelTruths

EVENT_TYPES: dict[str, type] = {cls.event: cls for cls in (
    LoadProgress, ModelFacts, Notice, PromptEvent, PrefillProgress, PrefillEvent, StepEvent, DoneEvent, ErrorEvent,
    BranchEvent, ScoreEvent, ScoreSummary, FanoutEvent, FanoutProgress, SampleEvent, TurnEvent)}
NESTED: dict[str, type] = {"PromptPiece": PromptPiece, "Candidate": Candidate, "MultiTokenChar": MultiTokenChar,
                           "LensRow": LensRow, "SamplerSettings": SamplerSettings, "StepTiming": StepTiming,
          "ServerFacts": ServerFacts, "KVGroup": KVGroup, "BlockGroup": BlockGroup, "ModelAnatomy": ModelAnatomy,
          "QuantFacts": QuantFacts, "ScoredToken": ScoredToken, "Message": Message,
          "LayerAttention": LayerAttention, "SublayerRow": SublayerRow,  # these two check their own values
          "ModelTruths": ModelTruths}
_SCALARS = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "dict": (dict,)}
MAX_LINE_BYTES = 64 * 1024 * 1024  # one record line (the longest, a long prompt's event, is a few MiB)
MAX_TOKEN_ID = 2**31 - 1  # as a server's ids are checked (core/server/shape.py): no vocabulary comes near
MAX_DURATION_MS = 24 * 3600 * 1000.0  # a step, a prefill or a part of one taking a day: a corrupt record
_INT64 = 2**63


def _token_id(value, where: str) -> None:
    if not 0 <= value <= MAX_TOKEN_ID:
        raise ValueError(f"{where} should be a token id in 0..{MAX_TOKEN_ID}, got {value}")


def _vocabulary(value, where: str) -> None:
    if not 0 <= value <= MAX_TOKEN_ID + 1:  # 0: not known (as null), like an older record's
        raise ValueError(f"{where} should be a vocabulary size in 1..{MAX_TOKEN_ID + 1} (0: not known), got {value}")


def _duration(value, where: str) -> None:
    if not 0 <= value <= MAX_DURATION_MS:
        raise ValueError(f"{where} should be a time in 0..{MAX_DURATION_MS:.0f} ms (a day), got {value:g}")


def _probability(value, where: str) -> None:
    if not -1e-4 <= value <= 1 + 1e-4:  # float rounding's overshoot allowed
        raise ValueError(f"{where} should be a probability in 0..1, got {value}")


def _not_negative(value, where: str) -> None:
    if value < 0:
        raise ValueError(f"{where} should be >= 0, got {value}")


# (event or nested class, field) -> the check of its value (of each item, for a list); None values are not checked
_RANGES = {
    **{key: _token_id for key in (("PromptEvent", "ids"), ("PromptPiece", "id"), ("StepEvent", "id"),
                                  ("Candidate", "id"), ("LensRow", "id"), ("BranchEvent", "id"),
                                  ("BranchEvent", "parent_id"), ("BranchEvent", "prompt_ids"),
                                  ("BranchEvent", "tokens"), ("ScoreEvent", "ids"), ("ScoredToken", "id"),
                                  ("FanoutEvent", "prompt_ids"), ("FanoutEvent", "tokens"), ("SampleEvent", "ids"),
                                  ("BranchEvent", "phrase_ids"), ("FanoutEvent", "parent_id"))},
    ("ModelFacts", "vocab_rows"): _vocabulary,
    **{key: _probability for key in (("Candidate", "raw_prob"), ("Candidate", "prob"), ("LensRow", "prob"),
                                     ("StepEvent", "chosen_raw_prob"), ("StepEvent", "chosen_prob"),
                                     ("StepEvent", "kept_mass"), ("StepEvent", "server_kv_usage"),
                                     ("LoadProgress", "fraction"), ("ScoredToken", "raw_prob"),
                                     ("SampleEvent", "raw_probs"), ("SampleEvent", "probs"))},
    # the times a replay waits out (core/runs/replay.py), and their parts
    **{key: _duration for key in (("StepEvent", "latency_ms"), ("StepEvent", "forward_ms"),
                                  ("StepEvent", "reissue_ttft_ms"), ("PrefillEvent", "ms"),
                                  ("PrefillProgress", "elapsed_ms"), ("DoneEvent", "ttft_ms"),
                                  ("ScoreSummary", "forward_ms"), ("StepTiming", "forward_ms"),
                                  ("StepTiming", "select_ms"), ("StepTiming", "copy_ms"),
                                  ("StepTiming", "detok_ms"), ("StepTiming", "wait_ms"))},
    # a run may sit paused for days (a fan-out's elapsed time counts its pauses); a rate has no bound
    **{key: _not_negative for key in (("DoneEvent", "paused_ms"), ("DoneEvent", "decode_tok_s"),
                                      ("FanoutProgress", "elapsed_ms"))},
}


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
        raise ValueError(f"{where} should be {annotation}, got {_preview(value)}")
    if annotation == "int" and not -_INT64 <= value < _INT64:
        raise ValueError(f"{where} should be a 64-bit integer, got one of {len(str(value))} digits")
    if annotation == "float":
        number = float(value) if not isinstance(value, int) or -_INT64 <= value < _INT64 else math.inf
        if not math.isfinite(number):  # 1e400 (read as infinity), or an integer of hundreds of digits
            raise ValueError(f"{where} should be a finite number, got {_preview(value)}")
        return number
    return value


def _preview(value) -> str:
    """A value as an error line quotes it: a container by its kind, anything else as JSON, cut."""
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else f"a list of {len(value)}"
    return json.dumps(value, ensure_ascii=False)[:40]


def build(cls: type, data, where: str):
    """An instance of dataclass `cls` from a JSON object: unknown keys ignored, types checked."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} should be an object")
    values = {}
    missing = []
    for f in fields(cls):
        if f.name in data:
            value = values[f.name] = _value(data[f.name], f.type, f"{where}.{f.name}")
            check = _RANGES.get((cls.__name__, f.name))
            if check is not None and value is not None:
                for n, item in enumerate(value) if isinstance(value, list) else ((None, value),):
                    if item is not None:  # a list's unknown items (a sample's probabilities) are not checked
                        check(item, f"{where}.{f.name}" if n is None else f"{where}.{f.name}[{n}]")
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
    events: list[tuple[int, Event]] = []
    cut = None
    for number, event in _events(path):
        if event is None:
            cut = number
        else:
            events.append((number, event))
    return events, cut


def _events(path: Path) -> Iterator[tuple[int, Event | None]]:
    """(line number, event) for each line as it is read; a last line cut short comes as (its number, None)."""
    for number, data in json_lines(path, "run record"):
        if data is None:
            yield number, None
            return
        try:
            yield number, event_from_dict(data)
        except ValueError as err:
            raise RecordError(f"{path}: line {number}: {err}") from None


def json_lines(path: Path, what: str) -> Iterator[tuple[int, object | None]]:
    """(line number, value) for each line of a JSON-lines file that is outside input (a record, a run tree), read a
    line at a time: no line longer than MAX_LINE_BYTES, each strict JSON. A last line cut short after whole ones (a
    crash mid-write) comes as (its number, None). Anything else wrong: RecordError, one line naming the file, the
    line and `what` the file should have been."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise RecordError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise RecordError(f"{path}: is a folder, not a {what}") from None
    except OSError as err:
        raise RecordError(f"{path}: {err.strerror or err}") from None
    with fh:
        number = 0
        seen = False
        line = _read_line(fh, path, 1, what)
        while line is not None:
            number += 1
            following = _read_line(fh, path, number + 1, what)  # one line ahead: only the last may be cut short
            if line.strip():
                try:
                    data = strict_loads(line)
                except (UnicodeDecodeError, ValueError) as err:
                    if following is None and seen:  # a crash mid-write: keep what came before
                        yield number, None
                        return
                    why = f" ({err})" if "JSON" in str(err) or "nested" in str(err) else ""
                    raise RecordError(f"{path}: line {number} is not JSON{why}: not a tokentui {what}") from None
                yield number, data
                seen = True
            line = following


def _read_line(fh, path: Path, number: int, what: str) -> bytes | None:
    """The next line (its newline dropped), None at the end; RecordError past MAX_LINE_BYTES."""
    try:
        line = fh.readline(MAX_LINE_BYTES + 1)
    except OSError as err:
        raise RecordError(f"{path}: {err.strerror or err}") from None
    if not line:
        return None
    if len(line) > MAX_LINE_BYTES:
        raise RecordError(f"{path}: line {number} is longer than {MAX_LINE_BYTES // 2**20} MiB: not a tokentui "
                          f"{what}")
    return line[:-1] if line.endswith(b"\n") else line


def read_run(path: str | Path, run_class):
    """The run a record holds (`Run.from_record`): one run, its `model` event first."""
    path = Path(path)
    run = run_class()
    run.record_path, run.cut_line = path, None
    started = False
    for number, event in _events(path):  # folded as read: a long record is never held twice
        if event is None:
            run.cut_line = number
            break
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
        rows = run.facts.vocab_rows if run.facts is not None else None
        if rows:  # ids inside the model's vocabulary, where the record says its size (1..2^31: `_vocabulary`)
            named = _ids_of(event)
            if named and max(named) >= rows:
                raise RecordError(f"{where}: token id {max(named)} is outside the model's vocabulary of {rows}")
        try:
            run.apply(event)
        except RunError as err:
            raise RecordError(f"{where}: {err}") from None
    if not started:
        raise RecordError(f"{path}: not a tokentui run record (no model event)")
    if run.prompt is None and run.branch is None and run.fanout is None and run.end is None:  # a branch's (or a
        # fan-out's) record may have no prompt
        raise RecordError(f"{path}: not a tokentui run record (no prompt event)" if run.cut_line is None else
                          f"{path}: the record was cut before its prompt (line {run.cut_line}): nothing to replay")
    return run


def _ids_of(event: Event) -> list[int]:
    """The token ids an event names."""
    if isinstance(event, StepEvent):
        return [event.id, *(c.id for c in event.candidates), *(r.id for r in event.lens or ()),
                *(r.id for row in event.sublayers or () for r in (row.after_attn, row.after_mlp) if r is not None)]
    if isinstance(event, PromptEvent):
        return [*event.ids, *(p.id for p in event.pieces)]
    if isinstance(event, BranchEvent):
        return [event.id, *event.prompt_ids, *event.tokens, *(event.phrase_ids or ())] + (
            [event.parent_id] if event.parent_id is not None else [])
    if isinstance(event, ScoreEvent):
        return [*event.ids, *(p.id for p in event.pieces)]
    if isinstance(event, FanoutEvent):
        return [*event.prompt_ids, *event.tokens, *(c.id for c in event.candidates)] + (
            [event.parent_id] if event.parent_id is not None else [])
    if isinstance(event, SampleEvent):
        return list(event.ids)
    if isinstance(event, ScoreSummary):
        return [t.id for t in event.least_likely]
    return []
