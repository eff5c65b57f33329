"""Pure pieces of the dashboard: formatting, the top-k ladder, theme files, folding events into state, the
scripted engine itself, and the output view's append-only layout."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.app import App

from fakes import ANSWER_TEXT, ScriptedEngine, apply_sampler
from tokentui.core.runs.events import DoneEvent, StepEvent
from tokentui.core.settings import SamplerSettings
from tokentui.themes import BUILTIN_THEMES, THEME_VARIABLE_DEFAULTS, ThemeFileError, load_user_themes
from tokentui.tui.format import human_bytes, human_count, ms, p95, short_path
from tokentui.tui.keys import KEYS, TOP_K_STEPS, next_top_k
from tokentui.tui.panels import OutputView
from tokentui.tui.state import RunState


def test_human_units():
    assert human_count(135_000_000) == "135M"
    assert human_count(596_049_920) == "596M"
    assert human_count(1_540_000_000) == "1.54B"
    assert human_count(7_241_732_096) == "7.24B"
    assert human_count(999) == "999"
    assert human_bytes(114_688) == "112 KiB"
    assert human_bytes(2_981_888) == "2.8 MiB"
    assert human_bytes(512) == "512 B"
    assert ms(0.42) == "0.42 ms" and ms(8.31) == "8.3 ms" and ms(1234.0) == "1,234 ms"
    assert p95([float(i) for i in range(1, 101)]) == 95.0 and p95([]) is None


def test_short_path():  # a token's display form is tested in tests/unit/test_display_special.py
    path = Path.home() / "a" / "very" / "long" / "path" / "to" / "a" / "run" / "record.jsonl"
    assert short_path(path, 200).startswith("~")
    assert len(short_path("/x" * 100, 30)) == 30


def test_top_k_ladder():
    """K walks off → 1 → 2 → 5 → … → 100 and stops; k walks back down to off (k from off used to jump to 100
    while K did nothing)."""
    up, k = [], 0
    for _ in range(len(TOP_K_STEPS) + 2):
        k = next_top_k(k, +1)
        up.append(k)
    assert up == [1, 2, 5, 10, 20, 50, 100, 100, 100, 100]
    down = []
    for _ in range(len(TOP_K_STEPS) + 1):
        k = next_top_k(k, -1)
        down.append(k)
    assert down == [50, 20, 10, 5, 2, 1, 0, 0, 0]
    assert next_top_k(7, -1) == 5 and next_top_k(7, +1) == 10  # between notches
    assert "off → 1 → 2 → 5" in next(s.help for s in KEYS if s.id == "tokentui.top-k-up")


def test_key_table_ids_are_unique():
    ids = [k.id for k in KEYS]
    assert len(ids) == len(set(ids))
    keys = [key for k in KEYS for key in k.keys.split(",")]
    assert len(keys) == len(set(keys))


def test_builtin_themes_set_every_app_variable():
    assert set(BUILTIN_THEMES) == {"tokentui-dark", "tokentui-light", "tokentui-contrast"}
    for theme in BUILTIN_THEMES.values():
        assert set(THEME_VARIABLE_DEFAULTS) <= set(theme.variables), theme.name


def test_contrast_theme_uses_the_16_colour_palette():
    standard = {"#000000", "#aa0000", "#00aa00", "#aa5500", "#0000aa", "#aa00aa", "#00aaaa", "#aaaaaa",
                "#555555", "#ff5555", "#55ff55", "#ffff55", "#5555ff", "#ff55ff", "#55ffff", "#ffffff"}
    theme = BUILTIN_THEMES["tokentui-contrast"]
    colours = [theme.primary, theme.secondary, theme.accent, theme.foreground, theme.background,
               theme.surface, theme.panel, theme.success, theme.warning, theme.error,
               *[v for v in theme.variables.values() if v.startswith("#")]]
    assert {c.lower() for c in colours} <= standard


@pytest.mark.parametrize("content,problem", [
    ('primary = "#fff"\n', "missing name"),
    ('name = "a"\n', "missing primary"),
    ('name = "a b"\nprimary = "#fff"\n', "may not contain spaces"),
    ('name = "a"\nprimary = "#fff"\ndark = "yes"\n', "dark must be true or false"),
    ('name = "a"\nprimary = 12\n', "primary must be a colour string"),
    ('name = "a"\nprimary = "#fff"\nvariables = 3\n', "variables must be a table"),
    ('name = "a"\nprimary = "#fff"\n[variables]\nheat-low = 1\n', "variables.heat-low must be a string"),
    ('name = \n', "not valid TOML"),
])
def test_theme_file_problems_are_named(tmp_path, content, problem):
    (tmp_path / "bad.toml").write_text(content, encoding="utf-8")
    themes, errors = load_user_themes(tmp_path)
    assert themes == [] and len(errors) == 1
    assert isinstance(errors[0], ThemeFileError)
    message = str(errors[0])
    assert "bad.toml" in message and problem in message


def test_missing_theme_dir_is_fine(tmp_path):
    assert load_user_themes(tmp_path / "nope") == ([], [])
    assert load_user_themes(None) == ([], [])


def test_scripted_engine_plays_the_article():
    engine = ScriptedEngine()
    events = list(engine.run("Is OpenAI open?"))
    steps = [e for e in events if isinstance(e, StepEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.reason == "eos" and done.text == ANSWER_TEXT
    assert "".join(s.text for s in steps) == ANSWER_TEXT
    assert [s.pending_hex for s in steps if s.pending_hex] == ["e5 bc"]
    assert steps[0].candidates[0].piece == "Part" and len(events[0].ids) == 13
    assert done.scores == done.runs * 151_936


def test_scripted_engine_sampler():
    raw = [0.5, 0.3, 0.2]
    assert apply_sampler(raw, SamplerSettings(greedy=True)) == [1.0, 0.0, 0.0]
    kept = apply_sampler(raw, SamplerSettings(temperature=1.0, top_p=0.75))
    assert kept[2] == 0.0 and abs(sum(kept) - 1) < 1e-9
    assert apply_sampler(raw, SamplerSettings(temperature=1.0, top_p=1.0, top_k=1)) == [1.0, 0.0, 0.0]


def test_state_folds_a_run():
    engine = ScriptedEngine()
    state = RunState()
    state.facts = engine.facts
    state.start_run()
    for event in engine.run("Is OpenAI open?"):
        state.apply(event)
    assert state.phase == "done" and state.steps == 14 and state.model_runs == 14
    assert state.scores == 14 * 151_936
    assert state.answer_text == ANSWER_TEXT
    assert state.ttft_ms == 45.0 and len(state.decode_latencies) == 13
    stats = state.latency_stats()
    assert stats["last"] == state.decode_latencies[-1] and stats["tok_s"] > 0
    assert state.kv_growth == engine.facts.kv_bytes_per_token
    assert [c.char for c in state.multi_token_chars] == ["开"]
    assert state.pending == ("", 0)


class OutputApp(App):
    def get_theme_variable_defaults(self):
        return dict(THEME_VARIABLE_DEFAULTS)

    def compose(self):
        yield OutputView(id="view")


async def test_output_view_wraps_at_token_boundaries_and_appends_only():
    app = OutputApp()
    async with app.run_test(size=(20, 5)) as pilot:
        view = app.query_one(OutputView)
        await pilot.pause()
        width = view.answer.width
        tokens = [("Partly", 0.5), (".", 0.9), (" Some", 0.4), (" weights", 0.3), (" are", 0.9), (" open", 0.8),
                  (".\n", 0.9), ("开放", 0.9), ("x" * 30, 0.1)]
        view.append(tokens)
        assert view.text == "".join(t for t, _ in tokens)
        lines = ["".join(view.answer.texts[i][s:e] for i, s, e in line) for line in view.answer.lines]
        assert all(len(line) <= width for line in lines)
        assert lines[0] == "Partly. Some"  # " weights" moves to the next line whole, without its space
        assert lines[1].startswith("weights")
        assert any(line.startswith("开放") for line in lines)
        before = [list(line) for line in view.answer.lines]
        view.append([(" more", 0.5)])
        assert view.answer.lines[: len(before) - 1] == before[:-1]  # earlier lines untouched
        await pilot.resize_terminal(40, 5)
        await pilot.pause()
        assert view.answer.width > width and view.text.endswith(" more")


async def test_a_growing_answer_scrolls_and_moves_the_thumb_without_relaying_out_the_screen():
    """Growth updates the view's scroll range and scrollbar only (output_view.py says why); the first overflow, which
    brings the scrollbar in, is a real layout."""
    app = OutputApp()
    async with app.run_test(size=(30, 6)) as pilot:
        view = app.query_one(OutputView)
        await pilot.pause()
        layouts = []
        original = app.screen._refresh_layout

        def counting(*args, **kwargs):
            layouts.append(1)
            return original(*args, **kwargs)

        app.screen._refresh_layout = counting
        for i in range(60):  # a token per frame, as the app appends them; overflows: the scrollbar appears
            view.append([(f" word{i}", 0.5)])
            await pilot.pause()
        assert view.show_vertical_scrollbar and len(layouts) >= 1
        assert view.is_vertical_scroll_end and view.scroll_y > 0  # it followed the text past the first overflow
        layouts.clear()
        for batch in range(20):
            view.append([(f" more{batch}-{i}", 0.5) for i in range(6)])
            await pilot.pause()
            assert view.virtual_size.height == len(view.answer.lines)
            assert view.vertical_scrollbar.window_virtual_size == len(view.answer.lines)
            assert view.is_vertical_scroll_end and view.scroll_y == view.max_scroll_y > 0, (view.scroll_y, view.max_scroll_y, view.virtual_size, view.container_size, batch)
        assert layouts == []
        view.scroll_home(animate=False, immediate=True)  # the reader scrolls up: the view stays there
        view.append([(" later", 0.5)] * 12)
        await pilot.pause()
        assert view.scroll_y == 0 and not view.is_vertical_scroll_end
        view.scroll_end(animate=False, immediate=True)  # and back to the end: it follows again
        view.append([(" again", 0.5)] * 12)
        await pilot.pause()
        assert view.is_vertical_scroll_end and view.scroll_y == view.max_scroll_y
        last = "".join(view.answer.texts[i][s:e] for i, s, e in view.answer.lines[-1])
        assert last.strip() and last.strip() in "".join(s.text for s in view.render_line(view.size.height - 1))
