"""Branching and the logit lens in the dashboard, through Textual's pilot against the scripted engine: `b` picks
another candidate at the step in view and the run goes on from it, `B` lists the runs of the prompt (switch,
compare), `l` shows each layer's top token for the step in view."""

from __future__ import annotations

from dataclasses import replace

from fakes import ScriptedEngine, make_loader, screen_text, wait_for
from noting_app import NotingApp
from tokentui.core.runs.events import LensRow, StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui import DashboardConfig
from tokentui.tui.branches import first_difference
from tokentui.tui.panels import LensPanel
from tokentui.tui.panels.lens import pick_layers
from tokentui.tui.screens.branch_list import BranchList
from tokentui.tui.screens.branch_picker import BranchPicker
from tokentui.tui.screens.compare import CompareScreen

SIZE = (120, 40)
GREEDY = SamplerSettings(temperature=0.0)


def make_app(engine, **config) -> NotingApp:
    config.setdefault("user_theme_dir", None)
    config.setdefault("sampler", engine.sampler)
    config.setdefault("options", engine.options)
    return NotingApp(DashboardConfig(load=make_loader(engine), **config))


def ids(state) -> list[int]:
    return state.run.values("id")


async def test_b_branches_at_the_newest_step_while_paused_and_the_run_goes_on_from_the_picked_token_once_resumed():
    engine = ScriptedEngine(delay=0.05, sampler=GREEDY)
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.state.run) >= 4, what="4 steps")
        await pilot.press("space")
        await wait_for(pilot, lambda: app.client.paused and not app.state.running or app.client.paused,
                       what="paused")
        await pilot.pause(0.3)  # the step under way when pause came
        parent = app.branch_tree.shown_branch
        at = len(parent.state.run) - 1  # live and paused: the newest step
        step = parent.state.run.step(at)
        await pilot.press("b")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), what="the picker")
        text = screen_text(app)
        assert f"branch at step {at + 1}" in text and "taken" in text
        other = next(c for c in step.candidates if c.id != step.id)  # the first one not taken: highlighted
        await pilot.press("enter")
        # a run paused by the user stays paused across the branch (issue 40): the picked token, then it waits
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and len(app.state.run) == at + 1,
                       what="the branch's first step")
        await pilot.pause(0.3)
        assert app.client.paused and len(app.state.run) == at + 1
        await pilot.press("space")  # and goes on from it when resumed
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=30, what="the branch to finish")
        assert len(app.branch_tree) == 2 and app.branch_tree.shown_branch.number == 2
        branch_ids = ids(app.state)
        assert branch_ids[:at] == ids(parent.state)[:at]  # the parent's steps before the branch point
        assert branch_ids[at] == other.id and app.state.run.step(at).forced
        assert engine.branches[-1].at == at and engine.branches[-1].token == other.id
        assert parent.state.run.done is not None and parent.state.run.done.reason == "stopped"  # kept as it was
        # the branch's speed figures are its own: its time to first token (the KV cache cut back, one token fed),
        # its decode steps those after the forced one
        assert app.state.ttft_ms == app.state.run.done.ttft_ms != parent.state.ttft_ms
        assert app.state.decode_latencies == app.state.run.values("latency_ms", at + 1)
        # B lists both; enter on #1 shows it again, exactly as it was
        await pilot.press("B")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchList), what="the list")
        listed = screen_text(app)
        assert "#1 first run" in listed and f"#2 from #1 at step {at + 1}" in listed
        await pilot.press("up", "enter")
        await wait_for(pilot, lambda: app.branch_tree.shown_branch.number == 1, what="#1 shown")
        assert app.state is parent.state
        # compare: the first difference is the branch point
        await pilot.press("B")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchList), what="the list")
        await pilot.press("down", "c")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), what="the comparison")
        assert app.screen.differ == at == first_difference(ids(parent.state), branch_ids)
        assert f"first difference at step {at + 1}" in screen_text(app)
        await pilot.press("escape")
        await pilot.press("q")


async def test_b_while_generating_live_asks_to_pause_first_and_a_replay_cannot_branch(tmp_path):
    engine = ScriptedEngine(delay=0.2, sampler=GREEDY)
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.state.run) >= 2, what="2 steps")
        await pilot.press("b")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, BranchPicker)
        assert any("Pause (space)" in str(n.message) for n in app.toasts)
        await pilot.press("q")

    from tokentui.core.runs.replay import ReplayEngine
    from tokentui.core.runs.run import Run

    run = Run(ScriptedEngine().facts)
    for event in ScriptedEngine(sampler=GREEDY).run("Is OpenAI open?"):
        run.apply(event)
    replay = ReplayEngine(run, speed=0)
    app = make_app(replay)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the replay")
        await pilot.press("b")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, BranchPicker) and len(app.branch_tree) == 1
        assert any("cannot branch" in str(n.message) for n in app.toasts)
        await pilot.press("q")


class LensEngine(ScriptedEngine):
    """The scripted engine with a made-up lens on each step while `options.logit_lens` is on: 4 layers, the last
    one the step's own choice (as the model's output is)."""

    def _run(self, prompt, system, run_id):
        for event in super()._run(prompt, system, run_id):
            if isinstance(event, StepEvent) and self.options.logit_lens:
                alt = event.candidates[-1]
                event = replace(event, lens=[LensRow(1, alt.id, alt.piece, 0.01), LensRow(2, alt.id, alt.piece, 0.05),
                                             LensRow(3, event.id, event.piece, 0.2),
                                             LensRow(4, event.id, event.piece, event.chosen_raw_prob)])
            yield event


async def test_l_turns_the_lens_on_in_the_engine_and_shows_each_layer_for_the_step_in_view():
    engine = LensEngine(delay=0.05, sampler=GREEDY, options=RunOptions(max_new_tokens=40, ignore_eos=True))
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.state.run) >= 1, what="a step")
        assert not app.query_one(LensPanel).display  # off by default
        await pilot.press("l")
        assert app.client.options.logit_lens and engine.options.logit_lens
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=30, what="the end")
        await pilot.pause(0.1)
        panel = app.query_one(LensPanel)
        assert panel.display and not app.query_one("#model").display  # in the model panel's place
        last = app.state.run.last
        text = panel.last_text.plain
        assert panel.border_subtitle == f"step {last.index + 1}" and "on top from layer 3/4" in text
        assert f"{last.chosen_raw_prob * 100:5.1f}%" in text
        await pilot.press("l")
        assert not app.client.options.logit_lens and not app.query_one(LensPanel).display
        assert app.query_one("#model").display
        await pilot.press("q")


def test_pick_layers_keeps_the_first_layer_with_the_chosen_token_and_the_last():
    assert pick_layers(6, 10, {3, 6}) == [1, 2, 3, 4, 5, 6]
    chosen = pick_layers(30, 8, {17, 30})
    assert 17 in chosen and 30 in chosen and len(chosen) == 8 and chosen == sorted(set(chosen))


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
