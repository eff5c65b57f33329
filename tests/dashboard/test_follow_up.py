"""A follow-up turn and a raw run in the dashboard (issue 40, 13; tui/followup.py), read as text at 80×24, 120×30 and
160×48: after an answer `u` opens the editor for the next message; the turn runs as a child of the run in the tree,
the prompt panel says which turn it is and what its prefill reused — the engine's own figures, from the turn's
events — and the tree file records it with its message. Before any answer, or with an empty message: one line,
nothing lost. ctrl+r in the prompt editor runs the prompt raw (no chat template), and the panel says so.

The engine is the real local engine on a tiny random-weight Llama with the embedded model's tokenizer (its chat
template), in process (core/link/local_client.py): what the panel shows is what core/model/turn.py computed."""

from __future__ import annotations

import pytest

from fakes import make_loader, screen_text, wait_for
from snapshot_apps import SnapshotApp
from tiny_models import tiny_model
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.runs.tree import RunTree
from tokentui.core.runs.turns import reuse_line
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui import DashboardConfig
from tokentui.tui.panels import PromptPanel
from tokentui.tui.screens import PromptEditor

SIZES = [(80, 24), (120, 30), (160, 48)]
AGAIN = "And Anthropic?"


@pytest.fixture(scope="module")
def tiny(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer, initializer_range=0.2)
    return LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name="tiny-llama"))


def app_on(loaded, recorder=None, load_delay: float = 0.0) -> SnapshotApp:
    engine = Engine(loaded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=6, ignore_eos=True))
    return SnapshotApp(DashboardConfig(load=make_loader(engine, delay=load_delay), options=engine.options,
                                       sampler=engine.sampler, user_theme_dir=None, recorder=recorder))


def flat(text: str) -> str:
    return " ".join(text.split())


async def ask(pilot, message: str) -> None:
    app = pilot.app
    await pilot.press("u")
    await wait_for(pilot, lambda: isinstance(app.screen, PromptEditor), what="the follow-up editor")
    await pilot.press(*message, "ctrl+s")


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_a_follow_up_runs_as_turn_2_and_says_what_it_reused(tiny, size):
    app = app_on(tiny)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=20, what="the first answer")
        await pilot.pause(0.1)
        assert "u follow-up" in app.query_one(PromptPanel).border_subtitle  # the key named once an answer ends
        first = app.state.run
        await pilot.press("u")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptEditor), what="the follow-up editor")
        await pilot.pause(0.1)
        editor = flat(screen_text(app))
        assert "follow-up" in editor and "turn 2 of the conversation, after turn 1" in editor, editor
        await pilot.press(*AGAIN, "ctrl+s")
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.phase == "done", timeout=20,
                       what="the follow-up's answer")
        await pilot.pause(0.1)
        app.redraw()
        await pilot.pause()
        run = app.state.run
        turn = run.turn
        assert turn is not None and turn.turn == 2 and turn.user == AGAIN
        assert [m.role for m in turn.messages] == ["user", "assistant", "user"]
        assert turn.messages[1].content == first.done.text  # the answer as generated is the history
        assert turn.reused_tokens >= len(first.prompt.ids) and run.prefill.reused_tokens == turn.reused_tokens
        said = f"turn 2 · {reuse_line(turn, run.prefill)}"  # the engine's own figures, in the panel's words
        assert f"reused from turn 1 (KV " in said and f"prefill {run.prefill.tokens} new tokens" in said
        panel = app.query_one(PromptPanel).last_text.plain
        assert said in panel, panel
        screen = screen_text(app)
        assert said[:40] in screen or said[:40] in flat(screen), screen  # on screen at this size, from its start
        assert "▸2" in panel  # where turn 2's user message starts among the chips
        assert app.branch_tree.branches[1].label.startswith("#2 turn 2 after #1: And Anthropic?")
        await pilot.press("q")


async def test_a_follow_up_before_any_answer_or_an_empty_one_is_one_line(tiny):
    app = app_on(tiny, load_delay=1.0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("u")  # still loading: no answer yet
        await pilot.pause(0.1)
        assert not isinstance(app.screen, PromptEditor)
        assert app.toasts and "not loaded yet" in app.toasts[-1].message, app.toasts
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=20, what="the first answer")
        await pilot.press("u")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptEditor), what="the follow-up editor")
        await pilot.press(" ", " ", "ctrl+s")  # only spaces: refused in the dialog, which stays open
        await pilot.pause(0.1)
        assert isinstance(app.screen, PromptEditor) and "the follow-up is empty" in screen_text(app)
        await pilot.press(*"Why?", "ctrl+s")  # what was typed is still there: the message goes on from it
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.phase == "done", timeout=20,
                       what="the follow-up")
        assert app.state.run.turn.user == "  Why?"


async def test_the_tree_file_records_the_turn_with_its_message(tiny, tmp_path):
    from tokentui.core.runs.record_writer import RunRecorder

    app = app_on(tiny, recorder=RunRecorder(tmp_path))
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=20, what="the first answer")
        await ask(pilot, AGAIN)
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.phase == "done", timeout=20,
                       what="the follow-up")
        path = app.branch_tree.path
        await pilot.press("q")
    tree = RunTree.read(path)
    node = tree.node(2)
    assert node.is_turn and not node.is_branch and (node.parent, node.turn, node.user) == (1, 2, AGAIN)
    assert tree.runs[2].turn.user == AGAIN and tree.runs[2].turn.reused_tokens > 0
    assert tree.ends[2].reason == "length" and tree.ends[2].steps == 6


async def test_ctrl_r_in_the_editor_runs_the_prompt_raw(tiny, smol_tokenizer):
    app = app_on(tiny)
    async with app.run_test(size=(80, 24)) as pilot:  # the smallest size: the panel's first line is still shown
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=20, what="the first answer")
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptEditor), what="the editor")
        await pilot.press("ctrl+a", *"The sky is", "ctrl+r")
        await pilot.pause(0.1)
        assert "edit prompt · raw: no chat template" in flat(screen_text(app))
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.state.run.turn is not None and app.state.phase == "done", timeout=20,
                       what="the raw run")
        await pilot.pause(0.1)
        app.redraw()
        await pilot.pause()
        run = app.state.run
        assert run.turn.raw and run.prompt.ids == smol_tokenizer("The sky is")["input_ids"]
        panel = app.query_one(PromptPanel)
        assert "raw: no chat template" in panel.last_text.plain and "raw" in panel.border_subtitle
        assert "raw: no chat template" in flat(screen_text(app))
