"""Issue 11, the dashboard's fit: the five live readings at every size, what is hidden said on screen and in the
help, a key bar that never cuts a word, word wrap in the answer, a readable latency plot, a scrollable prompt
panel, the prefill clock, loading stages and the export paths. All on the scripted engine (tests/fakes.py)."""

from __future__ import annotations

import io
import re
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from rich.cells import cell_len
from textual.app import App

from fakes import ScriptedEngine, make_loader, screen_text, wait_for
from tokentui.core.runs.events import LoadProgress, PrefillProgress, PromptEvent, PromptPiece
from tokentui.core.settings import RunOptions
from tokentui.themes import THEME_VARIABLE_DEFAULTS
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.format import human_bytes
from tokentui.tui.keybar import entries, fit
from tokentui.tui.sizes import PARTS, plan, size_table
from tokentui.tui.panels import (ModelPanel, OutputPanel, OutputView, PromptPanel, ReadingsStrip,
                                 SpeedPanel, StatusLine)
from tokentui.tui.panels.readings import readings
from tokentui.tui.panels.speed import LatencyPlot
from tokentui.tui.screens import HelpScreen


class FitApp(TokentuiApp):
    CURSOR_BLINK = False


def make_app(engine=None, loader=None, **config) -> FitApp:
    config.setdefault("user_theme_dir", None)
    config.setdefault("recorder", None)
    return FitApp(DashboardConfig(load=loader or make_loader(engine or ScriptedEngine()), **config))


def status(app) -> str:
    return app.query_one(StatusLine).last_text.plain


def rendered(renderable, width: int = 200) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def lines_of(app) -> list[str]:
    return screen_text(app).splitlines()


# ---- A: the five readings at every size --------------------------------------------------------------------------

@pytest.mark.parametrize("size", [(80, 24), (100, 30)])
async def test_the_five_readings_are_on_screen_mid_run_with_numbers_from_the_state(size):
    engine = ScriptedEngine(pause_before={10})  # after step 9: 开's first two bytes (e5 bc) are held
    app = make_app(engine)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.steps == 10 and engine.paused, what="the pause at step 10")
        await pilot.pause(0.1)
        app.redraw()
        await pilot.pause(0.1)
        text = screen_text(app)
        state = app.state
        # the answer and the candidates with probabilities
        assert "Partly. Some weights are open." in text and "(▒" in text  # ▒: bytes held at the answer's end
        assert re.search(r"▶ \S+ +\d+ +\d+\.\d% +\d+\.\d%", text), text
        # the KV size, the latency and the pending bytes: one strip, numbers exactly the state's
        r = readings(state)
        assert r["kv_size"] == human_bytes(state.kv_bytes) and r["kv_tokens"] == f"{state.kv_tokens:,}"
        assert r["ms_step"] == f"{state.latency_stats()['last']:.1f}"
        assert r["tok_s"] == f"{state.latency_stats()['tok_s']:.1f}"
        assert state.pending == ("e5 bc", 1) and r["pending"] == "e5 bc"
        strip = next(line for line in text.splitlines() if "tok/s" in line)
        assert f"KV {human_bytes(state.kv_bytes)}" in strip and f"{state.kv_tokens:,} tok" in strip
        assert f"{r['ms_step']} ms" in strip and f"{r['tok_s']} tok/s" in strip
        assert "pending e5 bc" in strip
        # the prompt tokens and the status
        assert "13 prompt tokens" in text and "␣Open" in text
        assert "paused at step" in text
        # what a bigger terminal adds is said on screen
        hidden = plan(*size).hidden
        note = next(line for line in text.splitlines() if "bigger terminal" in line)
        assert all(p.short in note for p in hidden), note
        await pilot.press("q")


async def test_the_strip_says_none_when_nothing_is_held():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="done")
        await pilot.pause(0.1)
        assert "pending none" in app.query_one(ReadingsStrip).last_text.plain


