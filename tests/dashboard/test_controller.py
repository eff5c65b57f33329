"""The dashboard's controller (tui/controller.py) on its own: plain Python, a recording View instead of the screen,
the scripted engine behind an in-process client. What a key does is decided here; the app only paints."""

from __future__ import annotations

import asyncio

import pytest

from fakes import ScriptedEngine, make_loader
from tokentui.core.errors import SettingsError
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.run import Run
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui.config import DashboardConfig
from tokentui.tui.controller import DashboardController
from tokentui.commands.replay import replay_config


class RecordingView:
    """The controller's View, recording what it was asked to do."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def repaint(self, now: bool = True) -> None:
        self.calls.append(("repaint", now))

    def relayout(self) -> None:
        self.calls.append(("relayout",))

    def clear_answer(self) -> None:
        self.calls.append(("clear_answer",))

    def notify(self, message: str, severity: str = "information", timeout: float = 5.0) -> None:
        self.calls.append(("notify", message, severity))

    def run_failed(self, title: str, message: str) -> None:
        self.calls.append(("run_failed", title, message))

    def load_failed(self, message: str) -> None:
        self.calls.append(("load_failed", message))

    def show_fanout(self, fanout) -> None:
        self.calls.append(("show_fanout", fanout))

    def fanout_changed(self) -> None:
        self.calls.append(("fanout_changed",))

    def scored(self, summary) -> None:
        self.calls.append(("scored", summary))

    def notes(self, severity: str | None = None) -> list[str]:
        return [c[1] for c in self.calls if c[0] == "notify" and (severity is None or c[2] == severity)]


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def loaded(engine, **config) -> tuple[DashboardController, RecordingView]:
    view = RecordingView()
    config.setdefault("sampler", engine.sampler)
    config.setdefault("options", engine.options)
    controller = DashboardController(DashboardConfig(load=make_loader(engine, stages=0), user_theme_dir=None,
                                                     **config), view)
    await controller.load()
    return controller, view


async def test_a_temperature_key_is_one_settings_object_from_the_key_to_the_engine():
    engine = ScriptedEngine(delay=0.02, options=RunOptions(max_new_tokens=200, ignore_eos=True))
    controller, view = await loaded(engine)
    try:
        await until(lambda: len(controller.state.run) >= 2)
        controller.temperature(+1)
        asked = controller.sampler
        assert asked.temperature == 0.8
        taken, settings = engine.updates[-1]
        assert settings is asked  # not rebuilt, not re-validated on the way: the same object
        await until(lambda: any(s.settings is asked for s in engine.steps))
        assert ("repaint", True) in view.calls
    finally:
        controller.close()


async def test_a_setting_out_of_range_is_one_line_and_changes_nothing():
    engine = ScriptedEngine()
    controller, view = await loaded(engine)
    try:
        before = controller.sampler
        assert not controller.change_sampler(top_p=1.5)
        assert controller.sampler is before and engine.updates == []
        assert view.notes("error") == ["top-p must be in (0, 1] (1 = off), got 1.5"]
    finally:
        controller.close()


async def test_greedy_toggles_back_to_the_temperature_it_left():
    engine = ScriptedEngine(sampler=SamplerSettings(temperature=0.9))
    controller, _ = await loaded(engine)
    try:
        controller.toggle_greedy()
        assert controller.sampler.is_greedy
        controller.toggle_greedy()
        assert not controller.sampler.is_greedy and controller.sampler.temperature == 0.9
    finally:
        controller.close()


async def test_forward_onto_the_newest_step_rejoins_live():
    controller, _ = await loaded(ScriptedEngine())
    try:
        await until(lambda: controller.state.phase == "done")
        controller.move_cursor(-1)
        assert controller.state.cursor == len(controller.state.run) - 2
        controller.move_cursor(+1)
        assert controller.state.live
    finally:
        controller.close()


async def test_a_replay_refuses_what_it_cannot_do_in_words_for_a_user(tmp_path):
    engine = ScriptedEngine()
    run = Run(engine.facts)
    for event in engine.run("Is OpenAI open?"):
        run.apply(event)
    replay = ReplayEngine(run, speed=0)
    view = RecordingView()
    controller = DashboardController(replay_config(replay, user_theme_dir=None), view)
    await controller.load()
    try:
        await until(lambda: controller.state.phase == "done")
        assert controller.replaying
        assert not controller.change_sampler(temperature=1.0)
        assert controller.step_to_branch() is None
        notes = view.notes()
        assert any("A replay plays the recorded settings" in n for n in notes)
        assert any(n.startswith("A replay cannot branch: run `tokentui branch FILE --at 14 --token ID`")
                   for n in notes)
        assert "This engine cannot branch" not in " ".join(notes)
    finally:
        controller.close()


async def test_turning_the_lens_on_after_the_run_says_how_to_get_it():
    controller, view = await loaded(ScriptedEngine())
    try:
        await until(lambda: controller.state.phase == "done")
        controller.toggle_lens()
        assert controller.lens_on and controller.client.options.logit_lens
        assert view.notes()[-1] == "The lens shows from the next run: r runs the prompt again with it"
        assert ("relayout",) in view.calls
    finally:
        controller.close()


async def test_a_failed_load_keeps_its_kind_for_the_exit_status():
    from tokentui.core.errors import ModelLoadError

    view = RecordingView()
    controller = DashboardController(DashboardConfig(load=make_loader(error=ModelLoadError("no such model")),
                                                     user_theme_dir=None), view)
    await controller.load()
    assert controller.state.phase == "load-failed" and ("load_failed", "no such model") in view.calls
    assert controller.exit_code == 2
    controller.close()


async def test_export_while_loading_leaves_the_loading_status_alone():
    view = RecordingView()
    gate = asyncio.Event()

    controller = DashboardController(DashboardConfig(load=make_loader(ScriptedEngine(), delay=0.5),
                                                     user_theme_dir=None), view)
    loading = asyncio.ensure_future(controller.load())
    await asyncio.sleep(0.1)
    assert controller.state.phase == "loading"
    assert controller.export() is None and view.notes() == []  # nothing said over the loading status
    await loading
    controller.close()
    gate.set()


@pytest.mark.parametrize("bad", [{"temperature": -1}, {"top_k": -2}, {"seed": -3}])
def test_settings_are_checked_once_where_they_are_built(bad):
    with pytest.raises(SettingsError):
        SamplerSettings().with_changes(**bad)
