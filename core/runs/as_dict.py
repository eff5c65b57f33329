"""`as_dict`: `dataclasses.asdict`'s result, without its copy of every leaf value, for the events' `to_dict`
(core/runs/events.py), which `--headless --json` calls for every step.

Why hand-written: on Python 3.11, `asdict` passes each str, int and float of an event through `copy.deepcopy`, most of
the time a step's `--json` line took (BENCHMARKS.md, "Side by side with llama-server": the steps' own Python); Python
3.12 skips those immutable values the same way. Everything else is converted as `asdict` converts it: a dataclass to
a dict of its fields in order, a list, tuple, named tuple or dict to the same kind of container of converted values,
any other value deep-copied.
"""

from __future__ import annotations

import copy
from dataclasses import fields, is_dataclass

_ATOMIC = frozenset((str, int, float, bool, complex, bytes, type(None)))  # immutable: deepcopy returns them as they are
_FIELDS: dict[type, tuple[str, ...]] = {}  # a dataclass's field names, looked up once per class


def as_dict(obj: object) -> object:
    """`dataclasses.asdict(obj)` for a dataclass instance; the same conversion for any value inside one."""
    kind = type(obj)
    if kind in _ATOMIC:
        return obj
    names = _FIELDS.get(kind)
    if names is None and is_dataclass(kind):
        names = _FIELDS[kind] = tuple(f.name for f in fields(kind))
    if names is not None:
        return {name: as_dict(getattr(obj, name)) for name in names}
    if kind is list:
        return [as_dict(value) for value in obj]
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple: rebuilt by position, as asdict does
        return kind(*[as_dict(value) for value in obj])
    if isinstance(obj, (list, tuple)):
        return kind(as_dict(value) for value in obj)
    if isinstance(obj, dict):
        return kind((as_dict(k), as_dict(v)) for k, v in obj.items())
    return copy.deepcopy(obj)
