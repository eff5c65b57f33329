"""Fast pickling for the run model's frozen slots dataclasses (the events, the model facts, a turn, the attention
rows): each module that defines them calls `install_fast_pickling(globals())` once, below its classes."""

from __future__ import annotations


def install_fast_pickling(namespace: dict) -> None:
    """Pickling for the frozen slots dataclasses of `namespace` (core/runs/events.py's, explore_events.py's,
    facts.py's, turns.py's, attention.py's), by field position. The dashboard's model process sends every
    event pickled (core/link/protocol.py), a step with its ten candidates a dozen objects; the dataclasses module's
    own `__getstate__` / `__setstate__` for slots classes look their fields up again for every object, which made
    unpickling a step several tens of microseconds slower (BENCHMARKS.md, "the dashboard at GPU speed"). Same
    fields, same values, same types: only the lookup is done once per class, here."""
    from dataclasses import fields, is_dataclass

    for cls in list(namespace.values()):
        if not (isinstance(cls, type) and is_dataclass(cls) and "__slots__" in cls.__dict__):
            continue
        names = tuple(f.name for f in fields(cls))

        def getstate(self, _names=names):
            return tuple([getattr(self, name) for name in _names])

        def setstate(self, state, _names=names):
            for name, value in zip(_names, state):
                object.__setattr__(self, name, value)

        cls.__getstate__ = getstate
        cls.__setstate__ = setstate
