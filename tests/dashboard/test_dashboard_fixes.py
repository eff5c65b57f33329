"""The dashboard's behaviour fixes of "fit and finish": load failures that can be fixed in place and exit non-zero,
the editor's honest system prompt, pause armed while loading, dialogs that pause the run, the sampler's change
history, the candidates' footer, the KV formula, held bytes dropped at the end, and step numbers that match the
token counts. Each test fails on the code before these fixes."""

from __future__ import annotations

import re
from dataclasses import replace

from fakes import FACTS, ScriptedEngine, make_loader, screen_text, slow_engine, wait_for
from tokentui.core.errors import ModelLoadError, SettingsError
from tokentui.core.runs.events import DoneEvent
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.panels import CandidatesPanel, KVPanel, ModelPanel, SamplerPanel
from tokentui.tui.screens import ErrorDialog, HelpScreen, ModelPicker, PromptEditor
from tokentui.tui.state import RunState

SIZE = (160, 48)


def make_app(load, **config) -> TokentuiApp:
    config.setdefault("user_theme_dir", None)
    return TokentuiApp(DashboardConfig(load=load, **config))


def text_of(app, panel) -> str:
    return app.query_one(panel).last_text.plain


# ---- defect 3: a failed load exits non-zero and can be fixed in the dashboard ----------------------------------

async def test_a_failed_load_quits_with_status_2_and_the_model_panel_says_so():
    load = make_loader(ScriptedEngine(), error=ModelLoadError("/nonexistent.gguf: no such file or folder"))
    app = make_app(load)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the error dialog")
        await pilot.press("escape")
        await pilot.pause()
        assert "no model loaded" in text_of(app, ModelPanel)
        assert "loading…" not in text_of(app, ModelPanel)
        await pilot.press("q")
    assert app.return_code == 2


async def test_the_error_dialog_changes_model_and_device_checked_first():
    engine = ScriptedEngine()
    launched: list[tuple[str, str]] = []

    def relaunch(model, device):
        launched.append((model, device))
        return make_loader(engine)

    def check(model, device):
        if device == "cuda":
            raise SettingsError("--device cuda: no CUDA GPU is visible to torch here; use --device cpu")

    load = make_loader(engine, error=SettingsError("--device cuda: no CUDA GPU is visible to torch here"))
    app = make_app(load, model="embedded", device="cuda", relaunch=relaunch, check=check)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the error dialog")
        await pilot.pause()
        assert "Model / device (m)" in screen_text(app)
        await pilot.press("m")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelPicker), what="the model picker")
        await pilot.press("ctrl+s")  # still cuda: refused in the dialog, nothing loaded
        await wait_for(pilot, lambda: "no CUDA GPU is visible" in screen_text(app), what="the check's message")
        assert isinstance(app.screen, ModelPicker)
        assert launched == []
        device = app.screen.query_one("#picker-device")
        device.value = "cpu"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run on the new device")
        assert launched == [("embedded", "cpu")]
        assert app.config.device == "cpu"
        await pilot.press("q")
    assert app.return_code == 0  # loaded in the end: a normal exit


def test_run_dashboard_prints_the_load_error_and_returns_non_zero(monkeypatch, capsys):
    from tokentui.tui import app as app_module

    load = make_loader(ScriptedEngine(), error=ModelLoadError("/x.gguf: no such file or folder"))

    config = DashboardConfig(load=load, user_theme_dir=None)

    def fake_run(self, *args, **kwargs):  # drive the app headless, press q once the dialog is up
        import asyncio

        async def go():
            async with self.run_test(size=(100, 30)) as pilot:
                await wait_for(pilot, lambda: isinstance(self.screen, ErrorDialog), what="the dialog")
                await pilot.press("q")
        asyncio.run(go())

    monkeypatch.setattr(app_module.TokentuiApp, "run", fake_run)
    from tokentui.tui.program import run_dashboard

    code = run_dashboard(config)
    assert code == 2
    assert "tokentui: /x.gguf: no such file or folder" in capsys.readouterr().err


