"""Messages from the worker threads to the app (dataclasses, as in toolong).

The generation worker posts one `EngineEvent` per engine event and never waits for the UI; the app folds them
into `RunState` at once and repaints the panels at most ~30 times a second (see `TokentuiApp._schedule_flush`).
Load progress is only interesting when fresh, so a newer `LoadProgressed` replaces an unprocessed older one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.message import Message

from tokentui.core.events import Event, LoadProgress


@dataclass
class LoadProgressed(Message):
    progress: LoadProgress

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LoadProgressed)


@dataclass
class RunStarted(Message):
    run_id: int
    record_path: Path | None


@dataclass
class EngineEvent(Message):
    run_id: int
    event: Event


@dataclass
class RunNote(Message):
    """Something about a run that is not an engine event (e.g. the record could not be written)."""

    run_id: int
    message: str
    severity: str = "warning"
