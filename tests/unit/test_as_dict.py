"""core/runs/as_dict.py: the events' `to_dict` gives what `dataclasses.asdict` gave, in the same kinds of container,
with nothing in it shared with the event's own mutable values."""

from __future__ import annotations

import dataclasses
import enum
from collections import namedtuple
from dataclasses import dataclass, field

from fakes import ScriptedEngine
from tokentui.core.runs.as_dict import as_dict
from tokentui.core.runs.events import StepEvent

Pair = namedtuple("Pair", "left right")


class Colour(enum.Enum):
    RED = "red"


class Box:  # a mutable value that is not a container: asdict deep-copies it
    def __init__(self, items):
        self.items = items

    def __eq__(self, other):
        return isinstance(other, Box) and other.items == self.items


@dataclass
class Inner:
    name: str
    weights: list[float]


@dataclass
class Outer:
    count: int
    ratio: float | None
    flag: bool
    inner: Inner
    inners: list[Inner]
    span: tuple[int, int]
    pair: Pair
    table: dict[str, Inner]
    colour: Colour
    box: Box
    blob: bytes = b"\x00\x01"
    nothing: None = None
    nested: list[list[int]] = field(default_factory=lambda: [[1, 2], [3]])


def _outer() -> Outer:
    return Outer(count=3, ratio=None, flag=True, inner=Inner("a", [0.5, 1.5]),
                 inners=[Inner("b", []), Inner("c", [2.0])], span=(4, 9), pair=Pair(Inner("l", [1.0]), 7),
                 table={"k": Inner("d", [3.0])}, colour=Colour.RED, box=Box([1, [2]]))


def _same_kinds(a, b) -> bool:
    """Equal and of the same types all the way down (a tuple is not a list, a named tuple not a tuple)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_kinds(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_kinds(x, y) for x, y in zip(a, b))
    return a == b


def test_as_dict_is_asdict_for_every_kind_of_field():
    value = _outer()
    assert _same_kinds(as_dict(value), dataclasses.asdict(value))


def test_as_dict_shares_no_mutable_value_with_its_input():
    value = _outer()
    out = as_dict(value)
    out["inner"]["weights"].append(99.0)
    out["inners"].clear()
    out["nested"][0].append(5)
    out["table"]["k"]["name"] = "changed"
    out["box"].items[1].append(3)
    assert value.inner.weights == [0.5, 1.5] and len(value.inners) == 2 and value.nested == [[1, 2], [3]]
    assert value.table["k"].name == "d" and value.box.items == [1, [2]]
    assert out["colour"] is Colour.RED  # an enum member is itself, as deepcopy gives it


def test_every_event_of_a_run_converts_as_asdict_did():
    engine = ScriptedEngine()
    events = list(engine.run("Is OpenAI open?", None))
    assert any(isinstance(e, StepEvent) for e in events)
    for event in events:
        assert _same_kinds(as_dict(event), dataclasses.asdict(event)), type(event).__name__
        assert event.to_dict()["event"] == event.event
