"""Apps for the snapshot tests: the dashboard on the scripted engine, caret blinking off, no user themes."""

from __future__ import annotations

from fakes import ScriptedEngine, make_loader
from noting_app import NotingApp

from tokentui.tui import DashboardConfig


class SnapshotApp(NotingApp):  # its toasts kept too (tests/noting_app.py)
    CURSOR_BLINK = False


def make_app(theme: str = "tokentui-dark") -> SnapshotApp:
    config = DashboardConfig(load=make_loader(ScriptedEngine()), theme=theme, user_theme_dir=None, recorder=None)
    return SnapshotApp(config)


async def wait_until_done(pilot) -> None:
    """run_before for snap_compare: the scripted run has finished and the last repaint happened."""
    from fakes import wait_for

    app = pilot.app
    await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the run to finish")
    await pilot.pause(0.1)
    app.redraw()
    await pilot.pause()


async def view_step_10(pilot) -> None:
    """run_before for the time-travel snapshots: the finished run, the cursor held at step 10 (开's first two bytes
    pending) by keys: < to the first step, then ] nine times."""
    await wait_until_done(pilot)
    await pilot.press("less_than_sign", *["right_square_bracket"] * 9)
    await pilot.pause(0.1)
    pilot.app.redraw()
    await pilot.pause()
