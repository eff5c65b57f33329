"""Issue 13, time travel: a cursor over the generated tokens. On a past step every panel shows that step as it was
(candidates raw and post-sampler, the settings in force, its latency, the KV size and the pending bytes then, the
token marked in the answer with its heat colour), the status line says so, esc goes back to live. While generating
(the run goes on underneath), while paused, after the end and in a replay. All on the scripted engine
(tests/fakes.py): its answer splits 开 over steps 10 and 11, so step 10 holds the pending bytes e5 bc."""

from __future__ import annotations

import re

from fakes import ScriptedEngine, make_loader, record_scripted, screen_text, slow_engine, wait_for
from tokentui.core.runs.events import StepEvent
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.settings import RunOptions
from tokentui.commands.replay import replay_config
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.format import human_bytes, percent
from tokentui.tui.keybar import fit
from tokentui.tui.keys import KEYS
from tokentui.tui.panels import (CandidatesPanel, KVPanel, OutputPanel, OutputView, PendingPanel, ReadingsStrip,
                                 SamplerPanel, SpeedPanel, StatusLine)
from tokentui.tui.panels.readings import readings
from tokentui.tui.state import RunState

BACK, FORWARD, BACK_10, FORWARD_10 = ("left_square_bracket", "right_square_bracket", "left_curly_bracket",
                                      "right_curly_bracket")
FIRST, LIVE = "less_than_sign", "escape"


class TravelApp(TokentuiApp):
    CURSOR_BLINK = False


def make_app(engine: ScriptedEngine, **config) -> TravelApp:
    config.setdefault("user_theme_dir", None)
    config.setdefault("recorder", None)
    config.setdefault("sampler", engine.sampler)
    config.setdefault("options", engine.options)
    return TravelApp(DashboardConfig(load=make_loader(engine), **config))


def flat(text) -> str:
    return " ".join(text.plain.split())


def status(app) -> str:
    return app.query_one(StatusLine).last_text.plain


async def settle(pilot) -> None:
    await pilot.pause(0.05)


async def go_to(pilot, position: int) -> None:
    """The cursor to `position` by keys: the first step, then ] one at a time."""
    await pilot.press(FIRST, *[FORWARD] * position)
    assert pilot.app.state.cursor == position
    await settle(pilot)


def candidate_rows(step: StepEvent) -> list[str]:
    """What the candidates panel must show of each candidate: id, raw p, post-sampler p (or cut)."""
    return [rf"\b{c.id} +{re.escape(percent(c.raw_prob))} +{re.escape(percent(c.prob) if c.prob > 0 else 'cut')}"
            for c in step.candidates]


# ---- the state alone -------------------------------------------------------------------------------------------

def folded_state(steps: int = 14) -> RunState:
    engine = ScriptedEngine(options=RunOptions(max_new_tokens=steps, ignore_eos=True))
    state = RunState()
    state.apply(engine.facts)
    for event in engine.run("Is OpenAI open?"):
        state.apply(event)
    return state


def test_the_cursor_is_live_by_default_clamped_and_reset_by_a_new_run():
    state = folded_state()
    assert state.cursor is None and state.live and state.view_step is state.last_step
    assert not state.cursor_move(+1)  # forward from live: still live
    assert state.cursor_move(-1) and state.cursor == 12 and state.view_step == state.run[12]
    assert state.cursor_move(-100) is True and state.cursor == 0
    assert state.cursor_move(-1) is False and state.cursor == 0  # clamped at the first step
    assert state.cursor_move(+100) and state.cursor == 13  # clamped at the newest, and held there (not live)
    assert not state.live and state.view_step == state.run[13]
    assert state.cursor_go(9) and state.view_pending == ("e5 bc", 1)
    assert state.view_kv[:2] == (state.run[9].kv_tokens, state.run[9].kv_bytes)
    assert state.view_latency == state.run[9].latency_ms
    assert state.view_multi_token_chars == [] and state.cursor_go(10)
    assert [c.char for c in state.view_multi_token_chars] == ["开"]
    assert state.cursor_live() and state.live and not state.cursor_live()
    state.cursor_go(3)
    state.start_run()
    assert state.live and state.cursor is None


# ---- while generating, while paused, after the end -------------------------------------------------------------

