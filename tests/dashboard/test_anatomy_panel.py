"""The one-pass panel (issue 16) in the dashboard, through Textual's pilot against the scripted engine: `a` shows
and hides it and turns the engine's stage timing on and off with it; it is on by default at ≥160×48 in a row of
its own; its rows are core/model/observe/anatomy.py's stages for the step in view (the cursor moves it); its last line adds the
parts up against the latency; a step without timing and an architecture it cannot take apart are said plainly.
The panel's helpers are checked on hand-made steps."""

from __future__ import annotations

from dataclasses import replace

from fakes import FACTS, make_loader, screen_text, wait_for
from snapshot_apps_anatomy import TimedEngine
from tokentui.core.model.observe.anatomy import Stage, one_pass
from tokentui.core.runs.events import StepEvent, StepTiming
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.sizes import PARTS, hidden_note, plan, size_table
from tokentui.tui.panels.anatomy import NO_TIMING, AnatomyPanel, part_marks, part_times, split_at
from tokentui.tui.panels.anatomy_text import device_label, distribution_line, shape_text, shown_name, timing_sum


def make_app(engine, **config) -> TokentuiApp:
    config.setdefault("user_theme_dir", None)
    config.setdefault("recorder", None)
    config.setdefault("sampler", engine.sampler)
    config.setdefault("options", engine.options)
    return TokentuiApp(DashboardConfig(load=make_loader(engine), **config))


def shown(app, widget_id: str) -> bool:
    return app.query_one(f"#{widget_id}").display


def panel_text(app) -> str:
    panel = app.anatomy_panel
    assert panel is not None, "no one-pass panel on screen"
    return panel.last_text.plain


async def settle(pilot) -> None:
    await pilot.pause(0.1)
    pilot.app.redraw()
    await pilot.pause(0.05)


# ---- the key and the layout -------------------------------------------------------------------------------------

async def test_a_shows_it_in_the_model_panels_place_and_turns_the_stage_timing_on_and_off():
    engine = TimedEngine(delay=0.05, options=RunOptions(max_new_tokens=60, ignore_eos=True))
    app = make_app(engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: len(app.state.run) >= 2, what="2 steps")
        assert app.anatomy_panel is None and not app.client.options.time_stages  # off by default at 120×40
        assert not engine.options.time_stages
        await pilot.press("a")
        await pilot.pause(0.05)
        assert shown(app, "anatomy-side") and not shown(app, "anatomy") and not shown(app, "model")
        assert shown(app, "candidates")
        assert app.client.options.time_stages and engine.options.time_stages  # the engine times the stages now
        await wait_for(pilot, lambda: "forward" in panel_text(app), what="the panel's rows")
        await pilot.press("a")
        await pilot.pause(0.05)
        assert app.anatomy_panel is None and shown(app, "model")
        assert not app.client.options.time_stages and not engine.options.time_stages
        await pilot.press("q")


async def test_on_by_default_at_160x48_in_a_row_of_its_own_and_a_turns_it_off():
    engine = TimedEngine()
    app = make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await settle(pilot)
        assert shown(app, "anatomy") and not shown(app, "anatomy-side")
        assert shown(app, "model") and shown(app, "candidates")  # nothing gives way but 3 rows of the bottom row
        assert engine.options.time_stages  # asked for before the model loaded: handed over with the load
        assert app.query_one("#bottom").size.height == 10
        text = screen_text(app)
        assert "bigger terminal" not in text
        await pilot.press("a")
        await pilot.pause(0.05)
        assert app.anatomy_panel is None and not engine.options.time_stages
        assert app.query_one("#bottom").size.height == 13
        await pilot.press("a")
        await pilot.pause(0.05)
        assert shown(app, "anatomy") and engine.options.time_stages
        await pilot.press("q")


