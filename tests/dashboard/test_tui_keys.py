"""Every key of the dashboard, driven through Textual's pilot against the scripted engine.

For the sampler keys: the sampler panel shows the new value at once, the engine holds it, and the next step
event carries it (settings_changed=True) — no restart.
"""

from __future__ import annotations

import pytest

from fakes import ANSWER_TEXT, ScriptedEngine, make_loader, screen_text, slow_engine, wait_for
from tokentui.core.runs.events import StepEvent
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.settings import SamplerSettings
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.panels import OutputPanel, PromptPanel, SamplerPanel, StatusLine
from tokentui.tui.panels.sampler import SHORT_NAMES, setting_value
from tokentui.tui.screens import HelpScreen, PromptEditor

SIZE = (100, 48)


def make_app(engine: ScriptedEngine, **config) -> TokentuiApp:
    config.setdefault("user_theme_dir", None)
    config.setdefault("sampler", engine.sampler)
    config.setdefault("options", engine.options)
    return TokentuiApp(DashboardConfig(load=make_loader(engine), **config))


async def decoding(pilot, engine: ScriptedEngine, steps: int = 2) -> None:
    await wait_for(pilot, lambda: len(engine.steps) >= steps and pilot.app.state.phase == "decoding",
                   what=f"{steps} steps")


def sampler_text(app) -> str:
    return " ".join(app.query_one(SamplerPanel).last_text.plain.split())


async def next_step_with(pilot, engine: ScriptedEngine, **expected) -> StepEvent:
    """The step after the latest update_sampler call: it carries `expected` and says settings_changed."""
    taken, _changes = engine.updates[-1]
    await wait_for(pilot, lambda: len(engine.steps) > taken, what="the next step")
    step = engine.steps[taken]
    assert step.settings_changed, step
    for key, value in expected.items():
        assert getattr(step.settings, key) == value, (key, step.settings)
    return step


SAMPLER_KEYS = [
    # key, starting settings, setting, expected value, text shown in the sampler panel
    ("t", SamplerSettings(temperature=0.7), "temperature", 0.6, "temperature 0.60"),
    ("T", SamplerSettings(temperature=0.7), "temperature", 0.8, "temperature 0.80"),
    ("t", SamplerSettings(temperature=0.1), "temperature", 0.0, "temperature 0.00 (greedy)"),
    ("p", SamplerSettings(top_p=0.9), "top_p", 0.85, "top-p 0.85"),
    ("P", SamplerSettings(top_p=0.9), "top_p", 0.95, "top-p 0.95"),
    ("P", SamplerSettings(top_p=0.95), "top_p", 1.0, "top-p 1.00 (off)"),
    ("K", SamplerSettings(top_k=0), "top_k", 1, "top-k 1"),
    ("k", SamplerSettings(top_k=1), "top_k", 0, "top-k off"),
    ("k", SamplerSettings(top_k=10), "top_k", 5, "top-k 5"),
    ("K", SamplerSettings(top_k=10), "top_k", 20, "top-k 20"),
    ("g", SamplerSettings(greedy=False), "greedy", True, "mode greedy"),
    ("M", SamplerSettings(min_p=0.0), "min_p", 0.05, "min-p 0.05"),  # the key min-p came with (core/samplers.py)
    ("m", SamplerSettings(min_p=0.05), "min_p", 0.0, "min-p 0.00 (off)"),
]


@pytest.mark.parametrize("key,start,setting,value,shown", SAMPLER_KEYS,
                         ids=[f"{k}-{s}-{v}" for k, _, s, v, _ in SAMPLER_KEYS])
async def test_sampler_key_changes_panel_engine_and_next_step(key, start, setting, value, shown):
    engine = slow_engine(sampler=start)
    app = make_app(engine, sampler=start)
    async with app.run_test(size=SIZE) as pilot:
        await decoding(pilot, engine)
        await pilot.press(key)
        assert getattr(engine.sampler, setting) == value
        assert shown in sampler_text(app)  # shown at once, before any step
        await next_step_with(pilot, engine, **{setting: value})
        # the panel names the setting, its old and new value and the step (numbered from 1) that first used it
        first_use = next(s for s in engine.steps if s.settings_changed).index + 1
        name = SHORT_NAMES[setting]
        await wait_for(pilot, lambda: f"step {first_use} {name} " in sampler_text(app)
                       and f"→{setting_value(setting, value)}" in sampler_text(app), what="the change shown")
        await pilot.press("q")


async def test_greedy_toggles_back_to_sampling_and_restores_temperature():
    engine = slow_engine(sampler=SamplerSettings(temperature=0.0))
    app = make_app(engine, sampler=SamplerSettings(temperature=0.0))
    async with app.run_test(size=SIZE) as pilot:
        await decoding(pilot, engine)
        assert engine.sampler.is_greedy
        await pilot.press("g")
        assert not engine.sampler.is_greedy and engine.sampler.temperature == 0.7
        step = await next_step_with(pilot, engine, greedy=False, temperature=0.7)
        assert step.greedy is False
        await pilot.press("g")
        assert engine.sampler.greedy is True
        assert "mode greedy" in sampler_text(app)


