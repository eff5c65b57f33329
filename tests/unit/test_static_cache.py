"""Bucketed KV shapes for eager decode (`--kv-shapes bucketed`, core/model/decode/static_cache.py) against the oracles:
`generate`'s greedy ids (tiny Llama / Qwen2 / Qwen3, every architecture of the matrix, the embedded model), the
cache tensors' nbytes for the KV figures, and the attention shapes SDPA actually receives (one per bucket)."""

from __future__ import annotations

import pytest
import torch

from arch_matrix import SPECS, build
from tiny_models import INIT, assert_engine_is_the_oracle, cache_kwargs, generate_ids, tiny_model
from tokentui.core.errors import SettingsError
from tokentui.core.model.decode.adapter import cache_allocated_nbytes, cache_nbytes
from tokentui.core.model.decode.hf_layers import BUCKET, BucketedLayer, GrowableLayer
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.model.speed import SpeedOptions
from tokentui.core.model.decode.static_cache import bucketing_problem, new_eager_cache
from tokentui.core.runs.events import PromptEvent, StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings

BUCKETED = SpeedOptions(kv_shapes="bucketed")


def _loaded(model, tokenizer, name="tiny"):
    return LoadedModel(model=model, tokenizer=tokenizer, facts=model_facts(model, tokenizer, name=name))


def _run(engine, prompt="Is OpenAI open?"):
    events = list(engine.run(prompt))
    prompt_event = next(e for e in events if isinstance(e, PromptEvent))
    return prompt_event, [e for e in events if isinstance(e, StepEvent)]


def _key_lengths(monkeypatch, layer_class=BucketedLayer) -> list[tuple[int, int]]:
    """(new positions, key length handed to attention) of every cache update from now on."""
    seen: list[tuple[int, int]] = []
    real = layer_class.update

    def spy(self, key_states, value_states, *args, **kwargs):
        keys, values = real(self, key_states, value_states, *args, **kwargs)
        seen.append((key_states.shape[-2], keys.shape[-2]))
        return keys, values

    monkeypatch.setattr(layer_class, "update", spy)
    return seen


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_bucketed_decode_matches_generate_across_a_bucket_boundary(smol_tokenizer, kind, monkeypatch):
    """240 greedy tokens after a ~30-token prompt cross the 256-position bucket: the same ids as generate, the KV
    figures of every step the tensors' (used positions), the allocation apart, and attention sees two key
    lengths in all of decode (one per bucket), not one per step."""
    model = tiny_model(kind, smol_tokenizer, initializer_range=INIT)  # ids that vary: the oracle can fail
    loaded = _loaded(model, smol_tokenizer)
    engine = Engine(loaded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=240, ignore_eos=True),
                    speed=BUCKETED)
    assert engine.facts.kv_cache.startswith("bucketed")
    seen = _key_lengths(monkeypatch)
    prompt, steps = _run(engine)
    decode_keys = {k for q, k in seen if q == 1}
    assert decode_keys == {BUCKET, 2 * BUCKET}
    monkeypatch.undo()
    assert_engine_is_the_oracle(model, prompt.ids, steps)  # generate's ids, which vary; teacher-forced logits
    per_token = loaded.facts.kv_bytes_per_token
    assert all(s.kv_bytes == per_token * s.kv_tokens for s in steps)
    assert steps[-1].kv_tokens == len(prompt.ids) + 239
    cache = engine.take_held_cache().cache.kv  # transformers' cache object of the run
    assert all(isinstance(layer, BucketedLayer) for layer in cache.layers)
    assert cache_nbytes(cache) == steps[-1].kv_bytes
    allocated = cache_allocated_nbytes(cache)
    assert allocated > cache_nbytes(cache) and allocated % (per_token * BUCKET) == 0


