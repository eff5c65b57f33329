"""The GGUF loaders' model skeleton (core/model/load/gguf_plan.py `_skeleton`): parameters on the meta device,
buffers real. transformers' weight initialization is skipped on the meta parameters only (`_no_init_on_meta`, to
spare a start its cost): the skeleton must be the one built without that, buffer for buffer, and transformers'
table of initializers must be as it was after."""

from __future__ import annotations

import contextlib

import pytest
import torch
import transformers
from transformers import initialization

from tokentui.core.model.load import gguf_plan

SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)
CONFIGS = {
    "llama": lambda tied: transformers.LlamaConfig(**SMALL, tie_word_embeddings=tied),
    "qwen2": lambda tied: transformers.Qwen2Config(**SMALL, tie_word_embeddings=tied),
    "qwen3": lambda tied: transformers.Qwen3Config(**SMALL, head_dim=32, tie_word_embeddings=tied),
    "mistral": lambda tied: transformers.MistralConfig(**SMALL, tie_word_embeddings=tied),
    "gemma2": lambda tied: transformers.Gemma2Config(**SMALL, head_dim=16, tie_word_embeddings=tied),
}


@pytest.mark.parametrize("family", sorted(CONFIGS))
@pytest.mark.parametrize("tied", [True, False])
def test_the_skeleton_is_the_one_built_with_every_initializer(family, tied, monkeypatch):
    config = CONFIGS[family](tied)
    before = dict(initialization.TORCH_INIT_FUNCTIONS)
    fast = gguf_plan._skeleton(config)
    assert initialization.TORCH_INIT_FUNCTIONS == before  # each entry put back, the same function
    monkeypatch.setattr(gguf_plan, "_no_init_on_meta", contextlib.nullcontext)
    slow = gguf_plan._skeleton(config)
    params = [(name, p.shape, p.dtype) for name, p in fast.named_parameters()]
    assert params and params == [(name, p.shape, p.dtype) for name, p in slow.named_parameters()]
    assert all(p.is_meta for p in fast.parameters())
    buffers, expected = dict(fast.named_buffers()), dict(slow.named_buffers())
    assert buffers and buffers.keys() == expected.keys()
    for name, buffer in buffers.items():
        assert not buffer.is_meta and torch.equal(buffer, expected[name]), name
    assert fast.all_tied_weights_keys == slow.all_tied_weights_keys
    assert (fast.get_output_embeddings().weight is fast.get_input_embeddings().weight) == \
        (slow.get_output_embeddings().weight is slow.get_input_embeddings().weight)


def test_only_meta_tensors_are_left_uninitialized():
    real, meta = torch.zeros(8, 8), torch.empty(8, 8, device="meta")
    with gguf_plan._no_init_on_meta():
        assert initialization.normal_(meta) is meta
        initialization.normal_(real, std=1.0)
        initialization.ones_(meta)
    assert float(real.abs().sum()) > 0  # drawn as before
    untouched = torch.zeros(4)
    initialization.ones_(untouched)  # after: the initializers are transformers' own again
    assert torch.equal(untouched, torch.ones(4))
