"""core/model/native/ggml_prefill.py: a prompt through a ggml-step model without transformers' forward, held to that
forward (the oracle) on tiny Llama / Mistral / Qwen2 / Qwen3 models with ggml-quantized matrices: the last position's
scores, every cache row, a prompt in chunks and one continued on a cache, and greedy ids after it through the
engine's decode step."""

from __future__ import annotations

import pytest
import torch

from test_ggml_step import K_SHAPED, MIXED, PROMPT, float_model, ggml, rows_close, stored  # noqa: F401 (fixture)
from tiny_models import assert_varies
from tokentui.core.model.decode.adapter import forward_last_logits, new_cache
from tokentui.core.model.native.ggml_native import ggml_step
from tokentui.core.model.native.ggml_prefill import prefill_hidden

LONG = (PROMPT * 8)[:45]  # a prompt long enough for the repacked matrices' gemm (4 rows at a time) and its rest

CASES = [("llama", "Q8_0", True), ("mistral", "Q8_0", True), ("qwen2", "Q8_0", False), ("qwen3", "Q4_0", True),
         ("qwen3", "mixed", False), ("llama", "mixed", True)]


def model_for(kind: str, fmt: str, tied: bool):
    shape = K_SHAPED if fmt in ("mixed", "Q4_0") else {}
    return stored(float_model(kind, tie_word_embeddings=tied, **shape), MIXED if fmt == "mixed" else fmt)


@pytest.mark.parametrize("kind, fmt, tied", CASES)
def test_a_prompt_gives_the_forwards_scores_and_cache_rows(kind, fmt, tied):
    model = model_for(kind, fmt, tied)
    step = ggml_step(model)
    assert step is not None
    ours, theirs = new_cache(model, 8), new_cache(model, 8)  # 8 rows: the buffers grow under the prefill
    with torch.inference_mode():
        ids = torch.tensor([LONG])
        logits = step.head(prefill_hidden(step, ids, ours))[0]
        expected = forward_last_logits(model, ids, theirs)
    assert rows_close(logits, expected)
    assert ours.get_seq_length() == theirs.get_seq_length() == len(LONG)
    for a, b in zip(ours.layers, theirs.layers):
        assert a.keys.shape == b.keys.shape
        assert rows_close(a.keys, b.keys) and rows_close(a.values, b.values)


@pytest.mark.parametrize("kind, fmt, tied", [("qwen3", "mixed", True), ("qwen2", "Q8_0", True)])
def test_chunks_and_a_continued_cache_see_the_earlier_positions(kind, fmt, tied):
    """Three chunks (7, 1, then 20 ids) on one cache, against the forward fed the same chunks (so each product runs the
    same kernel on the same rows: a repacked matrix's gemm and gemv may sum in another order): each chunk's
    queries see every earlier position (the causal mask offset by the cache's length)."""
    model = model_for(kind, fmt, tied)
    step = ggml_step(model)
    ours, theirs = new_cache(model, 64), new_cache(model, 64)
    prompt = LONG[:28]
    with torch.inference_mode():
        for a, b in ((0, 7), (7, 8), (8, 28)):
            hidden = prefill_hidden(step, torch.tensor([prompt[a:b]]), ours)
            expected = forward_last_logits(model, torch.tensor([prompt[a:b]]), theirs)
        logits = step.head(hidden)[0]
    assert rows_close(logits, expected)
    for a, b in zip(ours.layers, theirs.layers):
        assert rows_close(a.keys, b.keys) and rows_close(a.values, b.values)


@pytest.mark.parametrize("kind, fmt, tied", [("llama", "Q8_0", True), ("qwen3", "mixed", False)])
def test_greedy_ids_after_it_are_the_forwards(kind, fmt, tied):
    model = model_for(kind, fmt, tied)
    step = ggml_step(model)
    ours, theirs = new_cache(model, 8), new_cache(model, 8)
    with torch.inference_mode():
        mine = [int(step.head(prefill_hidden(step, torch.tensor([LONG]), ours))[0].argmax())]
        expected = [int(forward_last_logits(model, torch.tensor([LONG]), theirs).argmax())]
        for _ in range(15):
            mine.append(int(step.step(mine[-1], ours).argmax()))
            expected.append(int(forward_last_logits(model, torch.tensor([[expected[-1]]]), theirs).argmax()))
    assert mine == expected
    assert_varies(expected, "the forward's 16 greedy ids")
