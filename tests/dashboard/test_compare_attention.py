"""Attention in the comparison of two runs (issue 39, item 1: it works with branch compare): `A` in the comparison
shows, for one step of both runs, each run's strongest sources as its own step event carries them (layer, head,
position, weight), starting at the step after the first difference, that step underlined in both answers; `[` `]`
move the step, `,` `.` the layer, `;` `'` the head; a run that ran with the view off says so in one line."""

from __future__ import annotations

import pytest

from dataclasses import replace

from attention_fakes import HEADS, LAYERS, AttentionEngine, top, weights
from tokentui.core.runs.attention import LayerAttention
from fakes import make_loader, wait_for
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.attention_view import source_rows
from tokentui.tui.format import percent
from tokentui.tui.screens.branch_list import BranchList
from tokentui.tui.screens.compare import CompareScreen

GREEDY = SamplerSettings(temperature=0.0)
SIZES = [(80, 24), (120, 30), (160, 48)]


class PartingEngine(AttentionEngine):
    """AttentionEngine whose branches look elsewhere once their own token is in the prefix (the steps after the
    branch point), as a real model's queries do: the made-up weights of another head's pattern."""

    parted_at: int | None = None

    def _branch(self, point, run_id):
        self.parted_at = point.at
        yield from super()._branch(point, run_id)

    def inside(self, step, prompt_len):
        step = super().inside(step, prompt_len)
        if self.parted_at is None or step.index <= self.parted_at or not step.attention:
            return step
        k = self.options.attention_top
        moved = [LayerAttention(la.layer, la.query, None, top(weights(la.query, la.layer, HEADS), k),
                                None if la.heads is None else
                                tuple(top(weights(la.query, la.layer, HEADS + 1 + h), k) for h in range(HEADS)))
                 for la in step.attention]
        return replace(step, attention=moved)


def pane(screen, number: int) -> str:
    return screen.query_one(f"#compare-attention-{number}").render().plain


def rows_of(text: str) -> list[tuple[int, str]]:
    """(position, weight as shown) of each listed source."""
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3 and parts[0].isdigit() and parts[1].isdigit() and parts[2].endswith("%"):
            out.append((int(parts[1]), parts[2]))
    return out


def expected(branch, step: int, layer: int | None, head: int | None) -> list[tuple[int, str]]:
    attention = branch.state.run.step(step).attention
    chosen = next((la for la in attention if la.layer == layer), attention[-1])
    return [(p, percent(w)) for p, w in source_rows(chosen, head)[:6]]


async def compare(pilot, app):
    await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
    await pilot.press(*["left_square_bracket"] * 6, "b")
    await pilot.pause(0.5)
    await pilot.press("down", "enter")
    await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.phase == "done", what="the branch")
    await pilot.press("B")
    await wait_for(pilot, lambda: isinstance(app.screen, BranchList), what="the runs list")
    await pilot.pause(0.2)
    await pilot.press("down", "c")
    await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), what="the comparison")
    await pilot.pause(0.2)
    return app.screen


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_A_shows_each_runs_attention_at_the_step_after_the_difference_and_keys_move_it(size):
    engine = PartingEngine(sampler=GREEDY, options=RunOptions(max_new_tokens=10, ignore_eos=True, attention=True,
                                                              attention_heads=True, attention_top=24))
    app = TokentuiApp(DashboardConfig(load=make_loader(engine), sampler=GREEDY, options=engine.options,
                                      user_theme_dir=None, recorder=None))
    async with app.run_test(size=size) as pilot:
        screen = await compare(pilot, app)
        left, right, differ = screen.left, screen.right, screen.differ
        assert differ is not None
        assert not screen.query_one("#compare-attention").display  # off until A
        await pilot.press("A")
        await pilot.pause(0.1)
        assert screen.query_one("#compare-attention").display
        step = differ + 1
        for branch in (left, right):
            text = pane(screen, branch.number)
            assert text.startswith(f"step {step + 1} · layer {LAYERS}/{LAYERS} · head mean"), text
            assert rows_of(text) == expected(branch, step, None, None)
            assert [line.split()[1] for line in text.splitlines()[1:] if line.endswith("  sink")] == ["0"]
            answer = screen.query_one(f"#compare-{branch.number}")
            assert answer.mark == step
        summary = screen.query_one("#compare-attention-summary").render().plain
        assert summary.startswith(f"attention at step {step + 1}: the runs look at different sources")
        await pilot.press("left_square_bracket")  # the step where they part: chosen from the shared prefix
        await pilot.pause(0.1)
        assert rows_of(pane(screen, left.number)) == rows_of(pane(screen, right.number)) \
            == expected(left, differ, None, None)
        assert "the same sources in both runs" in screen.query_one("#compare-attention-summary").render().plain
        await pilot.press("comma", "apostrophe")  # the layer before the last, the first head
        await pilot.pause(0.1)
        for branch in (left, right):
            text = pane(screen, branch.number)
            assert f"layer {LAYERS - 1}/{LAYERS} · head 1/{HEADS}" in text, text
            assert rows_of(text) == expected(branch, differ, LAYERS - 1, 0)
        await pilot.press("A")
        await pilot.pause(0.1)
        assert not screen.query_one("#compare-attention").display
        assert all(screen.query_one(f"#compare-{b.number}").mark is None for b in (left, right))


async def test_a_run_without_attention_says_so_in_one_line():
    engine = AttentionEngine(sampler=GREEDY, options=RunOptions(max_new_tokens=10, ignore_eos=True))
    app = TokentuiApp(DashboardConfig(load=make_loader(engine), sampler=GREEDY, options=engine.options,
                                      user_theme_dir=None, recorder=None))
    async with app.run_test(size=(120, 30)) as pilot:
        screen = await compare(pilot, app)
        await pilot.press("A")
        await pilot.pause(0.1)
        for branch in (screen.left, screen.right):
            text = pane(screen, branch.number)
            assert text.startswith("no attention at step") and "attention view off" in text, text
            assert len(text.splitlines()) == 1
        assert "only one run (or neither) has attention here" in \
            screen.query_one("#compare-attention-summary").render().plain
