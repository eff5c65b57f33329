"""The controller's side of forcing a phrase, fanning out and a scored text (tui/explore.py), with the recording View
of test_controller.py and the scripted engine behind an in-process client."""

from __future__ import annotations

import asyncio

from dataclasses import replace

from fake_script import ANSWER, ANSWER_TEXT, FACTS
from fakes import ScriptedEngine
from test_controller import RecordingView, loaded, until

from tokentui.core.runs.fanout_view import ranked
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.requests import ScoreRequest
from tokentui.core.runs.run import Run
from tokentui.core.settings import SamplerSettings
from tokentui.tui.controller import DashboardController
from tokentui.commands.replay import replay_config

SAMPLING = SamplerSettings(temperature=0.8, top_p=1.0, seed=5)


async def paused_at(controller, steps: int):
    """The run paused by its engine before step `steps` (pause_before), as space would have paused it."""
    await until(lambda: len(controller.state.run) >= steps and controller.paused)
    controller.client.pause()  # the client's own flag, as the key sets it (a branch resumes the engine)
    return controller.step_to_branch()


async def test_a_typed_phrase_is_forced_token_by_token_then_generation_goes_on():
    engine = ScriptedEngine(sampler=SamplerSettings(temperature=0.0), pause_before={3})
    controller, view = await loaded(engine)
    try:
        step = await paused_at(controller, 3)
        assert step.index == 2
        parent = controller.tree.shown_branch
        pieces = await controller.explore.phrase_pieces(" weights are")
        assert [p.piece for p in pieces] == ["␣weights", "␣are"]
        ids = tuple(p.id for p in pieces)
        assert controller.explore.force_phrase(parent, step, " weights are", ids)
        # paused by the user: the phrase's tokens come, then the branch waits (issue 40); resumed, it goes on
        await until(lambda: len(controller.tree) == 2 and len(controller.state.run) == 4)
        await asyncio.sleep(0.2)
        assert controller.client.paused and len(controller.state.run) == 4
        controller.toggle_pause()
        await until(lambda: controller.state.phase == "done" and len(controller.tree) == 2)
        branch = controller.tree.shown_branch
        run = branch.state.run
        forced = run[2:4]
        assert [s.id for s in forced] == list(ids) and all(s.forced for s in forced)
        assert not any(s.forced for s in run[4:]) and len(run) > 4  # then it went on
        assert (branch.phrase, branch.phrase_text, branch.at) == (ids, " weights are", 2)
        assert engine.branches[-1].phrase == ids and engine.branches[-1].phrase_text == " weights are"
    finally:
        controller.close()


async def test_an_empty_phrase_is_refused_in_one_line_and_nothing_starts():
    engine = ScriptedEngine(pause_before={3})
    controller, view = await loaded(engine)
    try:
        step = await paused_at(controller, 3)
        assert not controller.explore.force_phrase(controller.tree.shown_branch, step, "", ())
        assert view.notes("warning")[-1].startswith("The phrase is empty")
        assert len(controller.tree) == 1 and engine.branches == []
    finally:
        controller.close()


async def test_f_fans_out_from_the_step_in_view_and_a_sample_is_adopted_as_a_branch(tmp_path):
    engine = ScriptedEngine(sampler=SAMPLING, pause_before={4})
    controller, view = await loaded(engine, recorder=RunRecorder(tmp_path))
    try:
        step = await paused_at(controller, 4)
        parent_record = controller.state.record_path
        fan = controller.explore.fanout()
        assert fan is not None and ("show_fanout", fan) in view.calls
        # the fan-out's run (its RunOpened came while `fanout` ran) is its own record, not the tree's
        assert fan.run_id == controller.client.run_id and fan.record_path not in (None, parent_record)
        assert controller.state.record_path == parent_record and controller.tree.path is not None
        assert fan.record_path.name not in controller.tree.path.read_text()
        await until(lambda: not fan.running)
        assert (fan.request.at, fan.request.n, fan.request.m, fan.request.seed) == (step.index, 8, 32, 5)
        assert [s.n for s in fan.samples] == list(range(8)) and [s.seed for s in fan.samples] == list(range(5, 13))
        assert len({tuple(s.ids) for s in fan.samples}) > 1  # T = 0.8: they differ
        assert view.calls.count(("fanout_changed",)) >= 8
        assert len(controller.tree) == 1  # the fan-out is not a branch of the tree; its parent is untouched
        best = ranked(fan.samples)[0]
        assert controller.explore.adopt(best.n)
        await until(lambda: len(controller.tree) == 2 and controller.state.phase == "done")
        branch = controller.tree.shown_branch
        assert (branch.sample, branch.phrase, branch.at) == (best.n, tuple(best.ids), step.index)
        own = branch.state.run[step.index:step.index + len(best.ids)]
        assert [s.id for s in own] == best.ids and all(s.forced for s in own)
    finally:
        controller.close()


async def test_a_fan_out_out_of_range_or_past_the_context_is_one_line():
    engine = ScriptedEngine(sampler=SAMPLING, pause_before={4}, facts=replace(FACTS, max_context=40))
    controller, view = await loaded(engine)
    try:
        await paused_at(controller, 4)
        assert controller.explore.fanout(n=0) is None
        assert "the number of samples (-n) must be a whole number from 1 to 64" in view.notes("error")[-1]
        assert controller.explore.fanout(m=5000) is None
        assert "from 1 to 1024" in view.notes("error")[-1]
        assert controller.explore.fanout() is None  # 32 tokens from step 4: past a context of 40
        assert "past this model's context of 40; ask for at most" in view.notes("error")[-1]
        assert controller.paused and controller.state.running  # nothing lost: the run waits where it was
    finally:
        controller.close()


async def test_a_scored_text_is_the_first_run_its_summary_shown_heat_on():
    engine = ScriptedEngine()
    request = ScoreRequest("Is OpenAI open?", ANSWER_TEXT)
    controller, view = await loaded(engine, score=request)
    try:
        await until(lambda: controller.state.phase == "done")
        run = controller.state.run
        assert run.score is not None and run.score.answer == ANSWER_TEXT
        assert [s.id for s in run] == [s.id for s in ANSWER if s.id != ANSWER[-1].id] and all(s.forced for s in run)
        (summary,) = [c[1] for c in view.calls if c[0] == "scored"]
        assert summary is run.score_summary and summary.tokens == len(run) and controller.heat
        controller.set_prompt("Another question?", None)  # a typed prompt is asked, not scored
        await until(lambda: controller.state.phase == "done" and controller.state.run.score is None)
    finally:
        controller.close()


async def test_a_replay_refuses_a_phrase_and_a_fan_out_saying_how_to_do_them():
    engine = ScriptedEngine()
    run = Run(engine.facts)
    for event in engine.run("Is OpenAI open?"):
        run.apply(event)
    view = RecordingView()
    controller = DashboardController(replay_config(ReplayEngine(run, speed=0), user_theme_dir=None), view)
    await controller.load()
    try:
        await until(lambda: controller.state.phase == "done")
        assert controller.explore.fanout() is None
        assert view.notes("warning")[-1].startswith("A replay cannot run the model: fan out from the record with "
                                                    "`tokentui fanout")
        assert controller.client.refusal("phrase").startswith("a replay cannot run the model: force a phrase")
        assert controller.client.refusal("score").startswith("a replay cannot run the model")
        assert len(controller.tree) == 1
    finally:
        controller.close()
