"""A GGUF later start's KV cache of tokentui's own (core/model/decode/buffers.py's PlainCache) and its config without
transformers (core/model/load/stored_config.py's StoredConfig). Oracles: transformers' cache of the engine's
GrowableLayer filled with the same keys and values (the accounting, the crop, the scores of a forward after the plain
cache is taken over, bit for bit), fan-out's copy of such a cache, and the values a config was made from."""

from __future__ import annotations

import copy

import pytest
import torch

from tiny_models import INIT, cache_kwargs, tiny_model
from tokentui.core.model.decode.adapter import (cache_allocated_nbytes, cache_nbytes, cache_tokens, config_cache,
                                                forward_batch_logits, forward_last_logits, new_cache)
from tokentui.core.model.decode.buffers import PlainCache, growable_layers
from tokentui.core.model.decode.hf_layers import GrowableLayer, as_transformers
from tokentui.core.model.decode.run_cache import RunCache
from tokentui.core.model.fanout import expand_cache
from tokentui.core.model.load.stored_config import StoredConfig


@pytest.fixture(scope="module")
def tiny(smol_tokenizer):
    return tiny_model("llama", smol_tokenizer, initializer_range=INIT)


def filled(model, ids: torch.Tensor, capacity: int):
    """(transformers' growable cache after the model's forward over `ids`, a PlainCache given the same rows)."""
    theirs = new_cache(model, capacity)
    with torch.inference_mode():
        model(input_ids=ids, use_cache=True, **cache_kwargs(model, theirs))
    ours = PlainCache(len(theirs.layers), capacity)
    for mine, ref in zip(ours.layers, theirs.layers):
        mine.update(ref.keys.clone(), ref.values.clone())
    return theirs, ours


def test_a_plain_cache_counts_crops_and_reports_bytes_as_transformers_growable_one(tiny):
    theirs, ours = filled(tiny, torch.tensor([list(range(100, 112))]), 8)  # past the capacity: the buffer grew
    assert cache_tokens(ours) == cache_tokens(theirs) == 12 == ours.get_seq_length()
    assert cache_nbytes(ours) == cache_nbytes(theirs) > 0
    assert cache_allocated_nbytes(ours) == cache_allocated_nbytes(theirs)
    assert growable_layers(ours) == ours.layers and growable_layers(theirs) == theirs.layers
    ours.crop(-5)
    theirs.crop(-5)
    assert cache_tokens(ours) == cache_tokens(theirs) == 7
    for mine, ref in zip(ours.layers, theirs.layers):
        assert torch.equal(mine.keys, ref.keys) and torch.equal(mine.values, ref.values)
    with pytest.raises(ValueError, match="negative"):
        ours.crop(3)
    with pytest.raises(ValueError, match="1 or more layers"):
        PlainCache(0)


def test_the_bytes_counted_without_views_are_those_of_the_views_and_of_transformers_own_cache(tiny):
    """`used_nbytes` (what every step's KV size reads) against the views' own nbytes and transformers' DynamicCache
    of plain DynamicLayers holding the same rows, after a prefill, rows a native step writes and counts, and a crop."""
    from transformers import DynamicCache

    _, ours = filled(tiny, torch.tensor([list(range(100, 111))]), 4)  # grew past its capacity
    reference = DynamicCache()

    def same():
        for layer in ours.layers:
            assert layer.used_nbytes() == layer.keys.nbytes + layer.values.nbytes > 0
            assert layer.keys.shape[-2] == layer.get_seq_length() == cache_tokens(ours)
        assert cache_nbytes(ours) == cache_nbytes(reference) == sum(k.nbytes + v.nbytes for k, v in (
            (layer.keys, layer.values) for layer in reference.layers))

    for index, layer in enumerate(ours.layers):
        reference.update(layer.keys.clone(), layer.values.clone(), index)
    same()
    for _ in range(3):  # as a native step: write row `position` of each buffer, then count it
        for index, layer in enumerate(ours.layers):
            kbuf, vbuf = layer.room_for_one()
            row = layer.get_seq_length()
            kbuf[..., row, :] = float(row)
            vbuf[..., row, :] = -float(row)
            layer.count_one()
            reference.update(kbuf[..., row:row + 1, :].clone(), vbuf[..., row:row + 1, :].clone(), index)
        same()
    for layer in ours.layers:
        assert torch.equal(layer.keys[..., -1, :], torch.full_like(layer.keys[..., -1, :], 13.0))
    ours.crop(-6)
    reference.crop(-6)
    same()


