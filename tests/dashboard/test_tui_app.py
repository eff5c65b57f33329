"""The dashboard's life cycle and failure paths: loading, load errors, run errors, themes, command palette."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

from fakes import FACTS, ScriptedEngine, make_loader, screen_text, slow_engine, wait_for
from noting_app import NotingApp
from tokentui.core.errors import ModelLoadError
from tokentui.core.runs.events import LoadProgress
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.panels import OutputPanel, PromptPanel, SpeedPanel, StatusLine
from tokentui.tui.screens import ErrorDialog

SIZE = (100, 40)


def make_app(load, **config) -> NotingApp:
    config.setdefault("user_theme_dir", None)
    return NotingApp(DashboardConfig(load=load, **config))


def status(app) -> str:
    return app.query_one(StatusLine).last_text.plain


def errors(app) -> list[str]:
    return [n.message for n in app.toasts if n.severity == "error"]


# ---- loading -------------------------------------------------------------------------------------------------

async def test_load_progress_in_the_status_line_then_the_run_starts():
    release = threading.Event()
    engine = ScriptedEngine()

    def load(progress):
        progress(LoadProgress("converting GGUF", 0.25))
        release.wait(5)
        return engine

    app = make_app(load)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "25%" in status(app), what="load progress")
        assert "loading" in status(app) and "converting GGUF" in status(app)
        release.set()
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        assert engine.runs == [("Is OpenAI open?", None)]


async def test_loader_error_shows_a_dialog_and_the_app_stays_usable():
    load = make_loader(ScriptedEngine(), error=ModelLoadError("no model named 'nope': try --model PATH"),
                       fail_times=1)
    app = make_app(load)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the error dialog")
        await pilot.pause()
        assert "no model named 'nope': try --model PATH" in screen_text(app)
        await pilot.press("escape")
        assert not isinstance(app.screen, ErrorDialog)
        assert "model not loaded" in status(app)
        await pilot.press("h", "i", "question_mark", "escape")  # still responsive
        await pilot.press("r")  # retry: the loader succeeds the second time
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run after retry")
        assert load.calls["n"] == 2


async def test_loader_error_dialog_retry_and_quit_buttons():
    load = make_loader(ScriptedEngine(), error=RuntimeError("CUDA driver too old"))
    app = make_app(load)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the error dialog")
        await pilot.pause()
        assert "RuntimeError: CUDA driver too old" in screen_text(app)
        await pilot.click("#retry")
        await wait_for(pilot, lambda: load.calls["n"] == 2 and isinstance(app.screen, ErrorDialog),
                       what="the second failure")
        await pilot.click("#quit")
        await pilot.pause()
    assert app.return_code == 1  # quitting with no model loaded is a failure, not a normal exit


async def test_quit_while_loading_does_not_wait_for_the_loader():
    never = threading.Event()

    def load(progress):
        never.wait(30)
        raise ModelLoadError("unreachable")

    app = make_app(load)
    started = time.monotonic()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "loading" in status(app), what="loading")
        await pilot.press("q")
    assert time.monotonic() - started < 5
    never.set()


async def test_keys_before_the_model_is_loaded():
    release = threading.Event()
    engine = slow_engine()

    def load(progress):
        release.wait(5)
        return engine

    app = make_app(load, options=engine.options)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("T", "space", "n", "x")  # sampler keys work; run keys say why not
        assert app.controller.sampler.temperature == 0.8
        release.set()
        await wait_for(pilot, lambda: len(engine.steps) >= 1, what="the run")
        assert engine.sampler.temperature == 0.8  # applied to the engine once loaded


# ---- run failures --------------------------------------------------------------------------------------------

async def test_error_event_ends_the_run_with_a_message():
    engine = ScriptedEngine(fail_at=3)
    app = make_app(make_loader(engine))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the error dialog")
        await pilot.pause()
        assert app.state.phase == "error"
        assert "error at step 4" in status(app) and "NaN" in status(app)  # 3 tokens out, the 4th failed
        text = screen_text(app)
        assert "The run failed at step 4" in text and "NaN in the logits at step 4" in text
        assert app.query_one(OutputPanel).view.text == "Partly."
        await pilot.press("r")  # the dialog's retry: the same prompt again
        await wait_for(pilot, lambda: len(engine.runs) == 2 and isinstance(app.screen, ErrorDialog), what="rerun")
        await pilot.press("e")  # edit the prompt from the dialog
        await wait_for(pilot, lambda: type(app.screen).__name__ == "PromptEditor", what="the prompt editor")


async def test_engine_exception_reaches_the_status_line():
    engine = ScriptedEngine(raise_at=2)
    app = make_app(make_loader(engine))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the error dialog")
        await pilot.pause()
        assert "RuntimeError: scripted crash at step 3" in status(app)
        assert "RuntimeError: scripted crash at step 3" in screen_text(app)
        await pilot.press("escape")  # the app survives and can run again
        assert not isinstance(app.screen, ErrorDialog)
        await pilot.press("r")
        await wait_for(pilot, lambda: len(engine.runs) == 2, what="rerun")


async def test_empty_prompt_error():
    engine = ScriptedEngine()
    app = make_app(make_loader(engine), prompt="   ")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the prompt error")
        await pilot.pause()
        assert "The prompt is empty" in status(app) and "The prompt is empty" in screen_text(app)
        await pilot.press("e")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "PromptEditor", what="the prompt editor")
        from textual.widgets import TextArea
        app.screen.query_one(TextArea).text = "Is OpenAI open?"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.state.phase == "done", what="the fixed run")


async def test_raw_prompt_notice():
    engine = ScriptedEngine(chat_template=False)
    app = make_app(make_loader(engine))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="done")
        await pilot.pause(0.05)
        panel = app.query_one(PromptPanel)
        assert "no chat template" in panel.last_text.plain
        assert "raw prompt" in panel.border_subtitle
        assert any("raw prompt" in n.message for n in app.toasts)


async def test_trust_remote_code_warning():
    engine = ScriptedEngine(facts=replace(FACTS, trust_remote_code=True))
    app = make_app(make_loader(engine))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="done")
        await pilot.pause(0.05)
        assert "trust-remote-code" in status(app)


async def test_a_long_answer_streams_append_only():
    """4,000 tokens as fast as the fake can make them: every token reaches the output, laid out once."""
    from tokentui.core.settings import RunOptions

    engine = ScriptedEngine(options=RunOptions(max_new_tokens=4000, ignore_eos=True))
    app = make_app(make_loader(engine), options=engine.options)
    async with app.run_test(size=(160, 48)) as pilot:
        view = app.query_one(OutputPanel).view
        laid_out = []
        original = view.answer.lay_out  # every token's layout, first or after a resize
        view.answer.lay_out = lambda index: (laid_out.append(index), original(index))[1]
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=600, what="4,000 tokens")  # a loaded CI box
        await pilot.pause(0.1)
        assert app.state.steps == 4000 and view.token_count == 4000
        assert view.text == app.state.answer_text
        assert sorted(laid_out) == list(range(4000)), "a token was laid out twice (re-render from scratch)"
        assert len(app.state.plot_points) == 512  # bounded history


# ---- themes --------------------------------------------------------------------------------------------------

GOOD_THEME = """
name = "paper"
primary = "#268bd2"
background = "#fdf6e3"
surface = "#fdf6e3"
panel = "#eee8d5"
foreground = "#586e75"
dark = false