SIZES = [(60, 20), (80, 24), (100, 30), (100, 48), (120, 30), (120, 36), (160, 48)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_panels_shown_follow_the_layout_table_and_the_help_lists_it(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="done")
        await pilot.pause(0.1)
        layout = plan(*size)
        for part in PARTS:
            if part.id:
                assert app.query_one(f"#{part.id}").display == part.shown(*size), part
        assert app.query_one(ReadingsStrip).display == layout.readings_strip
        template_shown = "Is OpenAI open?<|im_end|>" in app.query_one(PromptPanel).last_text.plain
        assert template_shown == ("template" in layout.shown)
        text = screen_text(app)
        assert "q quit" in text and "✓ done" in text  # every size: the status and the way out
        notes = [line for line in text.splitlines() if "bigger terminal" in line]
        assert len(notes) == (1 if layout.hidden else 0), notes  # what is hidden is said, once
        if notes and "more panels" not in notes[0]:
            assert all(p.short in notes[0] for p in layout.hidden), notes
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        help_text = rendered(app.screen.query_one("#help-sizes").content)
        for what, where in size_table():
            assert what in help_text and where in help_text, (what, where)


async def test_help_sizes_are_the_layout_tables():
    # the help's rows are made from the same Part records the app hides panels by
    rows = dict(size_table())
    for part in PARTS:
        assert rows[part.name] == part.where()
    assert plan(80, 24).readings_strip and not plan(160, 48).readings_strip
    assert plan(120, 36).shown >= {"model", "plot", "KV detail", "byte detail", "template"}


async def test_120x36_keeps_p95_tokens_per_second_the_model_totals_and_a_wide_answer():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="done")
        await pilot.pause(0.2)
        app.redraw()
        await pilot.pause(0.2)
        text = screen_text(app)
        stats = app.state.latency_stats()
        assert f"p95 {stats['p95']:.1f}" in text and f"{stats['tok_s']:.1f} tok" in text
        assert f"{app.state.scores:,} scores" in text  # the model panel's totals, its last line
        assert app.query_one(OutputPanel).size.width >= app.query_one(ModelPanel).size.width
        speed = app.query_one(SpeedPanel)
        assert "p95" in speed.last_text.plain


async def test_60x20_degrades_without_a_crash():
    app = make_app()
    async with app.run_test(size=(60, 20)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="done")
        await pilot.pause(0.1)
        text = screen_text(app)
        assert "✓ done" in text and "q quit" in text and re.search(r"\? (help|all keys|more)", text) and "tok/s" in text
        await pilot.press("q")
    assert app.return_code == 0


