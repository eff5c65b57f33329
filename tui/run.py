"""Running the dashboard as a program: the app until the user quits, then what the terminal is told (where the
run was recorded, a load error), the model process ended, and the exit status."""

from __future__ import annotations

import os
import sys

from tokentui.core.errors import TokentuiError

from .app import TokentuiApp
from .config import DashboardConfig


def run_dashboard(config: DashboardConfig, abandon_after: float | None = None) -> int:
    """Run the dashboard until the user quits; returns the process exit code (0 = normal).

    abandon_after: (the command line) once the terminal is restored, wait at most this many seconds for the model
    to finish what it is doing; if it is still busy (loading, or one long prefill), end the process at once
    instead of waiting for it. The record then holds every step written so far, each a whole line.
    """
    app = TokentuiApp(config)
    try:
        app.run()
    finally:
        if app.engine is not None:
            try:
                app._halt_engine()
            except Exception:
                pass
    if app.record_paths:
        last = app.record_paths[-1]
        runs = len(app.record_paths)
        where = f"run recorded in {last}" if runs == 1 else f"{runs} runs recorded; the last in {last}"
        try:
            print(f"tokentui: {where}", file=sys.stderr)
        except OSError:  # the terminal is gone (SIGHUP): the record is what matters
            pass
    code = app.return_code or 0
    if app.engine is None and app.load_error is not None:  # quit after a failed load: say why, on the terminal too
        error = app.load_error
        try:
            print(f"tokentui: {error if isinstance(error, TokentuiError) else f'{type(error).__name__}: {error}'}",
                  file=sys.stderr)
        except OSError:
            pass
    close = getattr(app.engine, "close", None)
    if close is not None:
        # The model runs in a child process (core/process.py): a decoding run ends at its next step boundary;
        # a long prefill is ended by closing the child, and the run's record still ends with `done`.
        app.settled(1.0)
        close()
    if abandon_after is not None and not app.settled(abandon_after):
        try:
            print("tokentui: stopped without waiting for the model to finish its current run", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:  # the terminal is gone
            pass
        os._exit(code)
    return code
