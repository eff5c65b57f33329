"""A replay says so at every size (the status line read "● decoding · step 73" below 120 columns), offers only the
keys that work in its key bar, shows the recorded settings, refuses the rest at once in words for a user (`e` no
longer opens the editor first), and opens with the lens panel when the record carries the lens."""

from __future__ import annotations

import pytest

from fakes import ScriptedEngine, make_loader, screen_text, wait_for
from snapshot_apps import SnapshotApp
from snapshot_apps_explore import LensEngine
from tokentui.commands.replay import replay_config
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.run import Run
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui import DashboardConfig
from tokentui.tui.keybar import KeyBar
from tokentui.tui.panels import LensPanel, ModelPanel, SamplerPanel, StatusLine
from tokentui.tui.screens import PromptEditor

SIZES = [(80, 24), (100, 30), (160, 48)]
REFUSED_KEYS = ("tT", "pP", "kK", "g", "s", "e", "b")  # the sampler, the prompt, branching


def recorded(directory, engine=None, speed: float = 0.0) -> ReplayEngine:
    engine = engine or ScriptedEngine()
    run = Run(engine.facts)
    for event in engine.run("Is OpenAI open?"):
        run.apply(event)
    return ReplayEngine.from_record(run.save(directory / "run.jsonl"), speed=speed)


def notes(app) -> list[str]:
    return [str(n.message) for n in app.toasts]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_a_replay_says_so_and_offers_only_what_works_at_every_size(tmp_path, size):
    # slow enough to be caught mid-run: the status line says "replay" while it plays, not only at its end
    app = SnapshotApp(replay_config(recorded(tmp_path, speed=0.5), user_theme_dir=None))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "decoding", timeout=10, what="the replay playing")
        await pilot.pause(0.05)
        assert app.query_one(StatusLine).last_text.plain.startswith("▶ replay")
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=20, what="the replay's end")
        await pilot.press("less_than_sign")  # a held cursor: still said first
        await pilot.pause(0.1)
        lines = screen_text(app).splitlines()
        assert lines[-2].strip().startswith("▶ replay") and "viewing step 1" in lines[-2]
        keys = [entry.keys for entry in app.query_one(KeyBar).shown]
        assert "q" in keys and "?" in keys and "[]" in keys
        assert not set(keys) & set(REFUSED_KEYS), keys
        sampler = app.query_one(SamplerPanel).last_text.plain
        assert "recorded" in sampler and "next run" not in sampler and "applies" not in sampler


async def test_a_replay_refuses_keys_at_once_in_words_for_a_user(tmp_path):
    app = SnapshotApp(replay_config(recorded(tmp_path), user_theme_dir=None))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the replay's end")
        before = app.query_one(SamplerPanel).last_text.plain
        await pilot.press("e")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, PromptEditor)  # refused before any dialog opens
        assert any(n.startswith("A replay plays the recorded prompt") for n in notes(app)), notes(app)
        await pilot.press("T")
        await pilot.pause(0.1)
        assert app.query_one(SamplerPanel).last_text.plain == before
        assert any(n.startswith("A replay plays the recorded settings") for n in notes(app))
        await pilot.press("less_than_sign", "b")
        await pilot.pause(0.1)
        record = tmp_path / "run.jsonl"  # the real path, not a placeholder (issue 40)
        assert any(n.startswith(f"A replay cannot branch: run `tokentui branch {record} --at 1 --token ID`")
                   for n in notes(app)), notes(app)
        assert any(f"tokentui branch {record} --at N --token ID` to try others" in n for n in notes(app))
        assert not any("engine" in n.lower() for n in notes(app))  # no jargon


async def test_a_record_made_with_the_lens_replays_with_the_lens_panel(tmp_path):
    greedy = SamplerSettings(temperature=0.0)
    replay = recorded(tmp_path, LensEngine(sampler=greedy, options=RunOptions(logit_lens=True)))
    assert replay.options.logit_lens
    app = SnapshotApp(replay_config(replay, user_theme_dir=None))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the replay's end")
        await pilot.pause(0.1)
        assert app.query_one(LensPanel).display and not app.query_one(ModelPanel).display
        assert "on top from layer 8/12" in app.query_one(LensPanel).last_text.plain


async def test_a_record_made_without_the_lens_replays_without_it(tmp_path):
    replay = recorded(tmp_path)
    assert not replay.options.logit_lens
    app = SnapshotApp(replay_config(replay, user_theme_dir=None))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the replay's end")
        assert not app.query_one(LensPanel).display and app.query_one(ModelPanel).display
        await pilot.press("l")  # asked for anyway: the panel says why there is none, and how to record one
        await pilot.pause(0.2)
        text = app.query_one(LensPanel).last_text.plain
        assert "made without it; tokentui --logit-lens records it)" in text and "next step" not in text, text
        assert text.count("(") == 1, text  # one parenthesis deep (issue 40)


async def test_the_lens_turned_on_after_a_live_run_says_r_runs_it_again_not_the_next_step():
    app = SnapshotApp(DashboardConfig(load=make_loader(ScriptedEngine()), user_theme_dir=None, recorder=None))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.press("l")
        await pilot.pause(0.2)
        text = app.query_one(LensPanel).last_text.plain
        assert "(r runs the prompt again with it)" in text and "next step" not in text, text
