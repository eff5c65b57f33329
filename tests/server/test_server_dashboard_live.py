"""The dashboard on a real llama-server (tests/llama_server_fixture.py), through Textual's pilot: the model panel
says where its numbers come from, time travel goes back over a served run, and `b` branches it: the server goes
on from the picked token."""

from __future__ import annotations

from fakes import screen_text, wait_for
from tokentui.core.server.engine import ServerEngine, ServerOptions
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.screens.branch_picker import BranchPicker

GREEDY = SamplerSettings(temperature=0.0)


def served_app(url: str) -> TokentuiApp:
    options = RunOptions(max_new_tokens=16)
    return TokentuiApp(DashboardConfig(
        load=lambda progress: ServerEngine.connect(ServerOptions(url), GREEDY, options, progress),
        prompt="Is OpenAI open?", sampler=GREEDY, options=options, user_theme_dir=None))


async def test_a_served_run_in_the_dashboard_goes_back_and_branches(llama_server):
    app = served_app(llama_server.url)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=60, what="the served run")
        text = screen_text(app)
        assert "llama.cpp" in text and "not reported by the server" in text and "None" not in text
        assert not app.query_one("#anatomy").display  # the one-pass row, on by default at 160×48, is not here
        parent = app.branch_tree.shown_branch
        parent_ids = parent.state.run.values("id")
        at = 4
        while app.state.view_index is None or app.state.view_index > at:
            await pilot.press("[")
        assert app.state.view_index == at
        step = parent.state.run.step(at)
        await pilot.press("b")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), what="the picker")
        other = next(c for c in step.candidates if c.id != step.id)
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.phase == "done", timeout=60,
                       what="the branch to finish")
        branch_ids = app.state.run.values("id")
        assert branch_ids[:at] == parent_ids[:at] and branch_ids[at] == other.id
        assert app.state.run.step(at).forced
        assert "None" not in screen_text(app)
        await pilot.press("B")  # the runs of the prompt: a served branch claims no KV figure of its own
        await wait_for(pilot, lambda: "runs of this prompt" in screen_text(app), what="the list")
        listed = screen_text(app)
        assert "KV the server's prefix cache" in listed and "prefilled afresh" not in listed
        await pilot.press("escape")
        await pilot.press("q")