async def test_clamps_do_not_touch_the_engine():
    engine = slow_engine(sampler=SamplerSettings(temperature=0.0, top_p=1.0, top_k=100))
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await decoding(pilot, engine)
        await pilot.press("t", "P", "K")  # each at its end of the range already
        assert engine.sampler == SamplerSettings(temperature=0.0, top_p=1.0, top_k=100)
        await pilot.press("p")
        assert engine.sampler.top_p == 0.95
        app.client.set_sampler(app.client.sampler.with_changes(top_p=0.05))  # the client is the settings' one owner: the keys read it there
        await pilot.press("p")
        assert app.client.sampler.top_p == engine.sampler.top_p == 0.05


async def test_new_seed():
    engine = slow_engine(sampler=SamplerSettings(seed=7))
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await decoding(pilot, engine)
        await pilot.press("s")
        seed = engine.sampler.seed
        assert seed != 7
        assert f"seed {seed}" in sampler_text(app)
        await next_step_with(pilot, engine, seed=seed)


async def test_pause_step_resume():
    engine = slow_engine(delay=0.02)
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await decoding(pilot, engine)
        await pilot.press("space")
        assert engine.paused
        await pilot.pause(0.15)
        held = len(engine.steps)
        await pilot.pause(0.15)
        assert len(engine.steps) == held, "steps went on while paused"
        await wait_for(pilot, lambda: "paused at step" in app.query_one(StatusLine).last_text.plain,
                       what="paused in the status line")
        await pilot.press("n")
        await wait_for(pilot, lambda: len(engine.steps) == held + 1, what="one step")
        await pilot.pause(0.1)
        assert len(engine.steps) == held + 1
        await pilot.press("right")
        await wait_for(pilot, lambda: len(engine.steps) == held + 2, what="one more step")
        await pilot.press("space")
        assert not engine.paused
        await wait_for(pilot, lambda: len(engine.steps) > held + 4, what="steps after resume")
        assert "decoding" in app.query_one(StatusLine).last_text.plain


async def test_step_key_while_running_pauses_first():
    engine = slow_engine()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await decoding(pilot, engine)
        await pilot.press("n")
        assert engine.paused


async def test_pending_bytes_shown_while_a_character_is_incomplete():
    engine = ScriptedEngine(delay=0.3)
    app = make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: len(engine.steps) >= 1, what="step 0")
        await pilot.press("space")  # from here every step is let through with `n`
        assert engine.paused
        for n in range(len(engine.steps), 10):  # steps ..9: step 9 holds e5 bc of 开
            await pilot.press("n")
            await wait_for(pilot, lambda: len(engine.steps) == n + 1, what=f"step {n}")
        await wait_for(pilot, lambda: app.state.pending == ("e5 bc", 1), what="pending bytes")
        await pilot.pause(0.1)
        from tokentui.tui.panels import PendingPanel
        pending = app.query_one(PendingPanel).last_text.plain
        assert "e5 bc" in pending and "needs 1 more byte" in pending
        assert app.query_one(OutputPanel).view.pending_marker == "▒"
        await pilot.press("n")
        await wait_for(pilot, lambda: len(engine.steps) == 11, what="step 10")
        await pilot.pause(0.1)
        pending = app.query_one(PendingPanel).last_text.plain
        assert "开 = e5 bc 80 ← 2 tokens" in pending
        assert app.query_one(OutputPanel).view.text.endswith("(开")


async def test_restart_runs_the_same_prompt_and_seed():
    engine = slow_engine(sampler=SamplerSettings(seed=42))
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await decoding(pilot, engine, steps=5)
        await pilot.press("r")
        await wait_for(pilot, lambda: len(engine.runs) == 2 and app.state.steps >= 2, what="the second run")
        assert engine.runs == [("Is OpenAI open?", None)] * 2
        assert engine.max_active == 1, "two runs overlapped"
        assert engine.sampler.seed == 42
        assert app.state.runs_started == 2
        assert app.query_one(OutputPanel).view.text.startswith("Partly")


async def test_restart_while_paused():
    engine = slow_engine()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await decoding(pilot, engine)
        await pilot.press("space", "r")
        await wait_for(pilot, lambda: len(engine.runs) == 2 and app.state.steps >= 2, what="the second run")
        assert not engine.paused


