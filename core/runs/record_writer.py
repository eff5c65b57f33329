"""Every run is written as it happens to a JSON-lines file with the `--headless --json` schema (what is written
when, and how a cut-off run still ends with `done`, is core/runs/recording.py's job; this is the file).

Each line is flushed (and fsync'd at the end) so a kill loses at most the step in flight; file names carry a
timestamp and pid and are opened with "x" so an old record is never overwritten. A record holds a prompt and its
answer: it is created 0600 in a folder created 0700 (core/paths.py). A record nothing could be written to (a disk
full from the start) is removed when it is closed: no empty `.jsonl` is left behind.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TextIO

from .events import Event
from ..paths import open_private, private_dir, runs_dir


class JsonLinesFile:
    """An open JSON-lines file (a record, a run tree): each line written whole and flushed, fsync'd at the end."""

    def __init__(self, fh: TextIO) -> None:
        self._fh: TextIO | None = fh
        self.lines = 0  # lines written and flushed

    def write(self, data: dict) -> None:
        if self._fh is None:
            return
        self._fh.write(json.dumps(data, ensure_ascii=False) + "\n")
        self._fh.flush()
        self.lines += 1

    def close(self) -> None:
        """Closed, even when the last flush fails (a full disk: that OSError is raised after)."""
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                os.fsync(fh.fileno())
            except OSError:
                pass
            fh.close()


class RunRecorder:
    """Writes one file per run under `directory` (default: the user state dir's runs/)."""

    def __init__(self, directory: Path | None = None):
        self.directory = Path(directory) if directory else runs_dir()
        self.path: Path | None = None
        self._file: JsonLinesFile | None = None

    def fresh(self) -> "RunRecorder":
        """Another recorder writing to the same folder (one per run: each holds one file)."""
        return RunRecorder(self.directory)

    def open_run(self) -> Path:
        self.close()
        private_dir(self.directory)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in range(1000):
            suffix = f"-{n}" if n else ""
            path = self.directory / f"{stamp}-{os.getpid()}{suffix}.jsonl"
            try:
                self._file = JsonLinesFile(open_private(path))
            except FileExistsError:
                continue
            self.path = path
            return path
        raise OSError(f"could not create a run record in {self.directory}")

    @property
    def is_open(self) -> bool:
        """A record is open: what is written goes into it."""
        return self._file is not None

    def write(self, event: Event | dict) -> None:
        if self._file is not None:
            self._file.write(event.to_dict() if isinstance(event, Event) else event)

    def close(self) -> None:
        """Close the record; one nothing could be written to is removed (`path` is then None)."""
        file, self._file = self._file, None
        if file is None:
            return
        try:
            file.close()
        finally:
            if file.lines == 0 and self.path is not None:
                try:
                    self.path.unlink()
                    self.path = None
                except OSError:
                    pass
