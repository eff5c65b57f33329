"""Where tokentui keeps things: the converted-model cache, run records, user themes (XDG, overridable); and how
its private files are made.

Records and the model process's log hold prompts and answers: they are created 0600 (`open_private`,
`open_private_log`) in folders created 0700 (`private_dir`), as other tools that store conversations keep theirs.
tokentui's own state folder, made 0755 by an older version, is tightened to 0700; a folder the user named
(`--record-dir`) that exists already keeps its mode (its files are 0600 all the same).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO, TextIO


def _xdg(var: str, default: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else Path.home() / default


def cache_dir() -> Path:
    """Converted GGUF weights; `TOKENTUI_CACHE_DIR` overrides `$XDG_CACHE_HOME/tokentui`."""
    return Path(os.environ.get("TOKENTUI_CACHE_DIR") or _xdg("XDG_CACHE_HOME", ".cache") / "tokentui")


def state_dir() -> Path:
    """Run records; `TOKENTUI_STATE_DIR` overrides `$XDG_STATE_HOME/tokentui`."""
    return Path(os.environ.get("TOKENTUI_STATE_DIR") or _xdg("XDG_STATE_HOME", ".local/state") / "tokentui")


def runs_dir() -> Path:
    return state_dir() / "runs"


def config_dir() -> Path:
    """User themes live in `<config>/themes`; `TOKENTUI_CONFIG_DIR` overrides `$XDG_CONFIG_HOME/tokentui`."""
    return Path(os.environ.get("TOKENTUI_CONFIG_DIR") or _xdg("XDG_CONFIG_HOME", ".config") / "tokentui")


PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def private_dir(path: Path) -> Path:
    """`path` as a folder, made (with any missing parent) 0700; inside tokentui's state folder, an existing folder
    that others can read is tightened to 0700. OSError (one line: `why_not`) when it cannot be made."""
    path = Path(path)
    missing = []
    at = path
    while not at.exists() and at != at.parent:
        missing.append(at)
        at = at.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:
            pass
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is a file, not a folder")
    state = state_dir()
    for folder in (path, *path.parents):
        if folder == state or state in folder.parents:
            _tighten(folder)
        if folder == state:
            break
    return path


def _tighten(folder: Path) -> None:
    try:
        mode = stat.S_IMODE(folder.stat().st_mode)
        if mode & 0o077 and folder.stat().st_uid == os.getuid():
            folder.chmod(mode & ~0o077)
    except OSError:
        pass  # a folder tokentui cannot tighten is still used: its files are 0600


def open_private(path: Path) -> TextIO:
    """A new text file (UTF-8) at `path`, 0600; FileExistsError when there is one (never overwritten)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    return os.fdopen(fd, "w", encoding="utf-8")


def open_private_log(path: Path) -> BinaryIO:
    """`path` emptied (or made) for writing, 0600 whatever mode an older file had."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)
    except OSError:
        pass
    return os.fdopen(fd, "wb")


def why_not(err: OSError) -> str:
    """An OSError as a line for the user: its reason and the path, not "[Errno 17] File exists: ..."."""
    reason = err.strerror or str(err)
    where = err.filename if err.filename is not None else None
    return f"{where}: {reason}" if where else reason
