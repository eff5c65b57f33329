"""The last line of defence: an exception nobody turned into a one-line error. Its traceback goes to a log file
(0600, in the state folder, else the temporary folder) and the terminal gets one line naming that file, never the
traceback itself (Textual's shows every frame's locals: a prompt, a server's key).

API keys are scrubbed from both: the values of the key variables named on the command line (`--api-key-env`, and
TOKENTUI_API_KEY) and every key a server connection of this process holds.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from .paths import open_private, private_dir, state_dir
from .steps.display import printable_line

DEFAULT_KEY_ENV = "TOKENTUI_API_KEY"


def _secrets(argv: list[str] | None) -> set[str]:
    names = {DEFAULT_KEY_ENV}
    argv = list(argv or [])
    for n, arg in enumerate(argv):
        if arg == "--api-key-env" and n + 1 < len(argv):
            names.add(argv[n + 1])
        elif arg.startswith("--api-key-env="):
            names.add(arg.split("=", 1)[1])
    values = {os.environ.get(name, "") for name in names}
    http = sys.modules.get("tokentui.core.server.http")  # the keys its connections hold (never imported here)
    if http is not None:
        values |= set(getattr(http, "_SECRETS", ()))
    return {v for v in values if v}


def _scrub(text: str, secrets: set[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "<key>")
    return text


def write_crash_log(err: BaseException, argv: list[str] | None = None) -> Path | None:
    """Write `err`'s traceback to a new crash log; its path, or None when no file could be written."""
    secrets = _secrets(argv)
    text = _scrub("".join(traceback.format_exception(type(err), err, err.__traceback__)), secrets)
    name = f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    try:
        path = private_dir(state_dir()) / name
        with open_private(path) as fh:
            fh.write(text)
        return path
    except OSError:
        pass
    try:
        fd, tmp = tempfile.mkstemp(prefix="tokentui-crash-", suffix=".log")  # 0600
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        return Path(tmp)
    except OSError:
        return None


def crash_line(err: BaseException, log: Path | None, argv: list[str] | None = None) -> str:
    """The one line for the terminal: what happened (scrubbed, escaped, cut) and where its traceback is."""
    what = _scrub(f"{type(err).__name__}: {err}", _secrets(argv))
    what = " ".join(printable_line(what).split())
    what = what if len(what) <= 160 else what[:159] + "…"
    where = f"the traceback is in {log}" if log is not None else "its traceback could not be written anywhere"
    return f"tokentui: unexpected error ({what}); {where} (please report it)"


__all__ = ["crash_line", "write_crash_log"]
