"""Apps for the snapshots of issue 26 on the scripted engine: the phrase dialog with its pieces typed, the fan-out
list, and the scored answer with its summary."""

from __future__ import annotations

from fake_script import ANSWER_TEXT
from fakes import ScriptedEngine, make_loader, wait_for
from snapshot_apps import SnapshotApp

from tokentui.core.runs.requests import ScoreRequest
from tokentui.core.settings import SamplerSettings
from tokentui.tui import DashboardConfig

SAMPLING = SamplerSettings(temperature=0.8, top_p=1.0, seed=5)


def app_of(engine: ScriptedEngine, **config) -> SnapshotApp:
    return SnapshotApp(DashboardConfig(load=make_loader(engine), sampler=engine.sampler, options=engine.options,
                                       user_theme_dir=None, recorder=None, **config))


def phrase_app() -> SnapshotApp:
    return app_of(ScriptedEngine(sampler=SamplerSettings(temperature=0.0)))


def fanout_app() -> SnapshotApp:
    return app_of(ScriptedEngine(sampler=SAMPLING))


def scored_app() -> SnapshotApp:
    return app_of(ScriptedEngine(), score=ScoreRequest("Is OpenAI open?", ANSWER_TEXT))


async def _at_step_5(pilot) -> None:
    """The finished run, viewed at step 5 (< then ] four times)."""
    app = pilot.app
    await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the run to finish")
    await pilot.press("less_than_sign", *["right_square_bracket"] * 4)
    await pilot.pause(0.1)


async def phrase_typed(pilot) -> None:
    """b at step 5, t, then " weights are" typed: its pieces shown."""
    from tokentui.tui.screens.phrase import PhraseDialog

    app = pilot.app
    await _at_step_5(pilot)
    await pilot.press("b", "t")
    await wait_for(pilot, lambda: isinstance(app.screen, PhraseDialog), what="the phrase dialog")
    await pilot.press(*" weights are")
    await wait_for(pilot, lambda: app.screen.pieces_of == " weights are", what="the pieces")
    await pilot.pause(0.1)


async def fanned_out(pilot) -> None:
    """f at step 5: the eight samples listed."""
    from tokentui.tui.screens.fanout import FanoutScreen

    app = pilot.app
    await _at_step_5(pilot)
    await pilot.press("f")
    await wait_for(pilot, lambda: isinstance(app.screen, FanoutScreen) and not app.screen.state.running,
                   what="the fan-out")
    await pilot.pause(0.1)


async def scored(pilot) -> None:
    from tokentui.tui.screens.scored import ScoredDialog

    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, ScoredDialog), timeout=10, what="the summary")
    app.redraw()
    await pilot.pause(0.1)