[variables]
heat-low = "#dc322f"
heat-high = "#859900"
"""


async def test_bad_theme_files_are_reported_and_the_app_keeps_running(tmp_path):
    (tmp_path / "broken.toml").write_text('name = "x"\nprimary = ', encoding="utf-8")
    (tmp_path / "colour.toml").write_text('name = "y"\nprimary = "not-a-colour"\n', encoding="utf-8")
    (tmp_path / "typo.toml").write_text('name = "z"\nprimary = "#fff"\nforground = "#000"\n', encoding="utf-8")
    (tmp_path / "paper.toml").write_text(GOOD_THEME, encoding="utf-8")
    app = make_app(make_loader(ScriptedEngine()), user_theme_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        messages = errors(app)
        assert any("broken.toml" in m and "not valid TOML" in m for m in messages), messages
        assert any("colour.toml" in m and "not a colour" in m for m in messages), messages
        assert any("typo.toml" in m and "forground" in m for m in messages), messages
        assert "paper" in app.available_themes and "z" not in app.available_themes
        assert app.theme == "tokentui-dark"


async def test_user_theme_selected_by_name(tmp_path):
    (tmp_path / "paper.toml").write_text(GOOD_THEME, encoding="utf-8")
    app = make_app(make_loader(ScriptedEngine()), user_theme_dir=tmp_path, theme="paper")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        assert app.theme == "paper"
        assert app.theme_variables["heat-low"] == "#dc322f"
        assert app.theme_variables["special-token"]  # default filled in for variables the file leaves out
        assert not errors(app)


async def test_unknown_theme_name_falls_back_with_a_notice():
    app = make_app(make_loader(ScriptedEngine()), theme="nope")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        assert app.theme == "tokentui-dark"
        assert any("Unknown theme 'nope'" in m for m in errors(app))


async def test_theme_switch_from_the_command_palette_and_the_plot_follows():
    app = make_app(make_loader(ScriptedEngine()))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.pause(0.3)
        plot = app.query_one(SpeedPanel).plot
        dark_colour = plot.colour
        await pilot.press("ctrl+p")
        await pilot.press(*"tokentui-light")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.theme == "tokentui-light", what="the light theme")
        await wait_for(pilot, lambda: plot.colour != dark_colour, what="the plot recoloured")
        from textual.color import Color
        assert Color(*plot.colour) == Color.parse(app.current_theme.primary)


async def test_command_palette_runs_actions():
    app = make_app(make_loader(ScriptedEngine()))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.press("ctrl+p")
        await pilot.press(*"heat map")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.controller.heat, what="heat map on")


async def test_command_palette_lists_every_action_and_the_themes():
    from tokentui.tui.commands import TokentuiCommands
    from tokentui.tui.keys import KEYS

    app = make_app(make_loader(ScriptedEngine()))
    async with app.run_test(size=SIZE):
        provider = TokentuiCommands(app.screen)
        titles = [hit.text async for hit in provider.discover()]
        for spec in KEYS:
            if spec.action != "command_palette":
                assert any(t.startswith(spec.title) for t in titles), spec.title
        for name in ("tokentui-dark", "tokentui-light", "tokentui-contrast"):
            assert any(name in t for t in titles), name


def test_run_dashboard_runs_the_app_and_returns_its_exit_code(monkeypatch, tmp_path):
    """The CLI's entry point: runs until the user quits (here: a headless pilot presses q) and returns 0."""
    from tokentui.core.runs.record_writer import RunRecorder
    from tokentui.tui import run_dashboard

    engine = slow_engine()
    original_run = TokentuiApp.run

    async def press_q(pilot):
        await wait_for(pilot, lambda: len(engine.steps) >= 2, what="a few steps")
        await pilot.press("q")

    def headless_run(self, *args, **kwargs):
        return original_run(self, headless=True, size=(80, 24), auto_pilot=press_q)

    monkeypatch.setattr(TokentuiApp, "run", headless_run)
    config = DashboardConfig(load=make_loader(engine), options=engine.options, user_theme_dir=None,
                             recorder=RunRecorder(tmp_path))
    assert run_dashboard(config) == 0
    assert engine.stop_calls >= 1
    deadline = time.monotonic() + 5
    while engine.active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.active == 0, "the generation thread is still running"
    (record,) = [p for p in tmp_path.glob("*.jsonl") if not p.name.endswith(".tree.jsonl")]
    assert '"reason": "stopped"' in record.read_text(encoding="utf-8").splitlines()[-1]
    (tree,) = tmp_path.glob("*.tree.jsonl")  # the tree of this prompt's runs names the record
    assert record.name in tree.read_text(encoding="utf-8")


async def test_every_available_theme_renders():
    """Every theme offered (tokentui's, and the user's, which may leave variables out: the defaults fill in)."""
    app = make_app(make_loader(ScriptedEngine()))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.press("h")
        for name in sorted(app.available_themes):
            app.theme = name
            await pilot.pause()
        assert app.is_running