async def test_the_cursor_holds_a_past_step_while_the_run_goes_on_underneath():
    engine = slow_engine(delay=0.03, steps=400)
    app = make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.steps >= 20, what="20 steps")
        await pilot.press(BACK, BACK, BACK)
        held = app.state.cursor
        assert held is not None and held < app.state.steps - 1
        steps_then = len(engine.steps)
        await wait_for(pilot, lambda: app.state.steps >= steps_then + 15, what="steps after the cursor moved")
        await settle(pilot)
        assert app.state.running and app.state.cursor == held  # the run went on; the view stayed
        step = app.state.run[held]
        assert app.query_one(CandidatesPanel).border_subtitle == f"viewing step {held + 1}"
        assert re.search(rf"viewing step {held + 1} of [\d,]+ — live continues", status(app)), status(app)
        assert "esc back to live" in status(app)
        assert f"step {held + 1} {step.latency_ms:.1f}" in flat(app.query_one(SpeedPanel).last_text)
        view = app.query_one(OutputPanel).view
        assert view.cursor == held and view.token_count > held + 15
        first, last = view.answer.token_lines(held)
        assert view.scroll_y <= first and last < view.scroll_y + view.scrollable_content_region.height, \
            "the cursor token is out of view"
        await pilot.press(LIVE)
        await settle(pilot)
        assert app.state.live and "viewing" not in status(app) and "decoding" in status(app)
        assert app.query_one(CandidatesPanel).border_subtitle.startswith("step ")
        assert view.cursor is None
        await pilot.press("q")


async def test_the_cursor_while_paused_says_paused_and_n_still_steps_underneath():
    engine = slow_engine(delay=0.05)
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.steps >= 8, what="8 steps")
        await pilot.press("space")
        await wait_for(pilot, lambda: engine.paused, what="the pause")
        await pilot.pause(0.2)
        n = app.state.steps
        await pilot.press(BACK)
        await settle(pilot)
        assert app.state.cursor == n - 2
        assert f"viewing step {n - 1} of {n} — paused" in status(app)
        await pilot.press("n")
        await wait_for(pilot, lambda: app.state.steps == n + 1, what="one more step")
        await settle(pilot)
        assert app.state.cursor == n - 2 and f"viewing step {n - 1} of {n + 1} — paused" in status(app)
        assert app.query_one(CandidatesPanel).border_subtitle == f"viewing step {n - 1}"
        await pilot.press(LIVE)
        await settle(pilot)
        assert f"paused at step {n + 1}" in status(app)
        await pilot.press("q")


async def test_keys_clamp_at_both_ends_after_the_run_ended():
    engine = ScriptedEngine()
    app = make_app(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the end")
        await pilot.press(FORWARD)
        assert app.state.live  # nothing after the newest step: still live
        await pilot.press(FIRST)
        assert app.state.cursor == 0
        await pilot.press(BACK, BACK_10)
        assert app.state.cursor == 0
        await pilot.press(FORWARD_10)
        assert app.state.cursor == 10
        await pilot.press(FORWARD, FORWARD)
        assert app.state.cursor == 12 and not app.state.live
        await settle(pilot)
        assert "viewing step 13 of 14 — run ended" in status(app)
        await pilot.press(FORWARD)  # onto the newest step: back to live, not a view of it
        assert app.state.live and app.state.view_index == 13
        await pilot.press(BACK_10)
        assert app.state.cursor == 3
        await pilot.press(LIVE)
        await settle(pilot)
        assert app.state.live and "✓ done" in status(app)


# ---- every panel shows the cursor's step exactly -----------------------------------------------------------------

async def test_every_panel_shows_the_cursor_step_as_it_was():
    engine = ScriptedEngine(pause_before={5})  # the settings change from step 6 on (index 5)
    app = make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.steps == 5 and engine.paused, what="the pause before step 6")
        app.client.set_sampler(app.client.sampler.with_changes(temperature=1.2, top_k=5))
        await pilot.press("space")
        await wait_for(pilot, lambda: app.state.phase == "done", what="the end")
        steps = list(app.state.run)
        assert steps[4].settings.temperature == 0.7 and steps[5].settings.temperature == 1.2
        assert steps[5].settings_changed

        await go_to(pilot, 9)  # step 10: 开's first two bytes held
        step = steps[9]
        cands = app.query_one(CandidatesPanel)
        assert cands.border_subtitle == "viewing step 10"
        for row in candidate_rows(step):
            assert re.search(row, cands.last_text.plain), (row, cands.last_text.plain)
        assert "▶ <0xE5><0xBC>" in cands.last_text.plain
        assert re.search(r"^top-k +5 ", cands.last_text.plain, re.M), cands.last_text.plain  # its chain row
        sampler = flat(app.query_one(SamplerPanel).last_text)
        assert "step 10 live" in sampler and "temp 1.20 1.20" in sampler and "top-k 5 5" in sampler
        speed = flat(app.query_one(SpeedPanel).last_text)
        assert f"step 10 {step.latency_ms:.1f} ·" in speed and "all 13 steps" in speed  # totals stay the run's
        assert app.query_one(SpeedPanel).plot.mark == 10
        kv = app.query_one(KVPanel)
        assert f"tokens {step.kv_tokens:,} (13 prompt + 9)" in flat(kv.last_text)
        assert f"size {human_bytes(step.kv_bytes)}" in flat(kv.last_text)
        assert "+112 KiB / step" in flat(kv.last_text) and kv.border_subtitle == "at step 10"
        pending = flat(app.query_one(PendingPanel).last_text)
        assert "held e5 bc needs 1 more byte" in pending and "split over several tokens:" not in pending
        assert "viewing step 10 of 14 — run ended" in status(app)
        assert app.query_one(OutputPanel).view.cursor == 9

        await pilot.press(FORWARD)  # step 11 completes 开
        await settle(pilot)
        pending = flat(app.query_one(PendingPanel).last_text)
        assert "held none" in pending and "开 = e5 bc 80 ← 2 tokens" in pending

        await go_to(pilot, 2)  # before the change: the settings then, beside the live ones
        step = steps[2]
        for row in candidate_rows(step):
            assert re.search(row, app.query_one(CandidatesPanel).last_text.plain), row
        sampler = flat(app.query_one(SamplerPanel).last_text)
        assert "step 3 live" in sampler and "temp 0.70 1.20" in sampler and "top-k off 5" in sampler
        assert f"step 3 {step.latency_ms:.1f}" in flat(app.query_one(SpeedPanel).last_text)
        assert f"tokens {step.kv_tokens:,}" in flat(app.query_one(KVPanel).last_text)

        await pilot.press(LIVE)
        await settle(pilot)
        assert app.query_one(CandidatesPanel).border_subtitle == "step 14"
        assert app.query_one(KVPanel).border_subtitle == "" and app.query_one(SpeedPanel).plot.mark is None
        assert "changed (latest last)" in flat(app.query_one(SamplerPanel).last_text) or \
            "step 6 temp 0.70→1.20" in flat(app.query_one(SamplerPanel).last_text)


