"""The model panel names the decode step the engine runs and why (ModelFacts.decode_plan, core/model/decode/plan.py):
a `decode` row with the step, then the why; a model whose facts do not say (a served model, an older record) gets
no such row."""

from __future__ import annotations

from dataclasses import replace

from test_model_panel_weights import panel_of

from fakes import FACTS

PLAN = "native step: Q4_1 weights as stored; lens via torch"


def _decode_lines(text: str) -> str:
    """The decode row and the lines under it that continue it (indented past the labels), joined."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("decode "))
    end = start + 1
    while end < len(lines) and lines[end].startswith(" " * 13):
        end += 1
    return " ".join(" ".join(line.split()) for line in lines[start:end])


async def test_the_decode_row_names_the_step_and_why():
    text, _ = await panel_of(replace(FACTS, decode_plan=PLAN), (160, 48))
    assert _decode_lines(text) == "decode native step Q4_1 weights as stored; lens via torch"
    assert all(len(line) <= 46 for line in text.splitlines() if line.startswith(("decode ", " " * 13)))


async def test_facts_without_a_plan_show_no_decode_row():
    text, _ = await panel_of(FACTS, (160, 48))
    assert "decode " not in text


LONG = ("transformers' forward: float weights; dynamic cache (not bucketed: this model keeps only a recurrent state "
        "(the Mamba family), which has one shape already); lens via torch")


async def test_a_why_wider_than_the_panel_is_shown_whole_on_lines_under_the_step():
    step, _, why = LONG.partition(": ")
    text, _ = await panel_of(replace(FACTS, decode_plan=LONG), (160, 64))
    assert _decode_lines(text) == f"decode {step} {why}"
    # where the panel is short, the why gives way whole (never cut), and the step's name stays
    text, _ = await panel_of(replace(FACTS, decode_plan=LONG), (160, 48))
    assert _decode_lines(text) in (f"decode {step} {why}", f"decode {step}")
