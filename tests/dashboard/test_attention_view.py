"""The attention view (`A`, issue 39) through Textual's pilot, read as the terminal shows it at 80×24, 120×30 and
160×48, on the scripted engine with made-up attention (tests/attention_fakes.py): off by default; `A` opens it and
asks the engine to capture from its next step (a step from before says so); its ranked list is the step's own
LayerAttention (position, weight, token) highest first, the first token marked as a sink; `,` `.` change the layer
and `;` `'` the head (per-head weights asked for from the next step); `/` the all-layers grid, each layer's
strongest source; `[` redraws a past step from its stored event, quickly; a replayed record shows what it holds."""

from __future__ import annotations

import time

import pytest
from rich.cells import cell_len

from attention_fakes import HEADS, LAYERS, AttentionEngine
from fakes import make_loader, screen_text, wait_for
from snapshot_apps import SnapshotApp
from tokentui.commands.replay import replay_config
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.run import Run
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.core.steps.display import display_text
from tokentui.tui import DashboardConfig
from tokentui.tui.format import percent
from tokentui.tui.panels.attention import AttentionPanel, AttentionScreen

SIZES = [(80, 24), (120, 30), (160, 48)]
GREEDY = SamplerSettings(temperature=0.0)
IDS = [f"{w}x{h}" for w, h in SIZES]


def app_for(engine) -> SnapshotApp:
    return SnapshotApp(DashboardConfig(load=make_loader(engine), sampler=GREEDY, options=engine.options,
                                       user_theme_dir=None, recorder=None))


def view_text(app) -> str:
    return app.screen.query_one(AttentionPanel).last_text.plain


def ranked_rows(text: str) -> list[tuple[int, int, str]]:
    """(rank, position, weight as shown) of each row of the ranked list."""
    rows, started = [], False
    for line in text.splitlines():
        cell = line.split(" │ ")[0]
        if cell.strip().startswith("# pos") or cell.strip().startswith("#  pos") or "pos weight" in cell:
            started = True
            continue
        if started:
            parts = cell.split()
            if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
                break
            rows.append((int(parts[0]), int(parts[1]), parts[2]))
    return rows


def assert_list_is(app, pairs, pieces):
    text = view_text(app)
    width = app.screen.query_one(AttentionPanel).content_size.width
    assert all(cell_len(line) <= width for line in text.splitlines()), text  # every line fits: nothing wraps
    rows = ranked_rows(text)
    assert len(rows) >= 3, text
    for (rank, position, shown), (want_p, want_w) in zip(rows, pairs):
        assert (position, shown) == (want_p, percent(want_w)), (rank, text)
    first = next(line for line in text.splitlines() if ranked_rows_line(line, 0))
    assert "sink: first token" in first and display_text(pieces[0]) in first


def ranked_rows_line(line: str, position: int) -> bool:
    parts = line.split(" │ ")[0].split()
    return len(parts) >= 3 and parts[0].isdigit() and parts[1] == str(position) and parts[2].endswith("%")


def pieces_of(app) -> list[str]:
    state = app.state
    return [p.piece for p in state.run.prompt.pieces] + [s.piece for s in state.run]