# ---- B: the key bar ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("width", [60, 80, 100, 160])
async def test_the_key_bar_shows_whole_entries_with_help_and_quit(width):
    app = make_app()
    async with app.run_test(size=(width, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="done")
        await pilot.pause(0.1)
        bar = lines_of(app)[-1].strip()
        shown = fit(width - 2)
        assert bar == "  ".join(f"{e.keys} {e.label}" for e in shown), bar  # nothing but whole entries
        # `?` always; where keys are left out it says that it leads to them
        assert bar.startswith("? all keys" if width == 60 else "? help" if width >= 160 else "? more") \
            and "q quit" in bar
        assert cell_len(bar) <= width - 2
    if width >= 160:
        assert len(shown) == len(entries())  # a wide terminal shows every key


def test_the_key_bar_drops_the_least_important_first():
    widths = [sum(e.width for e in fit(w)) for w in range(12, 200, 4)]
    assert widths == sorted(widths)
    narrow = {e.label for e in fit(40)}
    assert "quit" in narrow and narrow & {"more", "all keys"} and "palette" not in narrow  # ? says where the rest are


# ---- C: the answer wraps at word boundaries ----------------------------------------------------------------------

class OutputApp(App):
    def get_theme_variable_defaults(self):
        return dict(THEME_VARIABLE_DEFAULTS)

    def compose(self):
        yield OutputView(id="view")


def view_lines(view) -> list[str]:
    return ["".join(seg.text for seg in view.render_line(y)).rstrip() for y in range(view.size.height)]


REPRO = ["While", " OpenAI", " is", " a", " part", " of", " the", " A", "RC", "AR", " Foundation"]


async def test_the_answer_wraps_between_words_not_between_tokens():
    app = OutputApp()
    # 31 cells of text (a column each for the scrollbar and the pending marker): the old token-boundary wrap
    # gave "... of the A" / "RCAR Foundation" here
    async with app.run_test(size=(33, 6)) as pilot:
        view = app.query_one(OutputView)
        await pilot.pause()
        view.append([(t, 0.2 + 0.1 * n) for n, t in enumerate(REPRO)])
        await pilot.pause()
        lines = [line for line in view_lines(view) if line]
        assert lines == ["While OpenAI is a part of the", "ARCAR Foundation"], lines
        # the heat map still colours each token: the word made of three tokens has three colours
        view.heat = True
        await pilot.pause()
        segments = [seg for seg in view.render_line(1) if seg.text.strip()]
        word = [seg for seg in segments if seg.text in ("A", "RC", "AR")]
        assert [seg.text for seg in word] == ["A", "RC", "AR"] and len({seg.style for seg in word}) == 3


async def test_a_word_longer_than_the_line_breaks_and_wide_characters_wrap_whole():
    app = OutputApp()
    async with app.run_test(size=(14, 8)) as pilot:  # 12 cells of text
        view = app.query_one(OutputView)
        await pilot.pause()
        tokens = ["我爱", "我的猫", "，它很", "可爱。", " super", "califragilistic"]
        view.append([(t, 0.5) for t in tokens])
        await pilot.pause()
        lines = [line for line in view_lines(view) if line]
        assert all(cell_len(line) <= 12 for line in lines), lines
        assert "".join(lines) == "".join(tokens).replace(" ", ""), lines  # nothing lost, no space carried
        assert lines[:2] == ["我爱我的猫，", "它很可爱。"]  # CJK breaks between characters, never inside one
        assert lines[2] == "supercalifra" and lines[3] == "gilistic"
        view.clear()
        view.append([("abcdef", 0.5), (" (开放", 0.5), (")", 0.5)])  # 12 cells before ")": it must not go alone
        await pilot.pause()
        assert [line for line in view_lines(view) if line] == ["abcdef (开", "放)"]


# ---- D: the latency plot -----------------------------------------------------------------------------------------

class PlotApp(App):
    def get_theme_variable_defaults(self):
        return dict(THEME_VARIABLE_DEFAULTS)

    def compose(self):
        yield LatencyPlot(id="plot")


def axis_columns(plot) -> set[int]:
    return {line.index("┤") for line in rendered(plot.render(), plot.size.width).splitlines() if "┤" in line}


async def test_the_plot_window_fits_its_width_and_the_labels_never_move():
    app = PlotApp()
    async with app.run_test(size=(40, 10)) as pilot:
        plot = app.query_one(LatencyPlot)
        await pilot.pause()
        columns = set()
        for scale in (0.42, 74.0, 12_000.0):  # fast, typical, very slow steps
            points = [(i, scale * (1 + (i % 7) / 10)) for i in range(1, 801)]
            plot.draw(points, (255, 0, 0))
            await pilot.pause()
            assert len(plot.window) <= plot.size.width and plot.window[-1] == points[-1]
            assert len({len(label) for label in plot.labels}) == 1
            values = [float(label.replace(",", "").replace("k", "e3")) for label in plot.labels]
            assert values[0] == 0 and values[1] * 2 == pytest.approx(values[2]) and values[2] >= max(
                p[1] for p in plot.window)
            columns |= axis_columns(plot)
        assert len(columns) == 1, columns  # the y axis sits in the same column whatever the latencies


async def test_the_speed_panel_gives_the_whole_run_median_and_p95():
    engine = ScriptedEngine(options=RunOptions(max_new_tokens=300, ignore_eos=True))
    app = make_app(engine, options=engine.options)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=20, what="done")
        await pilot.pause(0.3)
        app.redraw()
        await pilot.pause(0.3)
        stats = app.state.latency_stats()
        speed = app.query_one(SpeedPanel)
        assert f"median {stats['median']:.1f}" in speed.last_text.plain
        assert f"p95 {stats['p95']:.1f}" in speed.last_text.plain
        window = speed.plot.window
        assert len(window) < 299 and window[-1][0] == app.state.plot_points[-1][0]
        assert f"steps {window[0][0]:,}–{window[-1][0]:,}" in speed.border_subtitle


# ---- E: a long prompt ---------------------------------------------------------------------------------------------

