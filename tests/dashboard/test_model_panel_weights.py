"""The model panel says how a GGUF's weights run (issue 25): the 4-bit blocks as stored, with what is rounded, or
the file's blocks de-quantized (the float32 reference); float weights get no weights row."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fakes import FACTS, ScriptedEngine, make_loader, wait_for
from tokentui.core.runs.facts import QuantFacts
from tokentui.tui import DashboardConfig, TokentuiApp
from tokentui.tui.panels import ModelPanel

QUANT = QuantFacts(blocks="Q4_1", bits=4, group=32, scale_dtype="bfloat16", activation_dtype="bfloat16",
                   head="Q8_0 as two 4-bit halves; its 256 highest scores recomputed in float32", exact_scores=256,
                   matrices=211, dequantized=1, dequantized_blocks="Q8_0", weight_bytes=102_477_312)


async def panel_of(facts, size):
    app = TokentuiApp(DashboardConfig(load=make_loader(ScriptedEngine(facts=facts)), user_theme_dir=None))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.done is not None, what="the run's end")
        await pilot.pause()
        panel = app.query_one(ModelPanel)
        text, subtitle = panel.last_text.plain, str(panel.border_subtitle)
        await pilot.press("q")
    return text, subtitle


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_four_bit_weights_say_they_are_the_files_and_what_is_rounded(size):
    text, subtitle = await panel_of(replace(FACTS, quantization=QUANT), size)
    assert "weights      Q4_1 as stored · 4-bit g32" in text
    assert subtitle == "bf16 scales · bf16 activations"


async def test_a_de_quantized_gguf_says_so_and_float_weights_say_nothing():
    text, subtitle = await panel_of(replace(FACTS, dequantized_from="Q4_1+Q8_0", dtype="float32"), (160, 48))
    assert "device       cpu · float32\nweights      Q4_1+Q8_0 de-quantized\n" in text and "as stored" not in text
    assert subtitle == ""
    text, subtitle = await panel_of(FACTS, (160, 48))
    assert "weights" not in text and subtitle == ""


async def test_weights_quantized_here_say_so():
    here = replace(QUANT, blocks="int4", head="int4, its 256 highest scores recomputed in float32", dequantized=0,
                   dequantized_blocks="", quantized_here=True)
    text, subtitle = await panel_of(replace(FACTS, quantization=here), (160, 48))
    assert "weights      int4 quantized here · 4-bit g32" in text and "as stored" not in text
    assert subtitle == "bf16 scales · bf16 activations"


MIXED = QuantFacts(blocks="Q4_K+Q6_K", bits=4, group=32, scale_dtype="float16", activation_dtype="int8",
                   head="tied: token_embd Q6_K", exact_scores=0, matrices=196, weight_bytes=390_500_000,
                   kernel="ggml's vec_dot, llama.cpp 11434.0.0",
                   formats="Q4_K ×168 214.7 MB, Q6_K ×29 175.8 MB; float32: 113 norms")


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_a_file_of_several_formats_lists_each_not_one_shape(size):
    """Issue 37: a Q4_K_M file mixes Q4_K and Q6_K; the panel named the largest format's shape as if it were the
    file's ("· 4-bit g32"). It now lists each format's matrices and bytes, whole, and the activations' rounding."""
    text, subtitle = await panel_of(replace(FACTS, quantization=MIXED), size)
    assert "Q4_K+Q6_K as stored" in text and "4-bit" not in text and "+ quantized" in text
    assert "Q4_K ×168 214.7 MB, Q6_K ×29 175.8 MB" in " ".join(text.split())
    assert subtitle == "fp16 scales · int8 activations"


async def test_float_rows_have_no_group_or_scales():
    """A bf16 folder (or an F16 GGUF) run as stored: its rows have no group and no scale to name."""
    rows = QuantFacts(blocks="BF16", bits=16, group=1, scale_dtype="none", activation_dtype="bfloat16",
                      head="tied: the embedding's BF16 rows", exact_scores=0, matrices=196)
    text, subtitle = await panel_of(replace(FACTS, quantization=rows), (160, 48))
    assert "BF16 as stored · 16-bit" in text and "g1" not in text and "none" not in text + subtitle
    assert subtitle == "bf16 activations"
