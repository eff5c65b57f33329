"""Running the dashboard as a program: the app until the user quits, then what the terminal is told (where the
run was recorded, a load error), the model process ended, and the exit status."""

from __future__ import annotations

import sys

from tokentui.core.errors import TokentuiError

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
    for line in controller.quit_lines():  # where the runs of each prompt were recorded: the tree files
        try:
            print(f"tokentui: {line}", file=sys.stderr)
        except OSError:  # the terminal is gone (SIGHUP): the records are what matters
            break
    code = app.return_code or 0
    if not controller.loaded and controller.load_error is not None:  # quit after a failed load: say why
        error = controller.load_error
        try:
            print(f"tokentui: {error if isinstance(error, TokentuiError) else f'{type(error).__name__}: {error}'}",
                  file=sys.stderr)
        except OSError:
            pass
    return code
