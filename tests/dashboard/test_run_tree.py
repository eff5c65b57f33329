"""One run tree per prompt, and the seams between branching, records and replay (issue 22): the dashboard writes a
tree file that names every run's record; a branch's record replays on its own, in the dashboard too; a tree replays
whole (B lists its runs, enter switches, c compares, as live); the recorded settings are what a replay shows; one
token count and one time to first token everywhere; a parent a branch stopped says so; the quit line names the
tree."""

from __future__ import annotations

import json
import subprocess
import sys

from fakes import ScriptedEngine, make_loader, screen_text, wait_for
from tokentui.commands.replay import replay_config
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.replay import ReplayEngine
from tokentui.core.runs.run import Run
from tokentui.core.runs.tree import RunTree, is_tree_file
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.panels import SamplerPanel, StatusLine
from tokentui.tui.screens.branch_list import BranchList
from tokentui.tui.screens.compare import CompareScreen

SIZE = (120, 40)
GREEDY = SamplerSettings(temperature=0.0)
AT = 4  # step 5, 0-based


def live_app(engine, recorder=None) -> TokentuiApp:
    return TokentuiApp(DashboardConfig(load=make_loader(engine), sampler=engine.sampler, options=engine.options,
                                       user_theme_dir=None, recorder=recorder))


def status(app) -> str:
    return app.query_one(StatusLine).last_text.plain


async def branch_once(pilot, app) -> None:
    """The scripted run to its end, then a branch at step 5 with the first candidate it did not take."""
    await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the first run")
    parent = app.branch_tree.shown_branch
    step = parent.state.run.step(AT)
    token = next(c.id for c in step.candidates if c.id != step.id)
    assert app.controller.branch_at(parent, step, token)
    await wait_for(pilot, lambda: app.state.phase == "done" and len(app.branch_tree) == 2, timeout=10,
                   what="the branch")


async def a_recorded_tree(tmp_path):
    """A live session with one branch, recorded: (the tree file, the app's branch tree after it)."""
    engine = ScriptedEngine(sampler=GREEDY)
    app = live_app(engine, RunRecorder(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await branch_once(pilot, app)
        tree = app.branch_tree
        await pilot.press("q")
    (path,) = tmp_path.glob("*.tree.jsonl")
    return path, tree, app


# ---- the tree file ---------------------------------------------------------------------------------------------

async def test_the_dashboard_writes_one_tree_file_naming_each_run_and_how_it_ended(tmp_path):
    path, tree, app = await a_recorded_tree(tmp_path)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [line["event"] for line in lines] == ["tree", "tree_run", "tree_end", "tree_run", "tree_end"]
    header, first, second = lines[0], lines[1], lines[3]
    assert header["prompt"] == "Is OpenAI open?" and header["version"] == 1
    assert "parent" not in first and second["parent"] == 1 and second["at"] == AT
    ends = {line["number"]: line for line in lines if line["event"] == "tree_end"}
    assert ends[1]["reason"] == "eos" and ends[2]["reason"] in ("eos", "length")
    assert ends[2]["steps"] == tree.number(2).own_steps  # its own steps, from the branch point on
    for node in (first, second):  # each record is next to the tree, whole, and stands alone
        run = Run.from_record(tmp_path / node["record"])
        assert run.record_notice is None and run.prompt is not None
    branch_run = Run.from_record(tmp_path / second["record"])
    assert branch_run.branch.parent == first["record"]  # the branch names its parent's record, not "#1"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert app.controller.quit_lines() == [f"2 runs of one prompt recorded in {path} (play them back: tokentui "
                                           f"replay {path})"]
    back = RunTree.read(path)
    assert len(back) == 2 and back.node(2).parent == 1 and set(back.runs) == {1, 2} and is_tree_file(path)


async def test_a_parent_a_branch_stopped_is_listed_as_stopped_by_it_not_done(tmp_path):
    engine = ScriptedEngine(delay=0.05, sampler=GREEDY, options=RunOptions(max_new_tokens=60, ignore_eos=True))
    app = live_app(engine, RunRecorder(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.state.run) >= 8, what="8 steps")
        await pilot.press("space")
        await wait_for(pilot, lambda: app.client.paused, what="paused")
        await pilot.pause(0.2)
        parent = app.branch_tree.shown_branch
        step = parent.state.run.step(AT)
        app.controller.branch_at(parent, step, next(c.id for c in step.candidates if c.id != step.id))
        # paused by the user, the branch stays paused after its first step (issue 40): resumed, it goes on
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and len(app.state.run) == AT + 1,
                       what="the branch's first step")
        await pilot.press("space")
        await wait_for(pilot, lambda: parent.state.done is not None and len(app.state.run) > AT + 2, timeout=10,
                       what="the parent's end and the branch's first steps")
        assert parent.state.done.reason == "stopped"
        assert parent.ending == f"stopped at step {parent.total_steps} by #2"
        await pilot.press("B")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchList), what="the runs")
        assert f"stopped at step {parent.total_steps} by #2" in screen_text(app)
        await pilot.press("escape", "q")
    (path,) = tmp_path.glob("*.tree.jsonl")
    ends = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if '"tree_end"' in line]
    assert {"event": "tree_end", "number": 1, "reason": "stopped", "steps": ends[0]["steps"],
            "superseded_by": 2} in ends


# ---- one count, one time to first token ------------------------------------------------------------------------

