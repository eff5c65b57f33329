"""Running the dashboard as a program: the app until the user quits, then what the terminal is told (where the
run was recorded, a load error), the model process ended, and the exit status."""

from __future__ import annotations

import sys

from tokentui.core.errors import TokentuiError
from tokentui.core.steps.display import printable_line

from .app import TokentuiApp
from .config import DashboardConfig


def run_dashboard(config: DashboardConfig) -> int:
    """Run the dashboard until the user quits; returns the process exit code (0 = normal).

    Quitting gives the run in progress a moment to end at its step boundary (tui/app.py); whatever is still going
    then — a load, one long prefill — is ended here with the engine client: the model process is closed, and a record
    cut off before its `done` gets a "stopped" one, so every record ends with `done` and whole lines.
    """
    app = TokentuiApp(config)
    controller = app.controller
    try:
        app.run()
    finally:
        controller.close()
    for line in quit_lines(app):  # where the runs of each prompt were recorded, what was cut, a crash's log
        try:
            print(f"tokentui: {printable_line(line)}", file=sys.stderr)
        except OSError:  # the terminal is gone (SIGHUP): the records are what matters
            break
    code = app.return_code or 0
    if not controller.loaded and controller.load_error is not None:  # quit after a failed load: say why
        error = controller.load_error
        text = str(error) if isinstance(error, TokentuiError) else f"{type(error).__name__}: {error}"
        try:
            print(f"tokentui: {printable_line(text)}", file=sys.stderr)  # it may quote a server or a file
        except OSError:
            pass
    return code


def quit_lines(app) -> list[str]:
    """What the terminal is told once the dashboard has closed: where the runs were recorded, each record that was
    cut (recording stopped: a full disk) and where, and an exception nobody handled (the last line of defence:
    core/crash.py), each a line without its "tokentui: "."""
    controller = app.controller
    lines = controller.quit_lines()  # the tree files, which name each run's record
    lines += [f"the record {path} was cut (recording stopped): it holds the run up to there"
              for path in controller.record_paths if _cut(path)]
    if app.crash is not None:
        from tokentui.core.crash import crash_line

        lines.append(crash_line(app.crash, app.crash_log).removeprefix("tokentui: "))
    return lines


def _cut(path) -> bool:
    """Whether a record ends before its `done` (its recording stopped: a full disk). Only its last line is read
    (backwards, a block at a time: a long answer's `done` can be larger than one)."""
    import json

    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, 2)
            tail = b""
            while end > 0 and b"\n" not in tail.rstrip(b"\n") and len(tail) < 2**26:
                start = max(0, end - 65536)
                fh.seek(start)
                tail = fh.read(end - start) + tail
                end = start
        return json.loads(tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]).get("event") != "done"
    except (OSError, ValueError, AttributeError):
        return True
