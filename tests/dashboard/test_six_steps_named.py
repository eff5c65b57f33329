"""All six steps are named, with their numbers, at every size (issue 40: at 80×24 prefill (3) and decode (5) had no
labelled place; the strip `KV 3.8 MiB · 87 tok │ last 35.3 ms/step …` showed their readings unnamed). Where no
speed panel names them, the prompt panel's border says `3 prefill <its time>` and the readings strip starts with
`5 decode`. Read as the terminal shows it."""

from __future__ import annotations

import re

import pytest

from fakes import ScriptedEngine, make_loader, screen_text, wait_for
from snapshot_apps import SnapshotApp
from tokentui.tui import DashboardConfig
from tokentui.tui.format import ms

SIZES = [(80, 24), (120, 30), (160, 48)]
STEPS = ("1 chat template", "2 tokenize", "3 prefill", "4 selection", "5 decode", "6 detokenize")


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_every_step_is_named_on_screen(size):
    app = SnapshotApp(DashboardConfig(load=make_loader(ScriptedEngine()), user_theme_dir=None, recorder=None))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.done is not None, what="the run's end")
        await pilot.pause(0.1)
        app.redraw()
        await pilot.pause()
        screen = screen_text(app)
        missing = [name for name in STEPS if name not in screen]
        assert not missing, (missing, screen)
        prefill = f"3 prefill {ms(app.state.prefill.ms)}"  # the prefill's own time, as the speed panel gives it
        speed_shown = app.query_one("#speed").display
        if not speed_shown:  # named in the prompt panel's border, with its time
            assert re.search(rf"prompt tokens · {re.escape(prefill)}( · u follow-up)? ─", screen), screen
            assert re.search(r"│ 5 decode KV [\d.]+ \S+ · [\d,]+ tok │ last ", screen), screen
        else:  # the speed panel's title names both
            assert "3 prefill · 5 decode · speed" in screen and "3 prefill 42" not in screen
        await pilot.press("q")
