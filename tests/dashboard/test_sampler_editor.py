"""`S`, the sampler editor (issue 38, 3), read as text at 80×24, 120×30 and 160×48: it lists every stage of the
registry (core/samplers.py STAGES, nothing listed by hand), a value typed is checked by the registry's own check
(an invalid one is its one-line error under the row, and enter applies nothing), alt+↑ moves a stage earlier in
the chain's order, ctrl+t takes it out of the order, enter applies the draft as the settings asked for, esc leaves
them as they were. The quick keys still work after it."""

from __future__ import annotations

import pytest

from textual.containers import Vertical

from fakes import screen_text, slow_engine, wait_for
from snapshot_apps import SnapshotApp
from tokentui.core import samplers
from tokentui.tui import DashboardConfig
from tokentui.tui.screens.sampler_editor import SamplerEditor

SIZES = [(80, 24), (120, 30), (160, 48)]
IDS = [f"{w}x{h}" for w, h in SIZES]


def app_on(engine) -> SnapshotApp:
    return SnapshotApp(DashboardConfig(load=lambda progress: engine, options=engine.options, sampler=engine.sampler,
                                       user_theme_dir=None, recorder=None))


async def opened(pilot) -> SamplerEditor:
    app = pilot.app
    await wait_for(pilot, lambda: app.state.steps >= 2, what="decoding")
    await pilot.press("S")
    await wait_for(pilot, lambda: isinstance(app.screen, SamplerEditor), what="the sampler editor")
    await pilot.pause()
    return app.screen


async def choose(pilot, editor: SamplerEditor, name: str) -> None:
    """↓ (or ↑) until the setting `name` is the one chosen."""
    names = [p.name for _stage, p in editor.draft.rows()]
    key = "down" if names.index(name) > editor.draft.index else "up"
    while editor.draft.row[1].name != name:
        await pilot.press(key)


def editor_text(app) -> str:
    """What the editor's box shows on screen (the dimmed dashboard around it left out), one line per row."""
    box = app.screen.query_one(Vertical).region
    lines = screen_text(app).splitlines()[box.y:box.y + box.height]
    return "\n".join(line[box.x:box.x + box.width] for line in lines)


async def type_value(pilot, text: str) -> None:
    await pilot.press("ctrl+u", *list(text))


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_the_editor_lists_every_stage_edits_checks_and_applies(size):
    app = app_on(slow_engine(delay=0.05, steps=400))
    async with app.run_test(size=size) as pilot:
        editor = await opened(pilot)
        labels = [getattr(s, "label", s.param.label) for s in samplers.STAGES]
        seen = set()
        for _ in range(0, len(editor.draft.rows()), 8):  # every row comes into view as the choice moves down
            seen |= {label for label in labels if label in editor_text(app)}
            await pilot.press("pagedown")
        seen |= {label for label in labels if label in editor_text(app)}
        assert seen == set(labels), set(labels) - seen
        await choose(pilot, editor, "temperature")
        await type_value(pilot, "abc")
        await pilot.press("enter")
        text = editor_text(app)
        assert isinstance(app.screen, SamplerEditor)  # nothing applied
        assert "temperature must be a number" in " ".join(text.split()), text
        assert app.controller.sampler.temperature == pytest.approx(0.7)
        await type_value(pilot, "0.35")
        await pilot.press("down", "up")  # committed: the row shows it
        assert "0.35" in editor_text(app)
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, SamplerEditor), what="the editor to close")
        assert app.controller.sampler.temperature == pytest.approx(0.35)
        await pilot.press("T")  # the quick keys stay
        assert app.controller.sampler.temperature == pytest.approx(0.45)
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_stages_move_and_turn_off_in_the_order_and_esc_keeps_the_settings(size):
    app = app_on(slow_engine(delay=0.05, steps=400))
    async with app.run_test(size=size) as pilot:
        before = app.controller.sampler
        order = before.samplers.split(";")
        editor = await opened(pilot)
        await choose(pilot, editor, "top_p")
        await pilot.press("alt+up")  # top-p one place earlier
        moved = editor.draft.settings.samplers.split(";")
        at = order.index("top_p")
        assert moved[at - 1] == "top_p" and moved[at] == order[at - 1], moved
        assert editor.draft.row[1].name == "top_p"  # the choice follows its stage
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, SamplerEditor), what="the editor to close")
        assert app.controller.sampler == before  # cancelled: nothing changed
        editor = await opened(pilot)
        await choose(pilot, editor, "min_p")
        await pilot.press("ctrl+t")  # min-p out of the order
        assert "min_p" not in editor.draft.settings.samplers.split(";")
        await choose(pilot, editor, "top_p")
        await pilot.press("alt+up")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, SamplerEditor), what="the editor to close")
        after = app.controller.sampler.samplers.split(";")
        assert "min_p" not in after and after.index("top_p") == order.index("top_p") - 1, after
        await pilot.press("q")
