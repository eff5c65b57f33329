"""Wording (issue 40, 9): a label that is not a token gets no `␣` glyph (an adopted fan-out sample's branch read
`AI → sample␣#1`), and the replay's lens notice is one parenthesis deep (it nested two). Read as the terminal shows
it, at 80×24, 120×30 and 160×48."""

from __future__ import annotations

import pytest

from fakes import ScriptedEngine, make_loader, screen_text, wait_for
from snapshot_apps import SnapshotApp
from tokentui.core.settings import SamplerSettings
from tokentui.tui import DashboardConfig
from tokentui.tui.screens.fanout import FanoutScreen

SIZES = [(80, 24), (120, 30), (160, 48)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_an_adopted_samples_label_has_no_space_glyph(size):
    engine = ScriptedEngine(sampler=SamplerSettings(temperature=0.8, top_p=1.0, seed=5))
    app = SnapshotApp(DashboardConfig(load=make_loader(engine), user_theme_dir=None, sampler=engine.sampler,
                                      options=engine.options, recorder=None))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", timeout=10, what="the run to finish")
        await pilot.press("less_than_sign", *["right_square_bracket"] * 4, "f")
        await wait_for(pilot, lambda: isinstance(app.screen, FanoutScreen) and not app.screen.state.running,
                       what="the fan-out")
        await pilot.press("enter")  # adopt the most likely sample
        await wait_for(pilot, lambda: len(app.branch_tree) == 2 and app.state.phase == "done", timeout=10,
                       what="the adopted sample's branch")
        branch = app.branch_tree.shown_branch
        assert branch.label.endswith(f"→ sample #{branch.sample}"), branch.label
        await pilot.press("B")  # the runs of this prompt, each by its label
        await pilot.pause(0.2)
        text = screen_text(app)
        assert f"sample #{branch.sample}" in text and "sample␣" not in text, text


async def test_the_copy_back_is_not_host_to_the_host():
    """The one-pass panel's copy back to the host read `host to the host` (the CPU being host and device): it is
    named by where it comes from."""
    from snapshot_apps_anatomy import SAMPLED, TimedEngine

    from tokentui.tui.panels import AnatomyPanel

    engine = TimedEngine(sampler=SAMPLED)
    app = SnapshotApp(DashboardConfig(load=make_loader(engine), sampler=SAMPLED, user_theme_dir=None, recorder=None))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.pause(0.1)
        app.redraw()
        await pilot.pause()
        text = app.query_one("#anatomy", AnatomyPanel).last_text.plain
        assert "host from the device " in text and "to the host" not in text, text


def test_the_help_names_no_activation_dtype_of_its_own():
    """`--help` said a 4-bit GGUF runs with bf16 activations while the panel and the README said int16: the dtype is
    the kernel's, chosen at load, and the model panel's border says it (one source)."""
    from tokentui.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "bf16 activations" not in text and "the model panel says which" in text, text


async def test_a_four_bit_models_device_row_says_its_weights_are_four_bit():
    """`device cpu · float32` for a 4-bit model read as if it ran in float32: its matrices are 4-bit."""
    from test_nothing_cut import EMBEDDED, finished

    _screen, panels = await finished((160, 48))
    text = panels["ModelPanel"][0]
    assert f"device       cpu · {EMBEDDED.dtype} + 4-bit weights" in text, text