async def test_the_readings_strip_and_one_line_sampler_show_the_cursor_step():
    engine = ScriptedEngine()
    app = make_app(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the end")
        await go_to(pilot, 9)
        step = app.state.run[9]
        r = readings(app.state)
        assert r["step"] == "10" and r["pending"] == "e5 bc" and r["needed"] == "1"
        assert r["kv_tokens"] == f"{step.kv_tokens:,}" and r["kv_size"] == human_bytes(step.kv_bytes)
        assert r["ms_step"] == f"{step.latency_ms:.1f}"
        assert r["tok_s"] == f"{app.state.latency_stats()['tok_s']:.1f}"  # the run's
        strip = app.query_one(ReadingsStrip).last_text.plain
        assert "10" in strip and "e5 bc" in strip and f"{step.latency_ms:.1f} ms" in strip
        sampler = app.query_one(SamplerPanel).last_text.plain
        assert sampler.startswith("step 10: temp 0.70") and "live same" in sampler
        await pilot.press("t")  # the keys change the live settings: said beside the step's
        await settle(pilot)
        assert "live temp 0.60" in app.query_one(SamplerPanel).last_text.plain
        text = screen_text(app)
        assert "viewing step 10 of 14 — run ended · esc back to live" in text


async def test_the_cursor_token_is_marked_in_its_heat_colour():
    engine = ScriptedEngine()
    app = make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the end")
        await pilot.press("h")
        await settle(pilot)
        view = app.query_one(OutputPanel).view
        before = {seg.text: seg.style for seg in view.render_line(0)}
        await go_to(pilot, 3)  # " Some"
        after = {seg.text: seg.style for seg in view.render_line(0)}
        assert after[" Some"].reverse and not before[" Some"].reverse
        assert after[" Some"].color == before[" Some"].color and after[" Some"].bgcolor == before[" Some"].bgcolor
        assert all(not style.reverse for text, style in after.items() if text != " Some")
        await pilot.press(FORWARD_10, BACK, BACK, BACK, BACK)  # step 10 draws nothing: a ▒ marks it
        assert app.state.cursor == 9
        await settle(pilot)
        marks = [seg for seg in view.render_line(0) if seg.style is not None and seg.style.reverse]
        assert [seg.text for seg in marks] == ["▒"]


# ---- the mouse ---------------------------------------------------------------------------------------------------

async def test_clicking_a_token_moves_the_cursor_there():
    engine = ScriptedEngine()
    app = make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the end")
        await settle(pilot)
        # "Partly. Some weights…": Part 0-3, ly 4-5, . 6, " Some" 7-11, " weights" 12-19
        await pilot.click(OutputView, offset=(9, 0))
        await settle(pilot)
        assert app.state.cursor == 3
        assert "viewing step 4 of 14" in status(app)
        await pilot.click(OutputView, offset=(14, 0))
        assert app.state.cursor == 4
        await pilot.click(OutputView, offset=(0, 0))
        assert app.state.cursor == 0
        await pilot.click(OutputView, offset=(5, 10))  # below the text: nothing
        assert app.state.cursor == 0
        await pilot.press(LIVE)
        assert app.state.live


# ---- replay ------------------------------------------------------------------------------------------------------

def record_scripted_steps(directory) -> tuple:
    path, events = record_scripted(directory)
    return path, [e for e in events if isinstance(e, StepEvent)]


async def test_time_travel_in_a_replay_while_it_plays_and_after_it_ended(tmp_path):
    path, steps = record_scripted_steps(tmp_path)
    engine = ReplayEngine.from_record(path, speed=0.25)  # 4× slower than recorded: ~90 ms a step
    app = TravelApp(replay_config(engine, user_theme_dir=None))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.steps >= 4, timeout=10, what="the replay's first steps")
        await pilot.press(BACK)
        held = app.state.cursor
        await settle(pilot)
        if app.state.running:
            assert "— live continues" in status(app)
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the replay's end")
        await settle(pilot)
        assert app.state.cursor == held and f"viewing step {held + 1} of 14 — run ended" in status(app)
        await go_to(pilot, 9)
        for row in candidate_rows(steps[9]):
            assert re.search(row, app.query_one(CandidatesPanel).last_text.plain), row
        assert "held e5 bc" in flat(app.query_one(PendingPanel).last_text)
        assert f"step 10 {steps[9].latency_ms:.1f}" in flat(app.query_one(SpeedPanel).last_text)
        await pilot.press(LIVE)
        assert app.state.live
        await pilot.press("q")