# ---- defect 5: what an empty system prompt means, and the one in effect -----------------------------------------

async def test_the_editor_shows_the_models_default_system_prompt():
    default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    engine = ScriptedEngine(default_system=default)
    app = make_app(make_loader(engine))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptEditor), what="the editor")
        await pilot.pause()
        screen = screen_text(app)
        assert "empty: none" not in screen
        assert "puts in its default" in screen
        assert "in effect (template default): You are a helpful AI assistant named SmolLM" in screen
        app.screen.query_one("#system-text").focus()
        await pilot.press(*"Be terse.")  # typed: the label no longer says what empty means (issue 23 item 11)
        await pilot.pause()
        screen = screen_text(app)
        assert "in effect: Be terse." in screen
        assert "puts in its default" not in screen and "system prompt — yours" in screen
        for _ in "Be terse.":
            await pilot.press("backspace")
        await pilot.pause()
        assert "puts in its default" in screen_text(app)  # emptied again: what empty means, again


async def test_the_editor_says_when_the_template_adds_no_system_prompt():
    app = make_app(make_loader(ScriptedEngine(default_system=None)))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptEditor), what="the editor")
        await pilot.pause()
        assert "adds none" in screen_text(app) and "in effect: none" in screen_text(app)


# ---- rough edges ------------------------------------------------------------------------------------------------

async def test_space_while_loading_pauses_at_the_first_token():
    import threading

    release = threading.Event()
    engine = slow_engine(delay=0.01, steps=50)

    def load(progress):
        release.wait(5)
        return engine

    app = make_app(load, options=engine.options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "loading", what="loading")
        await pilot.press("space")
        assert app.controller.pause_armed
        release.set()
        await wait_for(pilot, lambda: app.state.steps == 1, what="the first token")
        await pilot.pause(0.3)
        assert app.state.steps == 1 and engine.paused  # held at the first token, to be inspected
        await pilot.press("n")
        await wait_for(pilot, lambda: app.state.steps == 2, what="one more step")
        await pilot.pause(0.2)
        assert app.state.steps == 2
        await pilot.press("q")


async def test_help_and_editor_pause_the_run_while_open_and_resume_after():
    engine = slow_engine(delay=0.02, steps=2000)
    app = make_app(make_loader(engine), options=engine.options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.steps >= 3, what="decoding")
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        assert engine.paused
        await pilot.pause()
        assert "generation paused while this is open" in screen_text(app)
        await pilot.pause(0.2)
        seen = app.state.steps
        await pilot.pause(0.3)
        assert app.state.steps == seen  # nothing goes on behind the dialog
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not engine.paused
        await wait_for(pilot, lambda: app.state.steps > seen + 2, what="the run going on")
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptEditor), what="the editor")
        assert engine.paused
        assert "paused while this is open" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not engine.paused
        # a run the user paused stays paused after a dialog
        await pilot.press("space")
        await pilot.pause(0.1)
        await pilot.press("question_mark")
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert engine.paused
        await pilot.press("q")


async def test_the_sampler_panel_names_each_change_and_keeps_the_last_few():
    engine = slow_engine(delay=0.03, steps=2000)
    app = make_app(make_loader(engine), options=engine.options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.steps >= 2, what="decoding")
        await pilot.press("T")
        await wait_for(pilot, lambda: len(app.state.settings_changes) == 1, what="the first change used")
        await pilot.press("p")
        await wait_for(pilot, lambda: len(app.state.settings_changes) == 2, what="the second change used")
        await pilot.pause(0.1)
        first, second = app.state.settings_changes
        text = text_of(app, SamplerPanel)
        assert f"step {first.step} temp 0.70→0.80" in text
        assert f"step {second.step} top-p 0.90→0.85" in text
        assert second.step > first.step
        # the steps named are the steps that first used the change
        assert engine.steps[first.step - 1].settings.temperature == 0.8
        assert engine.steps[first.step - 2].settings.temperature == 0.7
        await pilot.press("q")