async def test_at_80x24_it_takes_the_candidates_place_and_shares_it_with_the_lens():
    engine = TimedEngine()
    app = make_app(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.press("a")
        await settle(pilot)
        assert shown(app, "anatomy-side") and not shown(app, "candidates")
        assert "no timing" not in panel_text(app)
        await pilot.press("l")  # the lens, turned on last, takes the place; the panel waits behind it
        await pilot.pause(0.05)
        assert shown(app, "lens") and app.anatomy_panel is None and not shown(app, "candidates")
        assert app.anatomy_on() and not app.client.options.time_stages
        await pilot.press("a")  # on but waiting: a brings it forward
        await pilot.pause(0.05)
        assert shown(app, "anatomy-side") and not shown(app, "lens") and app.controller.lens_on
        assert app.client.options.time_stages
        await pilot.press("l")  # the lens off: the panel keeps the place
        await pilot.pause(0.05)
        assert shown(app, "anatomy-side") and not shown(app, "candidates")
        await pilot.press("a")
        await pilot.pause(0.05)
        assert app.anatomy_panel is None and shown(app, "candidates") and not app.client.options.time_stages
        await pilot.press("q")


def test_the_layout_table_lists_it_and_never_counts_it_as_hidden():
    part = next(p for p in PARTS if p.id == "anatomy")
    assert part.key == "a" and part.where() == "≥160×48"
    assert "one pass" in plan(160, 48).shown and "one pass" not in plan(159, 48).shown
    assert all(p.id != "anatomy" for p in plan(80, 24).hidden)
    assert "one pass" not in hidden_note(plan(80, 24))
    assert (part.name, "≥160×48") in size_table()


# ---- what it shows ------------------------------------------------------------------------------------------------

def stage_cells(stage: Stage) -> list[str]:
    return [shown_name(stage)[:8], shape_text(stage.shape)]


async def test_the_rows_are_the_stages_of_the_step_in_view_and_follow_the_cursor():
    engine = TimedEngine(sampler=SamplerSettings(temperature=0.7, top_k=5, top_p=0.9))
    app = make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await settle(pilot)
        panel = app.query_one("#anatomy", AnatomyPanel)
        last = app.state.run.last
        stages = one_pass(app.state.facts, last.kv_tokens, last, last.settings)
        assert isinstance(stages, list) and stages
        text = panel.last_text.plain
        for stage in stages:
            for cell in stage_cells(stage):
                assert cell in text, (cell, text)
        assert panel.border_subtitle == f"step {last.index + 1} · LM head tied"
        await pilot.press("left_square_bracket", "left_square_bracket")
        await settle(pilot)
        step = app.state.view_step
        assert step.index == last.index - 2
        assert panel.border_subtitle == f"viewing step {step.index + 1} · LM head tied"
        then = one_pass(app.state.facts, step.kv_tokens, step, step.settings)
        text = panel.last_text.plain
        assert [shape_text(s.shape) for s in then] != [shape_text(s.shape) for s in stages]  # the KV grew since
        for stage in then:
            for cell in stage_cells(stage):
                assert cell in text, (cell, text)
        assert timing_sum(step) in text
        await pilot.press("less_than_sign")  # the first step: prefill, the whole prompt through the model
        await settle(pilot)
        assert panel.border_subtitle == "viewing step 1 · prefill · LM head tied"
        assert "[1, 13, 1024]" in panel.last_text.plain and "104 B host → device" in panel.last_text.plain
        await pilot.press("q")


async def test_the_last_line_adds_the_parts_up_to_the_latency():
    engine = TimedEngine()
    app = make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await settle(pilot)
        last = app.state.run.last
        t = last.timing
        expected = (f"forward {t.forward_ms:.1f} + select 1.2 + copy 0.30 + detok 0.50 = {last.latency_ms:.1f} "
                    f"of {last.latency_ms:.1f} ms · waited 0.40 ms for the UI")
        assert expected in panel_text(app)
        assert "96 B device → host" in panel_text(app)
        await pilot.press("q")


async def test_a_step_without_timing_says_so():
    engine = TimedEngine(untimed=range(0, 100))
    app = make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await settle(pilot)
        text = panel_text(app)
        assert NO_TIMING in text and "forward 1" not in text
        await pilot.press("q")


async def test_an_architecture_it_cannot_take_apart_is_said_in_one_line():
    facts = replace(FACTS, architecture="GPT2LMHeadModel", name="gpt2")
    engine = TimedEngine(facts=facts)
    app = make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await settle(pilot)
        last = app.state.run.last
        said = one_pass(facts, last.kv_tokens, last, last.settings)
        assert isinstance(said, str) and "\n" not in said
        text = panel_text(app)
        assert said in text.replace("\n", " ") or said[:60] in text
        assert timing_sum(last) in text  # the timing is the engine's: still there
        await pilot.press("q")


# ---- the helpers ----------------------------------------------------------------------------------------------------

def step_of(**changes) -> StepEvent:
    steps = TimedEngine(sampler=SamplerSettings(temperature=0.7, top_p=0.9)).run("Is OpenAI open?")
    step = next(e for e in steps if isinstance(e, StepEvent) and e.index == 3)
    return replace(step, **changes)


def test_the_distribution_line_shows_temperature_reshaping_and_what_each_filter_kept():
    step = step_of(entropy_bits=3.43, temp_entropy_bits=2.1, top_k_kept=None, top_p_kept=4, kept_count=4,
                   kept_mass=0.714, sampled_entropy_bits=0.68)
    assert distribution_line(step) == ("entropy 3.43 bits raw → 2.10 at T 0.7 (sharper, same order) → 0.68 after "
                                       "the cut · top-k off, top-p 0.9 kept 4 · 4 kept, 71.4% of the raw mass")
    hot = step_of(settings=SamplerSettings(temperature=1.5, top_k=20), entropy_bits=1.0, temp_entropy_bits=1.8,
                  top_k_kept=20)
    assert "(flatter, same order)" in distribution_line(hot) and "top-k 20 kept 20" in distribution_line(hot)
    greedy = step_of(settings=SamplerSettings(temperature=0.0), greedy=True, temp_entropy_bits=None)
    assert distribution_line(greedy).startswith("distribution: greedy")


def test_timing_sum_and_labels():
    step = step_of(latency_ms=42.8, timing=StepTiming(41.2, 1.3, 0.1, 0.2, 0.4, 8, 96))
    assert timing_sum(step) == "forward 41.2 + select 1.3 + copy 0.10 + detok 0.20 = 42.8 of 42.8 ms"
    assert timing_sum(step_of(timing=None)) is None
    assert device_label("cuda:0") == "GPU" and device_label("cpu") == "CPU" and device_label("mps") == "MPS"
    assert shape_text((1, 1, 896)) == "[1, 1, 896]" and shape_text(None) == "—"


def test_part_times_brackets_and_the_column_split():
    s = [Stage("token id", "host", "id", None, None), Stage("embed", "device", "h", (1, 1, 8), "forward"),
         Stage("blocks", "device", "h", (1, 1, 8), "forward"), Stage("head", "device", "l", (1, 9), "forward"),
         Stage("temperature", "device", "l", (1, 9), "select"), Stage("draw", "device", "id", (1,), "select"),
         Stage("to the host", "host", "p", (3,), "copy"), Stage("detokenize", "host", "text", None, "detok")]
    timing = StepTiming(20.0, 1.25, 0.3, 0.5, 0.0, 8, 12)
    assert part_times(s, timing) == ["", "forward 20.0 ms", "", "", "select 1.2 ms", "", "copy 0.30 ms",
                                     "detok 0.50 ms"]
    assert part_times(s, None) == [""] * 8
    assert part_marks(s) == [" ", "┌", "│", "└", "┌", "└", "─", "─"]
    assert split_at(s) == 4  # the forward pass on the left, the selection and the way back on the right
