"""Every run is written as it happens to a JSON-lines file with the `--headless --json` schema (what is written
when, and how a cut-off run still ends with `done`, is core/runs/recording.py's job; this is the file).

Each line is flushed (and fsync'd at the end) so a kill loses at most the step in flight; file names carry a
timestamp and pid and are opened with "x" so an old record is never overwritten.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .events import Event
from ..paths import runs_dir


class RunRecorder:
    """Writes one file per run under `directory` (default: the user state dir's runs/)."""

    def __init__(self, directory: Path | None = None):
        self.directory = Path(directory) if directory else runs_dir()
        self.path: Path | None = None
        self._fh = None

    def fresh(self) -> "RunRecorder":
        """Another recorder writing to the same folder (one per run: each holds one file)."""
        return RunRecorder(self.directory)

    def open_run(self) -> Path:
        self.close()
        self.directory.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in range(1000):
            suffix = f"-{n}" if n else ""
            path = self.directory / f"{stamp}-{os.getpid()}{suffix}.jsonl"
            try:
                self._fh = open(path, "x", encoding="utf-8")
            except FileExistsError:
                continue
            self.path = path
            return path
        raise OSError(f"could not create a run record in {self.directory}")

    def write(self, event: Event | dict) -> None:
        if self._fh is None:
            return
        data = event.to_dict() if isinstance(event, Event) else event
        self._fh.write(json.dumps(data, ensure_ascii=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            try:
                os.fsync(self._fh.fileno())
            except OSError:
                pass
            self._fh.close()
            self._fh = None