async def open_view(pilot, app) -> None:
    await pilot.press("A")
    await wait_for(pilot, lambda: isinstance(app.screen, AttentionScreen), what="the attention view")
    await pilot.pause(0.05)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_off_by_default_A_asks_the_engine_and_the_list_is_the_steps_attention(size):
    engine = AttentionEngine(sampler=GREEDY, options=RunOptions(max_new_tokens=12, ignore_eos=True),
                             pause_before={3})
    app = app_for(engine)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.controller.paused and len(app.state.run) == 3, what="paused at step 3")
        assert not engine.options.attention and not isinstance(app.screen, AttentionScreen)
        assert "where the new token looks" not in screen_text(app)
        await open_view(pilot, app)
        assert engine.options.attention and engine.options.attention_top >= 8  # asked, from the next step
        assert "no attention for step 3: it ran before the view was on (it shows from the next step)" in \
            " ".join(view_text(app).split())
        await pilot.press("space")
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run's end")
        await pilot.pause(0.1)
        step = app.state.view_step
        layer = step.attention[-1]
        text = view_text(app)
        assert f"layer {LAYERS} of {LAYERS}" in text and "mean of the heads" in text
        assert f" at position {layer.query}, which sees {layer.query + 1} positions" in " ".join(text.split())
        assert_list_is(app, layer.top, pieces_of(app))
        screen = screen_text(app)
        assert "…" not in screen and all(len(line) <= size[0] for line in screen.splitlines())
        await pilot.press("A")  # closes it, and the engine stops capturing
        await pilot.pause(0.05)
        assert not isinstance(app.screen, AttentionScreen) and not engine.options.attention
        assert "4 selection" in screen_text(app)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_layer_and_head_keys_and_the_grid(size):
    engine = AttentionEngine(sampler=GREEDY, options=RunOptions(max_new_tokens=10, ignore_eos=True,
                                                                attention=True, attention_top=24))
    app = app_for(engine)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run's end")
        await open_view(pilot, app)
        step = app.state.view_step
        pieces = pieces_of(app)
        await pilot.press("comma", "comma")
        await pilot.pause(0.05)
        assert f"layer {LAYERS - 2} of {LAYERS}" in view_text(app)
        assert_list_is(app, step.attention[LAYERS - 3].top, pieces)
        await pilot.press("full_stop", "full_stop", "full_stop")  # past the last: the first again
        await pilot.pause(0.05)
        assert f"layer 1 of {LAYERS}" in view_text(app)
        assert_list_is(app, step.attention[0].top, pieces)
        await pilot.press("apostrophe")  # head 1: this run has no per-head weights yet
        await pilot.pause(0.05)
        assert engine.options.attention_heads
        assert "per-head weights from the next step" in " ".join(view_text(app).split())
        await pilot.press("r")  # the prompt again (the view stays open), now with the heads
        await wait_for(pilot, lambda: app.state.phase == "done" and app.state.view_step is not None
                       and app.state.view_step.attention[0].heads is not None, what="a run with heads")
        await pilot.pause(0.05)
        step = app.state.view_step
        assert isinstance(app.screen, AttentionScreen)
        assert app.controller.inside.head == 0 and app.controller.inside.layer == 1
        assert f"head 1 of {HEADS}" in view_text(app)
        assert_list_is(app, step.attention[0].heads[0], pieces_of(app))
        await pilot.press("semicolon")
        await pilot.pause(0.05)
        assert "mean of the heads" in view_text(app)
        await pilot.press("slash")  # the all-layers grid
        await pilot.pause(0.05)
        text = view_text(app)
        lines = [line for line in text.splitlines() if line.lstrip("▶ ").startswith("L")]
        assert lines, text
        for line in lines:
            number = int(line.lstrip("▶ ")[1:].split()[0])
            best = step.attention[number - 1].top[0]
            assert f"{display_text(pieces_of(app)[best[0]])}@{best[0]} {percent(best[1], 0)}" in line, line
        assert len(lines) == LAYERS or f"{LAYERS - len(lines)} more layers" in text
        assert "…" not in screen_text(app)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_time_travel_redraws_a_past_steps_attention_at_once(size):
    engine = AttentionEngine(sampler=GREEDY, options=RunOptions(max_new_tokens=14, ignore_eos=True,
                                                                attention=True, attention_top=24))
    app = app_for(engine)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run's end")
        await open_view(pilot, app)
        times = []
        for _ in range(4):
            start = time.perf_counter()
            app.action_cursor(-1)  # what `[` does: the controller moves the cursor and the frame is painted
            times.append(time.perf_counter() - start)
        await pilot.pause(0.05)
        step = app.state.view_step
        assert app.state.cursor == len(app.state.run) - 5
        assert app.screen.query_one(AttentionPanel).border_subtitle == f"viewing step {step.index + 1}"
        assert f" at position {step.attention[-1].query}, which sees" in " ".join(view_text(app).split())
        assert_list_is(app, step.attention[-1].top, pieces_of(app))
        assert sorted(times)[1] < 0.1, times  # the repaint of a past step: well under 100 ms
        await pilot.press("right_square_bracket")
        await pilot.pause(0.05)
        assert app.state.view_step.index == step.index + 1


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_a_replayed_record_shows_the_attention_it_holds(tmp_path, size):
    engine = AttentionEngine(sampler=GREEDY, options=RunOptions(max_new_tokens=8, ignore_eos=True,
                                                                attention=True))
    run = Run(engine.facts)
    for event in engine.run("Is OpenAI open?"):
        run.apply(event)
    path = run.save(tmp_path / "run.jsonl")
    app = SnapshotApp(replay_config(ReplayEngine.from_record(path, speed=0.0), user_theme_dir=None))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the replay's end")
        await open_view(pilot, app)
        step = app.state.view_step
        recorded = run.last.attention[-1]
        assert step.attention[-1] == recorded  # the record kept it whole
        assert_list_is(app, recorded.top, pieces_of(app))
        assert "…" not in screen_text(app)


async def test_a_record_without_attention_says_so(tmp_path):
    engine = AttentionEngine(sampler=GREEDY, options=RunOptions(max_new_tokens=4, ignore_eos=True))
    run = Run(engine.facts)
    for event in engine.run("Is OpenAI open?"):
        run.apply(event)
    app = SnapshotApp(replay_config(ReplayEngine.from_record(run.save(tmp_path / "run.jsonl"), speed=0.0),
                                    user_theme_dir=None))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the replay's end")
        await open_view(pilot, app)
        assert "this record was made without it (tokentui --attention records it)" in " ".join(view_text(app).split())


async def test_a_branch_shows_its_own_steps_attention_over_its_own_text():
    from tokentui.tui.screens.branch_picker import BranchPicker

    engine = AttentionEngine(sampler=GREEDY, options=RunOptions(max_new_tokens=8, ignore_eos=True, attention=True))
    app = app_for(engine)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run's end")
        await pilot.press("less_than_sign", "right_square_bracket", "right_square_bracket")  # step 3
        await pilot.press("b")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), what="the picker")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.phase == "done", what="the branch")
        await open_view(pilot, app)
        step = app.state.view_step
        pieces = pieces_of(app)
        assert step.attention[-1].query == len(app.state.run.prompt.pieces) + step.index - 1
        assert pieces[step.attention[-1].query] == app.state.run.step(step.index - 1).piece  # the branch's text
        assert_list_is(app, step.attention[-1].top, pieces)