def test_the_forward_takes_a_plain_cache_over_with_its_buffers_and_gives_the_same_scores(tiny):
    """`RunCache.for_forward`: transformers' cache holding the plain cache's own buffers (nothing copied), the plain
    one left empty; the forward's scores on it are those on transformers' cache of the same rows, bit for bit, and
    the cache then extends as that one does."""
    theirs, ours = filled(tiny, torch.tensor([list(range(200, 216))]), 32)
    buffers = [layer.room_for_one()[0].data_ptr() for layer in ours.layers]
    run = RunCache(ours, step=None)
    kv = run.for_forward(tiny)
    assert run.kv is kv and run.for_forward(tiny) is kv  # taken over once
    assert all(type(layer) is GrowableLayer for layer in kv.layers)
    assert [layer.room_for_one()[0].data_ptr() for layer in kv.layers] == buffers
    assert ours.get_seq_length() == 0 and not any(layer.has_buffers for layer in ours.layers)
    assert run.tokens() == 16
    for token in range(300, 306):
        x = torch.tensor([[token]])
        assert torch.equal(forward_last_logits(tiny, x, kv), forward_last_logits(tiny, x, theirs))
    assert cache_tokens(kv) == cache_tokens(theirs) == 22


def test_a_fan_out_copy_of_a_plain_cache_decodes_as_the_copy_of_transformers_cache(tiny):
    """expand_cache on a plain cache copies it as one (the source left as it was); taken over for the batch forward,
    its rows' scores are those of the copy made of transformers' cache with the same rows, bit for bit."""
    theirs, ours = filled(tiny, torch.tensor([list(range(50, 60))]), 16)
    source_theirs, source_ours = RunCache(theirs, step=None, fed=10), RunCache(ours, step=None, fed=10)
    batch_theirs = expand_cache(tiny.config, source_theirs, 3, 14)
    batch_ours = expand_cache(tiny.config, source_ours, 3, 14)
    assert isinstance(batch_ours.kv, PlainCache) and batch_ours.fed == 10
    assert source_ours.kv is ours and ours.get_seq_length() == 10
    fed = torch.tensor([[7], [8], [9]])
    for _ in range(3):
        a = forward_batch_logits(tiny, fed, batch_ours.for_forward(tiny))
        b = forward_batch_logits(tiny, fed, batch_theirs.kv)
        assert a.shape == (3, tiny.config.vocab_size) and torch.equal(a, b)
        fed = fed + 1


def test_a_plain_cache_is_not_taken_over_for_a_config_of_other_layers(tiny):
    """A config whose cache is not one full-attention layer per plain layer (another count, sliding windows): one line,
    nothing moved."""
    plain = PlainCache(tiny.config.num_hidden_layers + 1, 4)
    with pytest.raises(ValueError, match="full-attention layers") as err:
        as_transformers(plain, tiny.config)
    assert "\n" not in str(err.value)
    sliding = copy.deepcopy(tiny.config)
    sliding.layer_types = ["sliding_attention"] * sliding.num_hidden_layers
    sliding.sliding_window = 4
    with pytest.raises(ValueError, match="DynamicSlidingWindowLayer"):
        as_transformers(PlainCache(sliding.num_hidden_layers, 4), sliding)


def test_a_stored_config_reads_its_values_and_nothing_else(tiny):
    values = tiny.config.to_dict()
    config = StoredConfig(values)
    assert config.hidden_size == tiny.config.hidden_size and config.rope_parameters == tiny.config.rope_parameters
    assert getattr(config, "no_such_value", "absent") == "absent"
    with pytest.raises(AttributeError, match="no_such_value"):
        config.no_such_value
    with pytest.raises(AttributeError, match="read-only"):
        config.hidden_size = 1
    values["hidden_size"] = -1  # its own copy: what the caller does with the dict later does not reach it
    got = config.to_dict()
    got["hidden_size"] = -2
    assert config.hidden_size == tiny.config.hidden_size
    assert copy.deepcopy(config).to_dict() == config.to_dict()
    for bad in ([("hidden_size", 8)], {1: 2}):
        with pytest.raises(ValueError, match="dict of values by name"):
            StoredConfig(bad)
    # transformers' cache from it is the one from the config it was made from
    made, reference = config_cache(config, 8), config_cache(tiny.config, 8)
    assert [type(layer) for layer in made.layers] == [type(layer) for layer in reference.layers]
