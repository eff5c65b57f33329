"""Characters a terminal draws as nothing, or as a blank that passes for a space, are named or escaped wherever a
piece is drawn (core/steps/display.py, the one mapping): the lens showed the embedded model's no-break-space token
(id 15442, U+00A0) as a blank."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fakes import ScriptedEngine, make_loader, screen_text, wait_for
from tokentui.core.runs.events import LensRow, StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.core.steps.display import display_bytes, display_piece, display_text
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.panels import CandidatesPanel, LensPanel
from tokentui.tui.screens.branch_picker import BranchPicker


@pytest.mark.parametrize("text, shown", [
    ("\u00a0", "<NBSP>"),
    ("\u00a0Open", "<NBSP>Open"),
    ("a\u200db", "a<ZWJ>b"),
    ("\u200b", "<ZWSP>"),
    ("\ufeff", "<BOM>"),
    ("\u3000", "<U+3000>"),  # the ideographic space: a blank two cells wide
    ("\u2028", "<U+2028>"),  # a line separator
    ("\ue000", "<U+E000>"),  # private use
    ("é", "é"),
    ("开放", "开放"),
    ("😀", "😀"),
])
def test_invisible_characters_are_named_or_escaped(text, shown):
    assert display_text(text) == shown
    assert display_text(shown) == shown  # idempotent: a panel redrawing an engine's piece leaves it as it is


def test_bytes_that_make_a_no_break_space_show_its_name():
    assert display_bytes("\u00a0".encode()) == "<NBSP>"
    assert display_bytes(b"\xc2") == "<0xC2>"  # half of it: a byte, as before


def test_the_embedded_models_no_break_space_token_is_named(smol_tokenizer):
    assert smol_tokenizer.decode([15442]) == "\u00a0"  # the oracle: the tokenizer's own text for the id
    assert display_piece(smol_tokenizer, 15442) == "<NBSP>"


class NbspLensEngine(ScriptedEngine):
    """The scripted engine whose steps carry a lens whose top token at layer 1 is a no-break space, written as an
    older record holds it (the raw character) and as the engine writes it now (named)."""

    def _run(self, prompt, system, run_id):
        for event in super()._run(prompt, system, run_id):
            if isinstance(event, StepEvent):
                event = replace(event, lens=[LensRow(1, 15442, "\u00a0", 0.3), LensRow(2, event.id, event.piece, 0.9)],
                                candidates=[replace(c, piece="\u00a0") if n == 1 else c
                                            for n, c in enumerate(event.candidates)])
            yield event


async def test_the_lens_and_the_candidates_name_a_no_break_space():
    engine = NbspLensEngine(sampler=SamplerSettings(temperature=0.0), options=RunOptions(logit_lens=True))
    app = TokentuiApp(DashboardConfig(load=make_loader(engine), sampler=engine.sampler, options=engine.options,
                                      user_theme_dir=None, recorder=None))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run")
        await pilot.pause(0.1)
        lens = app.query_one(LensPanel).last_text.plain
        assert "<NBSP>" in lens and "\u00a0" not in lens, lens
        candidates = app.query_one(CandidatesPanel).last_text.plain
        assert "<NBSP>" in candidates and "\u00a0" not in candidates
        await pilot.press("b")  # the branch picker lists the same candidates, drawn the same way
        await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), what="the branch picker")
        await pilot.pause(0.1)
        picker = screen_text(app)
        assert "<NBSP>" in picker and "\u00a0" not in picker
