"""The comparison view wraps its answers as the answer panel does (issue 23 item 15), and the lines of the
comparison and of the runs list break only between their parts (item 12: "(esc⏎ closes)", "· done ·⏎ KV reused")."""

from __future__ import annotations

from fakes import ScriptedEngine, make_loader, wait_for
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.format import whole_parts
from tokentui.tui.panels.answer_layout import AnswerLayout
from tokentui.tui.screens.branch_list import BranchList
from tokentui.tui.screens.compare import CompareScreen, answer_texts


def lines_of(widget) -> list[str]:
    return ["".join(seg.text for seg in widget.render_line(y)).rstrip() for y in range(widget.size.height)]


def laid_out(texts: list[str], width: int) -> list[str]:
    """The answer panel's lines (its AnswerLayout) for these token texts at `width` cells."""
    layout = AnswerLayout()
    layout.restart(width)
    for text in texts:
        layout.lay_out(layout.add(text))
    return ["".join(texts[i][a:b] for i, a, b in line).rstrip() for line in layout.lines]


async def branch_and_list(pilot, app):
    await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
    await pilot.press("left", "left", "left", "b")
    await pilot.pause(0.5)
    await pilot.press("down", "enter")
    await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.phase == "done", what="the branch")
    await pilot.press("B")
    await wait_for(pilot, lambda: isinstance(app.screen, BranchList), what="the runs list")
    await pilot.pause(0.2)


async def test_the_runs_list_and_the_comparison_break_lines_between_parts_and_wrap_as_the_answer_panel():
    app = TokentuiApp(DashboardConfig(load=make_loader(ScriptedEngine()), user_theme_dir=None, recorder=None))
    async with app.run_test(size=(60, 24)) as pilot:
        await branch_and_list(pilot, app)
        listed = lines_of(app.screen.query_one("#branch-list"))
        entries = [line for line in listed if line.strip()]
        assert any("KV reused" in line for line in entries), listed
        for line in entries:
            assert not line.endswith("·"), listed  # a break drops the separator
            assert not line.strip().startswith("reused") and not line.strip().startswith("token"), listed
        await pilot.press("down", "c")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), what="the comparison")
        await pilot.pause(0.3)
        screen = app.screen
        summary = lines_of(screen.query_one("#compare-summary"))
        assert any(line.strip().endswith("(esc closes)") for line in summary), summary
        assert not any(line.strip().endswith("(esc") for line in summary), summary


async def test_the_comparison_wraps_each_answer_as_the_answer_panel_would_at_its_width():
    app = TokentuiApp(DashboardConfig(load=make_loader(ScriptedEngine()), user_theme_dir=None, recorder=None))
    async with app.run_test(size=(60, 24)) as pilot:
        await branch_and_list(pilot, app)
        await pilot.press("down", "c")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), what="the comparison")
        await pilot.pause(0.3)
        screen = app.screen
        for branch in (screen.left, screen.right):
            pane = screen.query_one(f"#compare-{branch.number}")
            shown = [line for line in lines_of(pane) if line]
            assert shown == [line for line in laid_out(answer_texts(branch), pane.content_size.width) if line]


def test_parts_are_never_broken_and_a_break_drops_its_separator():
    text = whole_parts([("#2 from #1 at step 14", ""), ("15 tokens", "dim"), ("done: end token", "dim"),
                        ("KV reused 25", "dim")], 40, indent="    ")
    assert text.plain.split("\n") == ["#2 from #1 at step 14 · 15 tokens", "    done: end token · KV reused 25"]
    assert whole_parts([("a", ""), ("b", "")], 0).plain == "a · b"