async def test_after_a_branch_the_status_line_the_runs_list_and_the_comparison_count_the_same_tokens():
    engine = ScriptedEngine(sampler=GREEDY)
    app = live_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await branch_once(pilot, app)
        branch = app.branch_tree.shown_branch
        own, total = branch.own_steps, branch.total_steps
        assert own == app.state.done.tokens and total == AT + own  # the engine's count is the branch's own
        words = f"{own} tokens of its own · {total} in all"
        assert words in status(app)
        await pilot.press("B")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchList), what="the runs")
        assert words in screen_text(app)
        await pilot.press("up", "c")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), what="the comparison")
        assert f"{own} own · {total} in all" in screen_text(app)


async def test_a_branch_keeps_the_same_time_to_first_token_after_its_run_ends():
    engine = ScriptedEngine(delay=0.02, sampler=GREEDY)
    app = live_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the first run")
        parent = app.branch_tree.shown_branch
        step = parent.state.run.step(AT)
        app.controller.branch_at(parent, step, next(c.id for c in step.candidates if c.id != step.id))
        await wait_for(pilot, lambda: len(app.state.run) > AT + 1, timeout=10, what="the forced step")
        live = app.state.ttft_ms
        assert live == app.state.run.step(AT).latency_ms  # the branch's own first step
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the branch's end")
        assert app.state.ttft_ms == live == app.state.done.ttft_ms


# ---- replay --------------------------------------------------------------------------------------------------

async def test_a_branch_record_replays_in_the_dashboard_with_its_prefix(tmp_path):
    path, _, _ = await a_recorded_tree(tmp_path)
    second = json.loads(path.read_text(encoding="utf-8").splitlines()[3])
    record = tmp_path / second["record"]
    engine = ReplayEngine.from_file(record, speed=0)
    app = TokentuiApp(replay_config(engine, user_theme_dir=None))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.phase in ("done", "error"), timeout=10, what="the replay")
        assert app.state.phase == "done" and app.state.error_message is None
        run = Run.from_record(record)
        assert app.state.answer_text == run.done.text
        await pilot.pause(0.2)
        assert run.branch.prefix_text.strip()[:10] in screen_text(app)  # the answer starts with the prefix
        assert f"step {run.offset + len(run)}" in screen_text(app)  # steps numbered from the prompt on
        await pilot.press("q")
    assert app.return_code == 0


async def test_a_tree_replays_whole_and_its_runs_are_listed_switched_and_compared(tmp_path):
    path, live_tree, _ = await a_recorded_tree(tmp_path)
    engine = ReplayEngine.from_file(path, speed=0)
    app = TokentuiApp(replay_config(engine, user_theme_dir=None))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.phase == "done", timeout=10,
                       what="both runs played")
        for number in (1, 2):  # each run as it ran live, token for token
            assert app.branch_tree.number(number).state.run.values("id") == \
                live_tree.number(number).state.run.values("id")
        assert app.branch_tree.number(1).state.done.reason == live_tree.number(1).state.done.reason
        await pilot.press("B")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchList), what="the runs")
        await pilot.press("up", "enter")
        await wait_for(pilot, lambda: app.branch_tree.shown_branch.number == 1, what="#1 shown")
        await pilot.press("B")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchList), what="the runs again")
        await pilot.press("down", "c")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), what="the comparison")
        assert f"first difference at step {AT + 1}" in screen_text(app)


def test_headless_json_replay_of_a_tree_streams_each_run_after_its_marker(tmp_path):
    import asyncio

    path, live_tree, _ = asyncio.run(a_recorded_tree(tmp_path))
    result = subprocess.run([sys.executable, "-m", "tokentui", "replay", str(path), "--headless", "--json",
                             "--speed", "0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    markers = [n for n, line in enumerate(lines) if line["event"] == "tree_run"]
    assert len(markers) == 2 and lines[0]["event"] == "model"
    first = lines[markers[0] + 1:markers[1]]
    second = lines[markers[1] + 1:]
    assert [e["id"] for e in first if e["event"] == "step"] == live_tree.number(1).state.run.values("id")
    assert second[0]["event"] == "prompt" and second[1]["event"] == "branch" and second[-1]["event"] == "done"
    assert lines[markers[1]]["parent"] == 1 and lines[markers[1]]["at"] == AT


async def test_a_replay_shows_the_settings_it_recorded_and_their_changes_never_a_next_run(tmp_path):
    engine = ScriptedEngine(sampler=SamplerSettings(temperature=0.7), pause_before={5})
    app = live_app(engine, RunRecorder(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engine.paused, what="paused before step 6")
        app.controller.change_sampler(top_k=1, top_p=0.85)
        app.client.resume()
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the run")
        await pilot.press("q")
    (record,) = [p for p in tmp_path.glob("*.jsonl") if not p.name.endswith(".tree.jsonl")]
    replay = ReplayEngine.from_file(record, speed=0)
    app = TokentuiApp(replay_config(replay, user_theme_dir=None))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the replay")
        await pilot.pause(0.2)
        panel = app.query_one(SamplerPanel).last_text.plain
        assert "top-k       1" in panel and "top-p       0.85" in panel  # the last step's recorded settings
        assert "step 6 top-k off→1" in panel and "next run" not in panel and "applies" not in panel
        await pilot.press("less_than_sign")  # the first step: the settings before the change, no change listed
        await pilot.pause(0.2)
        panel = app.query_one(SamplerPanel).last_text.plain
        assert "top-k       off" in panel and "top-p       0.90" in panel and "→" not in panel
        assert "replay" in status(app)
