"""Notices go where they cover none of the live readings, and name real paths (issue 40: at 80×24 and 120×30 a
branch notice stood over the sampler panel, and `A replay cannot branch: run tokentui branch FILE …` over the sampler
and status lines, with `FILE` where the record's path could be). Read from the toasts' places on the screen."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from fakes import ScriptedEngine, make_loader, slow_engine, wait_for
from snapshot_apps import SnapshotApp
from tokentui.commands.replay import replay_config
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.run import Run
from tokentui.tui import DashboardConfig

SIZES = [(80, 24), (120, 30), (160, 48)]
READINGS = ("#output", "#candidates", "#model", "#lens", "#anatomy", "#anatomy-side", "#sampler", "#speed", "#kv",
            "#pending", "#readings", "#status", "#keys")


def toasts_clear_of_the_readings(app) -> list[str]:
    """What each toast on screen covers of the panels with live readings (empty: nothing), and checks they are
    over the prompt panel, under its title."""
    toasts = list(app.screen.query("Toast"))
    assert toasts, "no notice on screen"
    prompt = app.query_one("#prompt").region
    covered = []
    for toast in toasts:
        box = toast.region
        assert prompt.y < box.y and box.bottom <= prompt.bottom, (box, prompt)  # the title's row stays in view
        for selector in READINGS:
            for widget in app.query(selector):
                if widget.display and widget.region.overlaps(box):
                    covered.append(f"{selector} {widget.region} under {box}")
    return covered


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_a_notice_while_generating_covers_no_live_reading(size):
    engine = slow_engine(delay=0.05, steps=400)
    app = SnapshotApp(DashboardConfig(load=make_loader(engine), options=engine.options, user_theme_dir=None,
                                      recorder=None))
    async with app.run_test(size=size, notifications=True) as pilot:
        await wait_for(pilot, lambda: app.state.steps >= 2, what="decoding")
        await pilot.press("b")  # refused while generating: "Pause (space) to branch …"
        await pilot.pause(0.2)
        assert any(t.message.startswith("Pause (space) to branch") for t in app.toasts), app.toasts
        assert not toasts_clear_of_the_readings(app)
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_a_replays_refusals_name_the_record_and_cover_no_live_reading(tmp_path, size):
    run = Run(ScriptedEngine().facts)
    for event in ScriptedEngine().run("Is OpenAI open?"):
        run.apply(event)
    short = Path(tempfile.mkdtemp(prefix="tt", dir="/tmp"))  # a path as long as a user's: ~/.local/state/…
    record = run.save(short / "20261205-063159-23540.jsonl")
    app = SnapshotApp(replay_config(ReplayEngine.from_record(record, speed=0), user_theme_dir=None))
    async with app.run_test(size=size, notifications=True) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the replay's end")
        await pilot.press("less_than_sign", "b", "T")  # two refusals at once: the newer one replaces the other
        await wait_for(pilot, lambda: len(app.screen.query("Toast")) == 1, what="one notice on screen")
        await pilot.pause(0.1)
        said = [t.message for t in app.toasts]
        assert f"A replay cannot branch: run `tokentui branch {record} --at 1 --token ID`" in said, said
        assert any(f"`tokentui branch {record} --at N --token ID` to try others" in n for n in said), said
        assert not any("FILE" in n for n in said), said
        assert not toasts_clear_of_the_readings(app)
    shutil.rmtree(short)
