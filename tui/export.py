"""Export (the `e` key): the answer as a UTF-8 text file.

Next to the run's record when there is one (`RUN.jsonl` → `RUN.answer.txt`, written again on a second export),
else a new `tokentui-answer-STAMP[-N].txt` in `directory` (never over an existing file). An answer is as private as
its record: the file is 0600 (core/paths.py). Plain Python, no Textual.
"""

from __future__ import annotations

import time
from pathlib import Path

from tokentui.core.paths import open_private_log


def answer_path(record: Path | None, directory: Path) -> Path:
    """Where the answer of the run recorded in `record` (None: not recorded) is written."""
    if record is not None:
        return record.with_name(record.stem + ".answer.txt")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = directory / f"tokentui-answer-{stamp}.txt"
    n = 1
    while path.exists():
        path = directory / f"tokentui-answer-{stamp}-{n}.txt"
        n += 1
    return path


def export_answer(text: str, record: Path | None, directory: Path | None = None) -> Path:
    """Write `text` (ending with a newline) and return its path; raises OSError when it cannot be written.
    `directory`: for a run not recorded (default: the working directory)."""
    path = answer_path(record, Path.cwd() if directory is None else directory)
    with open_private_log(path) as out:
        out.write((text + ("\n" if text and not text.endswith("\n") else "")).encode("utf-8"))
    return path
