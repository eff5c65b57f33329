"""The native decode step (core/model/native/native_step.py, core/model/native/decode_step.cpp): a 4-bit Llama-family model's
whole decode step as one C++ call. Held to the eager lean step (the model's forward bit for bit) within float32
rounding, scores and cache rows; to `generate`'s greedy ids on tiny Llama / Qwen2 / Qwen3 models on either 4-bit
kernel; to the float32 reference on the embedded model (teacher-forced, closer than llama-server); the same bits at
any thread count; and refused, for the eager lean step, where it does not serve a model."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DynamicCache

from test_quantize import assert_engine_is_generate
from test_quantized_embedded import LLAMA_SERVER, greedy_ids
from tiny_models import INIT, tiny_model
from tokentui.core.model.native import native_step as native
from tokentui.core.model.decode.adapter import forward_last_logits, new_cache
from tokentui.core.model.branch import crop_cache
from tokentui.core.model.decode.run_cache import RunCache
from tokentui.core.model.decode.steps import TorchForward
from tokentui.core.model.engine import Engine
from tokentui.core.model.observe.fidelity import agreement, teacher_forced_logits
from tokentui.core.model.quant.int4_kernel import TorchInt4
from tokentui.core.model.decode.lean_step import LeanDecoder, lean_decoder
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.model.native.native_step import NativeStep, decode_step_for, native_step
from tokentui.core.model.native.q4_native import NativeQ4, NativeQ4I16
from tokentui.core.model.quant.qlinear import KERNEL_ENV, chosen_kernel
from tokentui.core.model.quant.quantize import quantize_model
from tokentui.core.settings import RunOptions, SamplerSettings

pytestmark = [pytest.mark.skipif(NativeQ4.unavailable() is not None,
                                 reason=f"tokentui's native library: {NativeQ4.unavailable()}"),
              pytest.mark.usefixtures("one_torch_thread")]
PROMPT = [1, 504, 2113, 30, 28, 1562]
NATIVE_KERNELS = [NativeQ4.name, NativeQ4I16.name]  # float32 activations, int16 ones


def quantized_tiny(kind: str, tokenizer, kernel: str, monkeypatch, **overrides):
    monkeypatch.setenv(KERNEL_ENV, kernel)
    model = tiny_model(kind, tokenizer, **overrides)
    quantize_model(model)
    assert chosen_kernel().name == kernel
    return model


def prefilled(model, prompt=PROMPT, capacity: int = 64):
    cache = new_cache(model, capacity)
    forward_last_logits(model, torch.tensor([prompt]), cache)
    return cache


# The test's own bound, not the runtime's acceptance tolerance (native_step.TOLERANCES): loosening that must not
# loosen this. Each activation a kernel reads is rounded once: float32 sums in another order move a sum by about a
# unit roundoff (2^-24) of its terms; the int16 kernel rounds every activation to a step of its group's largest
# / 32767, at most half a step: 2^-16 of that largest. Independent roundings over a sum of K terms add like a random
# walk, sqrt(K) of them, and a decode step chains 5 products a layer (qkv, attention, o, gate/up, down). So a value
# may differ by 5 * layers * sqrt(K) * unit of the largest |value| (or of 1, below it), with K the longest sum: the
# hidden size, the MLP's width or the cache's rows. On the tiny models that is ~10x (float32) and ~25x (int16) what
# the two steps measurably differ by; a wrong weight, rotation or cache row differs by orders of magnitude more.
UNIT_ROUNDING = {NativeQ4.name: 2.0 ** -24, NativeQ4I16.name: 2.0 ** -16}


def rounding_bound(model, kernel: str, rows: int) -> float:
    config = model.config
    longest = max(config.hidden_size, config.intermediate_size, rows)
    return 5 * config.num_hidden_layers * math.sqrt(longest) * UNIT_ROUNDING[kernel]


def within_rounding(ours: torch.Tensor, lean: torch.Tensor, bound: float) -> bool:
    """Final hidden states [1, H] or cache rows, all finite, within `bound` (rounding_bound) of the lean step's,
    relative to its largest |value| (or 1, below it)."""
    scale = max(1.0, float(lean.abs().max()))
    return bool(torch.isfinite(ours).all()) and float((ours - lean).abs().max()) <= bound * scale


@pytest.mark.parametrize("kernel", NATIVE_KERNELS)
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_tiny_models_decode_natively_with_generates_greedy_ids(kind, kernel, smol_tokenizer, monkeypatch):
    # at INIT: a model whose greedy ids depend on the context (the guard, vary=True, fails the test otherwise)
    model = quantized_tiny(kind, smol_tokenizer, kernel, monkeypatch, initializer_range=INIT)
    step = native_step(model)
    assert isinstance(step, NativeStep) and decode_step_for(model) is step
    loaded = LoadedModel(model=model, tokenizer=smol_tokenizer, facts=model_facts(model, smol_tokenizer, name="t"))
    engine = Engine(loaded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=4))
    assert engine.plan.step.name == "native step"  # what every run decodes with
    # float32 activations: the same ids; int16: the same but at a near-tie (the helper says why)
    assert_engine_is_generate(model, smol_tokenizer, "Is OpenAI open?", 40, vary=True)


@pytest.mark.parametrize("kernel", NATIVE_KERNELS)
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_states_and_cache_rows_are_the_lean_steps_up_to_float32_rounding(kind, kernel, smol_tokenizer, monkeypatch):
    model = quantized_tiny(kind, smol_tokenizer, kernel, monkeypatch, num_attention_heads=4, num_key_value_heads=1)
    step, lean = native_step(model), lean_decoder(model)
    ours, theirs = prefilled(model), prefilled(model)
    bound = rounding_bound(model, kernel, len(PROMPT) + 60)
    token = 42
    for _ in range(60):  # past the first buffer's 64 rows: the buffers grow under the step
        got, expected = step.hidden(token, ours), lean.hidden(token, theirs)
        assert within_rounding(got, expected, bound)
        with torch.inference_mode():
            token = int(model.lm_head(expected)[0].argmax())
    assert ours.get_seq_length() == theirs.get_seq_length() == len(PROMPT) + 60
    for a, b in zip(ours.layers, theirs.layers):
        assert a.keys.shape == b.keys.shape
        assert within_rounding(a.keys, b.keys, bound) and within_rounding(a.values, b.values, bound)
    # a cropped cache (a branch's) goes on from the shorter prefix, as the lean step's does
    for cache in (ours, theirs):
        crop_cache(RunCache(cache, TorchForward(model)), len(PROMPT) + 10)
    assert within_rounding(step.hidden(7, ours), lean.hidden(7, theirs), bound)


@pytest.mark.parametrize("kernel", NATIVE_KERNELS)
def test_the_same_bits_at_one_and_two_threads_over_a_long_cache(kernel, smol_tokenizer, monkeypatch):
    model = quantized_tiny("llama", smol_tokenizer, kernel, monkeypatch, num_attention_heads=8,
                           num_key_value_heads=2, intermediate_size=256, hidden_size=256)
    step, lean = native_step(model), lean_decoder(model)
    # 8 heads, each 300 rows x head_dim 32: more heads than fork_rule.h's grain, so attention splits them over threads
    prompt = [(7 * i) % 4000 + 5 for i in range(300)]
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        cache = prefilled(model, prompt, 320)
        results.append([step.hidden(token, cache) for token in (3, 99, 1234)])
    torch.set_num_threads(1)
    assert all(torch.equal(a, b) for a, b in zip(*results))
    cache = prefilled(model, prompt, 320)
    bound = rounding_bound(model, kernel, len(prompt) + 3)
    assert all(within_rounding(ours, lean.hidden(token, cache), bound)
               for ours, token in zip(results[0], (3, 99, 1234)))


def test_a_cache_it_cannot_write_decodes_through_the_lean_step(smol_tokenizer, monkeypatch):
    model = quantized_tiny("llama", smol_tokenizer, NativeQ4.name, monkeypatch)
    a, b = DynamicCache(config=model.config), DynamicCache(config=model.config)  # transformers' own layers
    forward_last_logits(model, torch.tensor([PROMPT]), a)
    forward_last_logits(model, torch.tensor([PROMPT]), b)
    assert torch.equal(native_step(model).step(5, a), lean_decoder(model).step(5, b))
    assert a.get_seq_length() == b.get_seq_length() == len(PROMPT) + 1


def test_refused_where_it_would_not_give_the_lean_steps_scores(smol_tokenizer, monkeypatch):
    # another activation: the lean step serves it (the model's own module), the C++ step computes SiLU only
    gelu = quantized_tiny("llama", smol_tokenizer, NativeQ4.name, monkeypatch, hidden_act="gelu")
    assert native_step(gelu) is None and isinstance(decode_step_for(gelu), LeanDecoder)
    # matrices packed for torch's int4 kernel (bfloat16 activations): the eager lean step, which calls that kernel
    if TorchInt4.available():
        on_torch = quantized_tiny("llama", smol_tokenizer, TorchInt4.name, monkeypatch)
        assert native_step(on_torch) is None and isinstance(decode_step_for(on_torch), LeanDecoder)
    # the acceptance check itself: with no tolerance at all, float32 sums in another order are refused
    monkeypatch.setattr(native, "TOLERANCES", dict.fromkeys(native.TOLERANCES, 0.0))
    strict = quantized_tiny("llama", smol_tokenizer, NativeQ4.name, monkeypatch)
    assert native_step(strict) is None and decode_step_for(strict) is lean_decoder(strict)
    loaded = LoadedModel(model=strict, tokenizer=smol_tokenizer, facts=model_facts(strict, smol_tokenizer, name="t"))
    engine = Engine(loaded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=4))
    assert engine.plan.step.name == "lean torch step"


@pytest.mark.slow
def test_the_embedded_model_decodes_natively_closer_to_the_reference_than_llama_server(embedded_quantized, embedded):
    model = embedded_quantized.model
    step = native_step(model)
    assert isinstance(step, NativeStep)
    prompt_ids, steps = greedy_ids(embedded)  # the float32 reference's own greedy answer
    tokens = [s.id for s in steps]
    reference = teacher_forced_logits(embedded.model, prompt_ids, tokens)
    ours_scores = teacher_forced_logits(model, prompt_ids, tokens, lean_step=step)
    eager_scores = teacher_forced_logits(model, prompt_ids, tokens)  # the model's forward
    ours = agreement(reference, ours_scores)
    assert ours.positions == len(tokens) == 128
    assert ours.agree > LLAMA_SERVER["agree"], ours
    assert ours.dp_max < LLAMA_SERVER["dp_max"] and ours.dp_mean < LLAMA_SERVER["dp_mean"], ours
    assert all(margin < 0.05 for _, margin in ours.disagreements)  # any disagreement is a near-tie
    # and close to the model's own forward (the eager lean step, on the same kernel) at every position
    versus_forward = agreement(eager_scores, ours_scores)
    assert versus_forward.dp_max < 0.005, versus_forward
