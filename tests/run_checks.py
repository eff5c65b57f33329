"""Checks on a run's events that many tests share."""

from __future__ import annotations

from tokentui.core.runs.events import DoneEvent, ErrorEvent


def failure_of(events) -> ErrorEvent:
    """The error a failed run ended with: every failed run's events end with its `error` then a `done` with reason
    "error" (core/interface.py), and nothing else is an error."""
    events = list(events)
    assert len(events) >= 2 and isinstance(events[-2], ErrorEvent), events[-3:]
    assert isinstance(events[-1], DoneEvent) and events[-1].reason == "error", events[-1]
    assert sum(isinstance(e, ErrorEvent) for e in events) == 1
    return events[-2]
