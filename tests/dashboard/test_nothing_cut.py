"""Nothing is cut with "…" at 160×48, and at smaller sizes the model, candidates and one-pass panels take shorter
wordings instead (issue 40: `10 kept, 72.1% of the raw mass; entropy…`, `a draw from the kept entries (seed 0); …`,
`180 bytes out: the id and the reported …` at 160×48; `model runs 102 (prefill + 101 dec…`, `entropy 0.28 bits →
0.00 after samp…` at 120×30). Read as the terminal shows it (the screen's text), on a model whose facts are the
embedded model's words: a name with its parenthesis, 4-bit weights, a decode plan."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from fakes import FACTS, make_loader, screen_text, wait_for
from snapshot_apps_anatomy import SAMPLED, TimedEngine
from tokentui.core.runs.facts import QuantFacts
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.format import shorter_form
from tokentui.tui.panels import AnatomyPanel, CandidatesPanel, ModelPanel

QUANT = QuantFacts(blocks="Q4_1", bits=4, group=32, scale_dtype="float32", activation_dtype="int16",
                   head="Q8_0 as two 4-bit halves; its 256 highest scores recomputed in float32", exact_scores=256,
                   matrices=211, dequantized=1, dequantized_blocks="Q8_0", weight_bytes=102_477_312)
EMBEDDED = replace(FACTS, tied_lm_head=True, name="SmolLM2-135M-Instruct (Q4_1 GGUF, embedded)", quantization=QUANT)
SIZES = [(80, 24), (120, 30), (160, 48)]
# "…" that is not a cut: the prompt panel's elided template lines ("… 3 more lines (122 characters) …"), a path
# shortened in its middle by short_path, a candidate's name cut in its column (not the chosen one's)
ELISIONS = re.compile(r"… \d+ more lines? \(|\S…\S*\.jsonl|^[│ ]*\s{2}\S+… +\d")


async def finished(size, facts=EMBEDDED, keys=()):
    engine = TimedEngine(facts=facts, sampler=SAMPLED)  # each step timed: the one-pass panel's time column
    app = TokentuiApp(DashboardConfig(load=make_loader(engine), sampler=SAMPLED, user_theme_dir=None))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.done is not None, what="the run's end")
        await pilot.press(*keys)
        await pilot.pause(0.1)
        app.redraw()
        await pilot.pause()
        panels = {type(p).__name__: (p.last_text.plain if p.last_text is not None else "", p.content_size)
                  for p in app.query("ModelPanel, CandidatesPanel, AnatomyPanel") if p.display}
        return screen_text(app), panels


def cut_lines(screen: str) -> list[str]:
    return [line for line in screen.splitlines() if "…" in line and not ELISIONS.search(line)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_no_panel_line_is_cut(size):
    screen, panels = await finished(size)
    assert not cut_lines(screen), "\n".join(cut_lines(screen))
    for name, (text, box) in panels.items():
        assert all(len(line) <= box.width for line in text.splitlines()), (name, text)
    assert "ModelPanel" in panels or size == (80, 24)


async def test_the_model_panel_at_120x30_takes_shorter_wordings():
    _screen, panels = await finished((120, 30))
    text = panels["ModelPanel"][0]
    assert text.splitlines()[0] == "SmolLM2-135M-Instruct"  # the parenthesis is in the weights and source rows
    assert re.search(r"^model runs +\d+ \(prefill \+ \d+( decodes)?\)$", text, re.M), text
    assert re.search(r"^weights +Q4_1 as stored · 4-bit( g32)?$", text, re.M), text
    entropy = [line for line in panels["CandidatesPanel"][0].splitlines() if line.startswith("entropy")]
    assert entropy and re.fullmatch(r"entropy [\d.]+ bits → [\d.]+( after sampler| sampled)?", entropy[0]), entropy


async def test_the_one_pass_panel_at_160x48_keeps_whole_clauses():
    _screen, panels = await finished((160, 48))
    text = panels["AnatomyPanel"][0]
    assert re.search(r"\d+ kept, [\d.]+% of the raw mass", text), text
    assert "a draw from the kept entries (seed 0)" in text, text


def test_a_shorter_form_is_whole_clauses():
    note = "5 kept, 68.8% of the raw mass; entropy 1.15 bits"
    assert shorter_form(note, 60) == note
    assert shorter_form(note, 40) == "5 kept, 68.8% of the raw mass"
    assert shorter_form(note, 10) == "5 kept"
    assert shorter_form(note, 4) == ""
    assert shorter_form("a draw (seed 1); id 2 <|im_end|>, p 74.7%", 20) == "a draw (seed 1)"
    assert shorter_form("scores [1, 49152] kept", 12) == ""  # never inside brackets
    assert shorter_form("180 bytes out: the id and the reported numbers", 30) == "180 bytes out"
