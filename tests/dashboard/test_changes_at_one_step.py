"""Several sampler changes that took effect at one step are all named in the sampler panel at every size (issue 40:
at 120×30 the one-line panel named only the latest of them, while the record and the 160×48 panel had them all).
Made as a user makes them: paused, two keys (T, then p), then one step (n)."""

from __future__ import annotations

import pytest

from fakes import make_loader, slow_engine, wait_for
from snapshot_apps import SnapshotApp
from tokentui.tui import DashboardConfig
from tokentui.tui.panels import SamplerPanel
from tokentui.tui.panels.sampler import latest_forms

SIZES = [(80, 24), (120, 30), (160, 48)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_every_change_made_at_one_step_is_named(size):
    engine = slow_engine(delay=0.03, steps=400)
    app = SnapshotApp(DashboardConfig(load=make_loader(engine), options=engine.options, user_theme_dir=None,
                                      recorder=None))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.steps >= 2, what="decoding")
        await pilot.press("space")
        await wait_for(pilot, lambda: app.client.paused, what="the pause")
        await pilot.press("T", "p")
        steps = app.state.steps
        await pilot.press("n")
        await wait_for(pilot, lambda: len(app.state.settings_changes) == 1 and app.state.steps > steps,
                       what="both changes used at one step")
        await pilot.pause(0.1)
        app.redraw()
        await pilot.pause()
        (change,) = app.state.settings_changes
        assert {name for name, _old, _new in change.changes} == {"temperature", "top_p"}
        step = engine.steps[change.step - 1]  # the step named is the one that first used both
        assert (step.settings.temperature, step.settings.top_p) == (0.8, 0.85)
        text = " ".join(app.query_one(SamplerPanel).last_text.plain.split())
        named = (f"step {change.step} temp 0.70→0.80, top-p 0.90→0.85" in text,  # the one-line panel
                 f"step {change.step} temp→0.80, top-p→0.85" in text,
                 f"step {change.step}: temp, top-p" in text and "temp 0.80" in text and "top-p 0.85" in text,
                 f"step {change.step} temp 0.70→0.80" in text and f"step {change.step} top-p 0.90→0.85" in text)
        assert any(named), text
        await pilot.press("q")


def test_the_latest_change_has_shorter_wordings_that_still_name_each_setting():
    from tokentui.tui.state import SettingsChange

    forms = latest_forms([SettingsChange(3, (("top_k", 0, 40),)),
                          SettingsChange(12, (("temperature", 0.7, 0.8), ("top_p", 0.9, 0.85)))])
    assert forms == ("step 12 temp 0.70→0.80, top-p 0.90→0.85", "step 12 temp→0.80, top-p→0.85",
                     "step 12: temp, top-p changed", "step 12: temp, top-p", "step 12: 2 changes")
    assert latest_forms([]) == ()