def test_dynamic_shapes_change_every_step(smol_tokenizer, monkeypatch):
    """The contrast the bucket removes: with --kv-shapes dynamic each decode step is a new key length."""
    model = tiny_model("llama", smol_tokenizer)
    engine = Engine(_loaded(model, smol_tokenizer), SamplerSettings(temperature=0),
                    RunOptions(max_new_tokens=20, ignore_eos=True), speed=SpeedOptions(kv_shapes="dynamic"))
    assert engine.facts.kv_cache.startswith("dynamic")
    seen = _key_lengths(monkeypatch, GrowableLayer)
    _run(engine)
    per_layer = [k for q, k in seen if q == 1][:: model.config.num_hidden_layers]
    assert len(set(per_layer)) == 19


def test_bucketed_layer_scores_equal_the_dynamic_cache(smol_tokenizer):
    """Scores with the padded, masked keys equal the exact-length ones to float rounding, prefill exactly."""
    model = tiny_model("qwen3", smol_tokenizer)
    ours, theirs = new_eager_cache(model.config, 8, True), new_eager_cache(model.config, 8, False)
    with torch.inference_mode():
        ids = torch.tensor([list(range(200, 216))])
        a = model(input_ids=ids, use_cache=True, **cache_kwargs(model, ours)).logits
        b = model(input_ids=ids, use_cache=True, **cache_kwargs(model, theirs)).logits
        assert torch.equal(a, b)
        for token in range(300, 320):
            x = torch.tensor([[token]])
            a = model(input_ids=x, use_cache=True, **cache_kwargs(model, ours)).logits
            b = model(input_ids=x, use_cache=True, **cache_kwargs(model, theirs)).logits
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for mine, ref in zip(ours.layers, theirs.layers):
        assert mine.keys.shape == ref.keys.shape and mine.keys.shape[-2] == 36
        torch.testing.assert_close(mine.keys, ref.keys, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_architecture_buckets_or_says_why_and_matches_generate(smol_tokenizer, name):
    """Every cache kind the engine handles: full attention and MLA bucket; sliding, chunked and recurrent caches
    keep the dynamic one and the model facts say why. Either way: generate's greedy ids (which vary) and every
    step's logits one full forward's."""
    model = build(name, smol_tokenizer)
    engine = Engine(_loaded(model, smol_tokenizer, name), SamplerSettings(temperature=0),
                    RunOptions(max_new_tokens=24, ignore_eos=True), speed=BUCKETED)
    problem = bucketing_problem(model)
    kinds = SPECS[name].kinds
    assert (problem is None) == (kinds <= {"full", "latent"})
    if problem is None:
        assert engine.facts.kv_cache.startswith("bucketed")
    else:
        assert engine.facts.kv_cache.startswith("dynamic") and "not bucketed" in engine.facts.kv_cache
    prompt, steps = _run(engine, "Hi")
    assert_engine_is_the_oracle(model, prompt.ids, steps)


def test_embedded_bucketed_128_tokens_identical_to_generate(embedded, embedded_stock):
    engine = Engine(embedded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=128, ignore_eos=True),
                    speed=BUCKETED)
    prompt, steps = _run(engine)
    assert [s.id for s in steps] == generate_ids(embedded_stock.model, prompt.ids, 128, stop_at_eos=False)
    assert steps[-1].kv_bytes == embedded.facts.kv_bytes_per_token * steps[-1].kv_tokens


def test_auto_buckets_on_cuda_only_and_bad_values_are_refused(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer)
    engine = Engine(_loaded(model, smol_tokenizer), SamplerSettings(temperature=0), RunOptions(max_new_tokens=2))
    assert engine.speed.kv_shapes == "auto" and engine.facts.kv_cache.startswith("dynamic")
    assert "kv_cache" in engine.facts.to_dict()
    with pytest.raises(SettingsError):
        SpeedOptions(kv_shapes="static")


def test_the_flag_reaches_the_engine_spec():
    from tokentui.cli import build_parser
    from tokentui.commands.common import engine_spec

    args = build_parser().parse_args(["--kv-shapes", "bucketed"])
    assert engine_spec(args).kv_shapes == "bucketed"
