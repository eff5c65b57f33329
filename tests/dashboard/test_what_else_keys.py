"""Issue 26's keys through Textual's pilot, against the scripted engine: `b` then `t` types a phrase (its pieces
shown as typed) and enter forces it; `f` fans out from the step in view and enter adopts the highlighted sample as
a branch; `tokentui score`'s dashboard shows the summary over the heat-coloured answer."""

from __future__ import annotations

from fake_script import ANSWER_TEXT
from fakes import ScriptedEngine, make_loader, screen_text, wait_for
from noting_app import NotingApp

from tokentui.core.runs.fanout_view import ranked
from tokentui.core.runs.requests import ScoreRequest
from tokentui.core.settings import SamplerSettings
from tokentui.tui import DashboardConfig
from tokentui.tui.screens.branch_picker import BranchPicker
from tokentui.tui.screens.fanout import FanoutScreen
from tokentui.tui.screens.phrase import PhraseDialog
from tokentui.tui.screens.scored import ScoredDialog

SIZE = (120, 40)
GREEDY = SamplerSettings(temperature=0.0)


def make_app(engine, **config) -> NotingApp:
    return NotingApp(DashboardConfig(load=make_loader(engine), user_theme_dir=None, sampler=engine.sampler,
                                       options=engine.options, **config))


async def at_step_5(pilot) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the run to finish")
    await pilot.press("less_than_sign", *["right_square_bracket"] * 4)
    await wait_for(pilot, lambda: app.state.view_step is not None and app.state.view_step.index == 4,
                   what="step 5 in view")


async def test_b_then_t_types_a_phrase_whose_pieces_show_and_enter_forces_it():
    engine = ScriptedEngine(sampler=GREEDY)
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await at_step_5(pilot)
        await pilot.press("b")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), what="the branch dialog")
        assert "t type a phrase" in screen_text(app)
        await pilot.press("t")
        await wait_for(pilot, lambda: isinstance(app.screen, PhraseDialog), what="the phrase dialog")
        await pilot.press(*" models are")
        await wait_for(pilot, lambda: app.screen.pieces_of == " models are", what="the pieces")
        assert "␣models│␣are   2 tokens, forced at steps 5–6" in screen_text(app)
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.phase == "done", timeout=10,
                       what="the phrase's branch")
        run = app.state.run
        forced = run[4:6]
        assert [s.piece for s in forced] == ["␣models", "␣are"] and all(s.forced for s in forced)
        assert engine.branches[-1].phrase_text == " models are" and not run[6].forced


async def test_escape_in_the_phrase_dialog_branches_nothing():
    engine = ScriptedEngine(sampler=GREEDY)
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await at_step_5(pilot)
        await pilot.press("b", "t")
        await wait_for(pilot, lambda: isinstance(app.screen, PhraseDialog), what="the phrase dialog")
        await pilot.press("x", "escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, PhraseDialog), what="the dialog closed")
        await pilot.pause(0.1)
        assert len(app.branch_tree) == 1 and engine.branches == []


async def test_f_lists_the_samples_most_likely_first_and_enter_adopts_one():
    engine = ScriptedEngine(sampler=SamplerSettings(temperature=0.8, top_p=1.0, seed=5))
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await at_step_5(pilot)
        await pilot.press("f")
        await wait_for(pilot, lambda: isinstance(app.screen, FanoutScreen) and not app.screen.state.running,
                       what="the fan-out")
        fan = app.screen.state
        text = screen_text(app)
        assert "fan-out at step 5 · 8 × 32 tokens" in text and "first tokens drawn" in text
        best = ranked(fan.samples)[0]
        assert f"#{best.n} " in text
        await pilot.press("enter")  # the highlighted row: the most likely sample
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.phase == "done", timeout=10,
                       what="the adopted sample's branch")
        branch = app.branch_tree.shown_branch
        assert branch.sample == best.n and [s.id for s in app.state.run[4:4 + len(best.ids)]] == best.ids


async def test_f_while_generating_live_says_to_pause_first():
    engine = ScriptedEngine(delay=0.2)
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_for(pilot, lambda: len(app.state.run) >= 1, what="a step")
        await pilot.press("f")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, FanoutScreen)
        assert any("Pause (space) to fan out" in n.message for n in app.toasts)


async def test_a_scored_text_opens_on_its_summary_and_escape_shows_the_heat_coloured_answer():
    engine = ScriptedEngine()
    app = make_app(engine, score=ScoreRequest("Is OpenAI open?", ANSWER_TEXT))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ScoredDialog), timeout=10, what="the summary")
        await pilot.pause(0.1)
        text = screen_text(app)
        assert "13 tokens · log-probability" in text and "least likely" in text and "␣weights" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ScoredDialog), what="the summary closed")
        assert app.controller.heat and app.state.run.score is not None