LONG_PROMPT = "\n".join(f"line {n} of a long file with several words on it" for n in range(700))


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_a_long_prompt_shows_its_chips_and_the_panel_scrolls(size):
    app = make_app(prompt=LONG_PROMPT)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="done")
        await pilot.pause(0.2)
        assert len(app.state.prompt.ids) > 6000
        panel = app.query_one(PromptPanel)
        text = screen_text(app)
        assert "<|im_start|>" in text and "␣long" in text  # token chips are on screen
        if size == (160, 48):
            assert re.search(r"… [\d,]+ more lines", text)  # the template text is elided, not filling the panel
        assert panel.max_scroll_y > 0 and panel.show_vertical_scrollbar
        panel.focus()
        await pilot.press("pagedown")
        await pilot.pause(0.1)
        assert panel.scroll_y > 0
        await pilot.press("end")
        await pilot.pause(0.1)
        assert panel.scroll_y == panel.max_scroll_y
        await pilot.press("home")
        await pilot.pause(0.1)
        assert panel.scroll_y == 0


# ---- F: the prefill clock and the loading stages ------------------------------------------------------------------

class SlowPrefillEngine(ScriptedEngine):
    """Sends the prompt, then prefill progress twice, then waits for `release` before the rest of the run."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.release = threading.Event()
        self.progressed = threading.Event()

    def _run(self, prompt, system, run_id):
        pieces = [PromptPiece(i, "␣w", False) for i in range(6985)]
        yield PromptEvent(text="w " * 6985, ids=[p.id for p in pieces], pieces=pieces, templated=True,
                          user_prompt=prompt)
        yield PrefillProgress(tokens_done=2048, tokens=6985, elapsed_ms=12_500.0)
        self.progressed.set()
        self.release.wait(20)


async def test_the_prefill_status_shows_a_ticking_clock_and_the_fraction():
    engine = SlowPrefillEngine()
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.prefill_progress is not None, timeout=10, what="prefill progress")
        await pilot.pause(0.1)
        line = status(app)
        assert "prefill" in line and "2,048 of 6,985 prompt tokens" in line and "29%" in line, line
        first = int(re.search(r"· ([\d,]+) s", line).group(1).replace(",", ""))
        assert first >= 12  # the engine's count (12.5 s) when it is ahead of the dashboard's clock
        await wait_for(pilot, lambda: int(re.search(r"· ([\d,]+) s", status(app)).group(1)) > first, timeout=4,
                       what="the clock to tick")
        engine.release.set()
        await pilot.press("q")


class NoProgressPrefillEngine(SlowPrefillEngine):
    """The same slow prefill, saying nothing of its progress."""

    def _run(self, prompt, system, run_id):
        for event in super()._run(prompt, system, run_id):
            if not isinstance(event, PrefillProgress):
                yield event


async def test_a_prefill_without_progress_still_ticks():
    engine = NoProgressPrefillEngine()
    app = make_app(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "prefill", timeout=10, what="prefill")
        await wait_for(pilot, lambda: re.search(r"· [1-9]\d* s", status(app)), timeout=4, what="a second shown")
        assert "reading 6,985 prompt tokens in one run" in status(app) and "%" not in status(app)
        engine.release.set()
        await pilot.press("q")


async def test_loading_names_each_stage_once_with_a_fraction_only_when_known():
    gate = threading.Event()
    seen: list[str] = []

    def load(progress):
        progress(LoadProgress("loading SmolLM2-135M-Instruct…", None))
        gate.wait(10)
        progress(LoadProgress("reading weights", 0.5))
        gate.wait(10)
        return ScriptedEngine()

    app = make_app(loader=load)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: "SmolLM2" in status(app), what="the first stage")
        seen.append(status(app))
        assert "loading loading" not in seen[0] and seen[0].startswith("◌ loading SmolLM2-135M-Instruct…")
        assert "%" not in seen[0]
        gate.set()
        await wait_for(pilot, lambda: app.state.phase != "loading" or "50%" in status(app), what="the fraction")
        await pilot.press("q")


# ---- G: export paths ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_export_shows_each_full_path_unbroken_on_one_line(monkeypatch, size):
    short = Path(tempfile.mkdtemp(prefix="tt"))  # a path short enough for an 80-column screen
    monkeypatch.chdir(short)
    try:
        await _export_and_look(size)
    finally:
        shutil.rmtree(short)


async def _export_and_look(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="done")
        await pilot.press("x")
        await wait_for(pilot, lambda: app.controller.last_export is not None, what="the export")
        await pilot.pause(0.2)
        path = str(app.controller.last_export)
        assert len(path) < 76, "the test needs a path that fits the screen"
        assert any(path in line for line in lines_of(app)), screen_text(app)
