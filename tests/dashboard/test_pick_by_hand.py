"""Picking tokens by hand, step by step (issue 40, 12, token-explorer's workflow): branching from a run the user
paused keeps it paused — the branch's first step (the token chosen) comes, then it waits for n — and in the
candidates list (`b`) one key, the candidate's rank, chooses it. A run that was not paused by the user goes on as
before. At 80×24, 120×30 and 160×48."""

from __future__ import annotations

import pytest

from fakes import ScriptedEngine, make_loader, slow_engine, wait_for
from snapshot_apps import SnapshotApp
from tokentui.tui import DashboardConfig
from tokentui.tui.panels import CandidatesPanel
from tokentui.tui.screens.branch_picker import BranchPicker

SIZES = [(80, 24), (120, 30), (160, 48)]


def app_on(engine) -> SnapshotApp:
    return SnapshotApp(DashboardConfig(load=make_loader(engine), options=engine.options, sampler=engine.sampler,
                                       user_theme_dir=None, recorder=None))


async def pick(pilot, rank: int) -> int:
    """b, then the digit of `rank`, or of the next rank down where `rank` is the token the step took (choosing that
    one is no branch; the script's step 4 takes its rank 2 under the default sampler): the id chosen."""
    app = pilot.app
    step = app.state.view_step
    if step.candidates[rank - 1].id == step.id:
        rank += 1
    await pilot.press("b")
    await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), what="the candidates list")
    assert "The run stays paused" in " ".join(str(w.render()) for w in app.screen.query("Static"))
    await pilot.press(str(rank % 10))
    return step.candidates[rank - 1].id


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_a_paused_run_stays_paused_across_branches_picked_by_one_key(size):
    engine = slow_engine(delay=0.05, steps=400)
    app = app_on(engine)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.steps >= 3, what="decoding")
        await pilot.press("space")
        await wait_for(pilot, lambda: app.client.paused, what="the pause")
        await pilot.pause(0.2)
        at = app.state.steps - 1  # the newest step: its candidates are the list's
        token = await pick(pilot, 3)
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.steps == at + 1,
                       what="the branch's first step")
        await pilot.pause(0.3)  # long enough for several steps, were it going on
        assert app.client.paused and app.state.running
        assert app.state.steps == at + 1 and app.state.run.step(at).id == token  # only the token chosen
        assert engine.branches[-1].token == token and engine.branches[-1].at == at
        app.redraw()
        await pilot.pause()
        panel = app.query_one(CandidatesPanel).last_text.plain
        assert any(line.startswith("▶ ") and f" {token} " in line for line in panel.splitlines()), panel
        await pilot.press("n")  # one more token, then waiting again
        await wait_for(pilot, lambda: app.state.steps == at + 2, what="one step")
        await pilot.pause(0.3)
        assert app.state.steps == at + 2 and app.client.paused
        second = await pick(pilot, 2)  # and the next one by hand too: the branch of the branch, still paused
        await wait_for(pilot, lambda: len(app.branch_tree) == 3 and app.state.steps == at + 2,
                       what="the second branch's first step")
        await pilot.pause(0.3)
        assert app.client.paused and app.state.steps == at + 2 and app.state.run.step(at + 1).id == second
        await pilot.press("q")


async def test_a_branch_of_a_finished_run_goes_on():
    engine = ScriptedEngine()
    app = app_on(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.press("less_than_sign", "right_square_bracket", "b")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), what="the candidates list")
        await pilot.press("2")
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.phase == "done", timeout=10,
                       what="the branch to run to its end")
        assert not app.client.paused and app.state.steps > 2


async def test_the_taken_token_is_no_branch():
    engine = ScriptedEngine()
    app = app_on(engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.press("less_than_sign", "b")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), what="the candidates list")
        step = app.state.view_step
        taken = next(n for n, c in enumerate(step.candidates, 1) if c.id == step.id)
        await pilot.press(str(taken % 10))
        await pilot.pause(0.1)
        assert isinstance(app.screen, BranchPicker) and len(app.branch_tree) == 1
