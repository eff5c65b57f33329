"""The sublayer column beside the logit lens (issue 39), read as the terminal shows it at 80×24, 120×30 and 160×48
on the scripted engine with made-up sublayer figures (tests/attention_fakes.py): `l` asks the engine for the lens
and the sublayer norms together; each layer's row shows the step's own SublayerRow — the stream's norm leaving
the layer, the norms of what attention and the MLP added, the lens's top token after the MLP (and, where the panel
is wide, after the attention sublayer, with → where the two differ); a past step redraws from its event."""

from __future__ import annotations

import pytest

from attention_fakes import AttentionEngine
from fakes import make_loader, screen_text, wait_for
from snapshot_apps import SnapshotApp
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.core.steps.display import display_text
from tokentui.tui import DashboardConfig
from tokentui.tui.panels import LensPanel
from tokentui.tui.panels.sublayers import BOTH_TOPS, norm_text

SIZES = [(80, 24), (120, 30), (160, 48)]
GREEDY = SamplerSettings(temperature=0.0)


def rows_of(text: str) -> dict[int, str]:
    """Each layer's row, with the line it wraps onto (a long token name) joined to it."""
    out, last = {}, None
    for line in text.splitlines():
        head = line[:4].strip().rstrip("◆")
        if head.isdigit():
            last = int(head)
            out[last] = line
        elif last is not None and line.startswith("    ") and line.strip():
            out[last] += " " + line.strip()
        else:
            last = None
    return out


def check_rows(app, step) -> None:
    panel = app.query_one(LensPanel)
    text = panel.last_text.plain
    rows = rows_of(text)
    assert rows, text
    wide = panel.content_size.width >= BOTH_TOPS
    for sub in step.sublayers:
        line = rows.get(sub.layer)
        if line is None:
            continue  # not every layer fits a short panel (the panel says how many more)
        numbers = line.split()[1:4]
        assert numbers == [norm_text(sub.resid_after), norm_text(sub.attn_norm), norm_text(sub.mlp_norm)], line
        assert display_text(sub.after_mlp.piece) in line
        if wide:
            assert display_text(sub.after_attn.piece) in line
            assert (" → " in line) == (sub.after_attn.id != sub.after_mlp.id), line
    assert len(rows) == len(step.sublayers) or f"{len(step.sublayers) - len(rows)} more layers" in text
    assert "…" not in screen_text(app)


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_l_asks_for_the_sublayers_and_the_column_is_the_steps_own(size):
    engine = AttentionEngine(sampler=GREEDY, options=RunOptions(max_new_tokens=12, ignore_eos=True),
                             pause_before={2})
    app = SnapshotApp(DashboardConfig(load=make_loader(engine), sampler=GREEDY, options=engine.options,
                                      user_theme_dir=None, recorder=None))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.controller.paused and len(app.state.run) == 2, what="paused at step 2")
        await pilot.press("l")
        await pilot.pause(0.05)
        assert engine.options.logit_lens and engine.options.sublayers
        await pilot.press("space")
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run's end")
        await pilot.pause(0.1)
        app.redraw()
        await pilot.pause(0.05)
        step = app.state.view_step
        assert step.sublayers and len(step.sublayers) == len(step.lens)
        check_rows(app, step)
        if size[0] >= 160:  # everything at 160×48: both top tokens
            assert app.query_one(LensPanel).content_size.width >= BOTH_TOPS
        await pilot.press("left_square_bracket", "left_square_bracket")
        await pilot.pause(0.05)
        past = app.state.view_step
        assert past.index == step.index - 2 and past.sublayers != step.sublayers
        check_rows(app, past)
        await pilot.press("l")
        await pilot.pause(0.05)
        assert not engine.options.logit_lens and not engine.options.sublayers