async def test_edit_prompt_and_system_then_run():
    engine = slow_engine()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await decoding(pilot, engine)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptEditor), what="the prompt editor")
        editor = app.screen
        from textual.widgets import Input, TextArea
        editor.query_one(TextArea).text = "Why is the sky blue?"
        editor.query_one(Input).value = "Be brief."
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: len(engine.runs) == 2, what="the new run")
        assert engine.runs[-1] == ("Why is the sky blue?", "Be brief.")
        assert app.controller.prompt == "Why is the sky blue?" and app.controller.system == "Be brief."
        await wait_for(pilot, lambda: app.state.prompt is not None, what="the new prompt event")
        await pilot.pause(0.05)
        assert "sky" in app.query_one(PromptPanel).last_text.plain


async def test_edit_prompt_cancel_and_empty_prompt():
    engine = slow_engine()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await decoding(pilot, engine)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptEditor), what="the prompt editor")
        from textual.widgets import TextArea
        app.screen.query_one(TextArea).text = "   "
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, PromptEditor), "an empty prompt must not be run"
        await pilot.press("escape")
        assert not isinstance(app.screen, PromptEditor)
        assert len(engine.runs) == 1


async def test_heat_map_toggle():
    engine = ScriptedEngine()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="done")
        await pilot.pause(0.05)
        view = app.query_one(OutputPanel).view
        plain_styles = {seg.style for seg in view.render_line(0)}
        await pilot.press("h")
        assert view.heat
        assert "heat" in app.query_one(OutputPanel).border_subtitle
        heat_styles = {seg.style for seg in view.render_line(0)}
        assert len(heat_styles) > len(plain_styles), "tokens are not coloured"
        await pilot.press("h")
        assert not view.heat


async def test_token_id_toggle():
    engine = ScriptedEngine()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="done")
        await pilot.pause(0.05)
        panel = app.query_one(PromptPanel)
        assert "␣Open" in panel.last_text.plain and "5264" not in panel.last_text.plain
        await pilot.press("i")
        assert "␣Open·5264" in panel.last_text.plain
        assert "13 prompt tokens" in panel.border_subtitle
        await pilot.press("i")
        assert "5264" not in panel.last_text.plain


async def test_export_next_to_the_record(tmp_path):
    engine = ScriptedEngine()
    recorder = RunRecorder(tmp_path / "runs")
    app = make_app(engine, recorder=recorder)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="done")
        record = app.state.record_path
        assert record is not None and record.parent == tmp_path / "runs"
        await wait_for(pilot, lambda: "record" in app.query_one(StatusLine).last_text.plain, what="record path")
        await pilot.press("x")
        exported = record.with_name(record.stem + ".answer.txt")
        assert exported.read_text(encoding="utf-8") == ANSWER_TEXT + "\n"
        await pilot.pause()
        assert app.screen.paths == [str(exported), str(record)]  # the export dialog: full paths, one a line
    lines = record.read_text(encoding="utf-8").splitlines()
    assert '"event": "model"' in lines[0] and '"event": "done"' in lines[-1]


async def test_export_to_cwd_without_a_record(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    engine = ScriptedEngine()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="done")
        await pilot.press("x")
        files = list(tmp_path.glob("tokentui-answer-*.txt"))
        assert len(files) == 1 and files[0].read_text(encoding="utf-8") == ANSWER_TEXT + "\n"
        await pilot.pause()
        assert app.screen.paths == [str(files[0])] and "not recorded" in screen_text(app)


async def test_help_screen_lists_every_key():
    engine = ScriptedEngine()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help screen")
        from tokentui.tui.keys import KEYS
        await pilot.pause()
        text = " ".join(screen_text(app).split())
        assert len(KEYS) >= 17
        await pilot.press("end")  # the six steps come after the keys: at 48 rows, below them (the last keys too)
        await pilot.pause()
        text += " " + " ".join(screen_text(app).split())
        for needle in ("temperature", "top-p", "top-k", "min-p", "greedy", "seed", "pause", "one token",
                       "same seed", "edit the prompt", "Heat map", "token id", "Export", "Quit", "ctrl+p"):
            assert needle in text, needle
        assert "6 detokenize" in " ".join(screen_text(app).split())
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_every_binding_has_an_id_and_is_in_the_footer():
    engine = ScriptedEngine()
    app = make_app(engine)
    async with app.run_test(size=(200, 30)) as pilot:
        await pilot.pause()
        ids = {b.id for b in TokentuiApp.BINDINGS}
        assert all(i and i.startswith("tokentui.") for i in ids)
        shown = {binding.action for (_, binding, enabled, _) in app.active_bindings.values() if binding.show}
        from tokentui.tui.keys import KEYS
        assert {k.action for k in KEYS} <= shown


async def test_quit_stops_the_engine():
    engine = slow_engine()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await decoding(pilot, engine)
        await pilot.press("q")
        await pilot.pause(0.05)
    assert engine.stop_calls >= 1
    assert app.return_code == 0


async def test_ctrl_c_quits_and_stops_the_engine():
    engine = slow_engine()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await decoding(pilot, engine)
        await pilot.press("ctrl+c")
        await pilot.pause(0.05)
    assert engine.stop_calls >= 1 and app.return_code == 0