# ---- the keys are listed; moving is fast -----------------------------------------------------------------------

def test_the_travel_keys_are_in_the_table_and_clash_with_nothing():
    ids = {spec.id for spec in KEYS}
    assert {"tokentui.cursor-back", "tokentui.cursor-forward", "tokentui.cursor-back-10",
            "tokentui.cursor-forward-10", "tokentui.cursor-first", "tokentui.live"} <= ids
    keys = [key for spec in KEYS for key in spec.keys.split(",")]
    assert len(keys) == len(set(keys)), "two actions share a key"
    assert "[] past" in " ".join(f"{e.keys} {e.label}" for e in fit(118))


async def test_a_cursor_move_in_a_4096_token_run_redraws_two_lines_not_the_answer():
    engine = ScriptedEngine(options=RunOptions(max_new_tokens=4096, ignore_eos=True))
    app = make_app(engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=600, what="4,096 steps")
        await pilot.pause(0.2)
        assert app.state.steps == 4096
        view = app.query_one(OutputPanel).view
        calls = {"lines": 0, "relayout": 0, "append": 0}
        render_line, relayout, append = view.render_line, view.answer.restart, view.append

        def count(name, fn):
            def counted(*args, **kwargs):
                calls[name] += 1
                return fn(*args, **kwargs)
            return counted

        view.render_line = count("lines", render_line)
        view.answer.restart = count("relayout", relayout)  # the whole answer wrapped again
        view.append = count("append", append)
        await pilot.press(BACK)
        await settle(pilot)
        # What a move costs is the lines it redraws (how long that takes is the machine's: not a pass mark here)
        for _ in range(6):
            calls["lines"] = 0
            app.action_cursor(-1)  # what the key does
            app.screen._compositor.render_update(full=False)  # and the screen's update for it
            await pilot.pause()
            assert calls["lines"] <= 4, calls  # the old and the new cursor token's lines
        assert calls["relayout"] == 0 and calls["append"] == 0
        assert app.state.cursor == 4088 and view.cursor == 4088
        await pilot.press(FIRST)
        await settle(pilot)
        assert view.cursor == 0 and view.scroll_y == 0  # scrolled to the first token
        await pilot.press(LIVE)
        await settle(pilot)
        assert view.scroll_y == view.max_scroll_y  # following the newest line again