async def test_candidates_footer_says_top_p_off_and_that_kept_mass_is_raw():
    engine = ScriptedEngine(sampler=SamplerSettings(temperature=0.7, top_p=1.0, top_k=5))
    app = make_app(make_loader(engine), sampler=engine.sampler)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.pause()
        text = text_of(app, CandidatesPanel)
        # at 160x48 the chain goes as rows (issue 38): the stages that ran, top-p not among them; the kept mass is raw
        assert re.search(r"^top-k +5 ", text, re.M) and not re.search(r"^top-p ", text, re.M), text
        assert "of raw p" in text
        await pilot.press("q")


async def test_the_kv_formula_multiplies_out_to_the_per_token_size():
    for facts in (FACTS, replace(FACTS, dtype="float32", kv_bytes_per_token=FACTS.kv_bytes_per_token * 2)):
        app = make_app(make_loader(ScriptedEngine(facts=facts)))
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
            await pilot.pause()
            formula = re.search(r"= 2×(\d+)\D+×(\d+)\D+×(\d+)×(\d+) B", text_of(app, KVPanel))
            assert formula, text_of(app, KVPanel)
            a, b, c, d = (int(x) for x in formula.groups())
            assert 2 * a * b * c * d == facts.kv_bytes_per_token
            await pilot.press("q")


async def test_step_numbers_match_the_token_count():
    app = make_app(make_loader(ScriptedEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.pause()
        tokens = app.state.done.tokens
        assert app.query_one(CandidatesPanel).border_subtitle.startswith(f"step {tokens}")
        assert f"answer       {tokens} tokens" in text_of(app, ModelPanel)
        await pilot.press("q")


def test_bytes_held_at_the_end_are_shown_as_dropped_not_as_a_replacement_character():
    state = RunState()
    state.start_run()
    engine = ScriptedEngine(options=RunOptions(max_new_tokens=10))
    for event in engine.run("Is OpenAI open?"):
        if isinstance(event, DoneEvent):
            event = replace(event, reason="length", dropped_hex="e5 bc", dropped_needed=1)
        state.apply(event)
    assert state.dropped == ("e5 bc", "incomplete character at the length limit")
    assert "\ufffd" not in state.answer_text


async def test_with_ignore_eos_the_end_token_stays_in_the_answer_marked():
    from tokentui.tui.panels import OutputPanel

    options = RunOptions(max_new_tokens=20, ignore_eos=True)
    engine = ScriptedEngine(options=options, keep_end_tokens=True)
    app = make_app(make_loader(engine), options=options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.pause()
        view = app.query_one(OutputPanel).view
        assert "(开放)<|im_end|>Partly." in view.text  # marked where the model wrote it, not dropped
        assert "<|im_end|>" in screen_text(app)
        await pilot.press("q")
    # without --ignore-eos the end token ends the run and is not part of the answer text
    app = make_app(make_loader(ScriptedEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.pause()
        assert "<|im_end|>" not in app.query_one(OutputPanel).view.text
        await pilot.press("q")


async def test_the_speed_panel_says_paused_time_is_not_counted():
    """Defect 2's dashboard half: the end's tokens/s is the engine's (paused time left out), and the panel says so."""
    from tokentui.tui.panels import SpeedPanel

    engine = ScriptedEngine()
    app = make_app(make_loader(engine))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        done = replace(app.state.done, paused_ms=6000.0, decode_tok_s=16.1)
        app.state.apply(done)
        app.redraw()
        await pilot.pause()
        text = app.query_one(SpeedPanel).last_text.plain
        assert "16.1 tokens/s" in text and "6.0 s paused, not counted" in text
        await pilot.press("q")
