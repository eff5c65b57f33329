"""The model panel names the decode step the engine runs and why (ModelFacts.decode_plan, core/model/decode/plan.py):
a `decode` row with the step, then the why; a model whose facts do not say (a served model, an older record) gets
no such row."""

from __future__ import annotations

from dataclasses import replace

from test_model_panel_weights import panel_of

from fakes import FACTS

PLAN = "native step: Q4_1 weights as stored; lens via torch"


async def test_the_decode_row_names_the_step_and_why():
    text, _ = await panel_of(replace(FACTS, decode_plan=PLAN), (160, 48))
    assert "decode       native step Q4_1 weights as stored; lens via torch" in text


async def test_facts_without_a_plan_show_no_decode_row():
    text, _ = await panel_of(FACTS, (160, 48))
    assert "decode " not in text
