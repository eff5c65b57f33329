"""q/k/v and gate/up as one product each (core/model/quant/fused_linear.py), against the stock model it came from: the same
values, scores within float rounding, greedy ids equal to `generate` on a stock copy, fewer matrix products a step,
and left alone wherever fusing would change what a module means."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from tiny_models import generate_ids, tiny_model
from tokentui.core.model.engine import Engine
from tokentui.core.model.quant.fused_linear import FusedLinear, LinearPart, fuse_siblings, wanted
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.runs.events import PromptEvent, StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings

KINDS = ["llama", "qwen2", "qwen3"]  # qwen2: q/k/v with biases; qwen3: a per-head norm between q/k and the rotation


def stock_and_fused(kind, tokenizer, **overrides):
    stock = tiny_model(kind, tokenizer, **overrides)
    fused = tiny_model(kind, tokenizer, **overrides)  # same seed: the same weights
    return stock, fused, fuse_siblings(fused)


@pytest.mark.parametrize("kind", KINDS)
def test_every_layer_fused_with_the_same_values(kind, smol_tokenizer):
    stock, fused, report = stock_and_fused(kind, smol_tokenizer)
    layers = stock.config.num_hidden_layers
    assert (report.groups, report.projections) == (2 * layers, 5 * layers)
    for i in range(layers):
        for group, names in (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj"))):
            ours, theirs = fused.get_submodule(f"model.layers.{i}.{group}"), stock.get_submodule(f"model.layers.{i}.{group}")
            for name in names:
                part, linear = getattr(ours, name), getattr(theirs, name)
                assert isinstance(part, LinearPart) and isinstance(linear, nn.Linear)
                assert torch.equal(part.weight, linear.weight)
                assert (part.bias is None) == (linear.bias is None)
                if linear.bias is not None:
                    assert torch.equal(part.bias, linear.bias)
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in stock.parameters())
    assert fuse_siblings(fused).groups == 0  # idempotent


@pytest.mark.parametrize("kind", KINDS)
def test_scores_within_float_rounding_and_greedy_ids_equal_generate_on_the_stock_model(kind, smol_tokenizer):
    stock, fused, _ = stock_and_fused(kind, smol_tokenizer)
    ids = torch.tensor([list(range(300, 340))])
    with torch.inference_mode():
        assert torch.allclose(stock(ids).logits, fused(ids).logits, rtol=1e-5, atol=1e-5)
    # an engine on the fused model (what the engine does on CUDA) gives generate's greedy ids on the stock model
    engine = Engine(LoadedModel(model=fused, tokenizer=smol_tokenizer, facts=model_facts(fused, smol_tokenizer, name="t")),
                    SamplerSettings(temperature=0), RunOptions(max_new_tokens=48, ignore_eos=True))
    events = list(engine.run("Is OpenAI open?"))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert [s.id for s in steps] == generate_ids(stock, prompt.ids, 48, stop_at_eos=False)


def test_a_part_given_another_input_computes_its_own_product(smol_tokenizer):
    stock, fused, _ = stock_and_fused("qwen2", smol_tokenizer)
    a, b = stock.model.layers[0].self_attn, fused.model.layers[0].self_attn
    x, y = torch.randn(3, 64), torch.randn(3, 64)
    with torch.inference_mode():
        q, k, v = b.q_proj(x), b.k_proj(y), b.v_proj(x)  # k from another input in between
        k_again = b.k_proj(y)  # the same part twice with one input: computed again, the same product
    torch.testing.assert_close(q, a.q_proj(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(k, a.k_proj(y), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v, a.v_proj(x), rtol=1e-5, atol=1e-6)
    assert torch.equal(k, k_again)


def _matrix_products(model, ids) -> int:
    """Matrix-product kernels (leaf ATen ops) in one forward of `ids` through `model`."""
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(ids)
    names = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul"}
    return sum(1 for e in prof.events() if e.name in names
               and not any(c.name in names for c in e.cpu_children))


def test_three_fewer_matrix_products_per_layer(smol_tokenizer):
    stock, fused, _ = stock_and_fused("llama", smol_tokenizer)
    ids = torch.tensor([[300]])
    before, after = _matrix_products(stock, ids), _matrix_products(fused, ids)
    assert before - after == 3 * stock.config.num_hidden_layers


def test_shared_hooked_mismatched_and_subclassed_linears_are_left_alone(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer, num_hidden_layers=4)
    layers = model.model.layers
    layers[0].self_attn.k_proj.weight = layers[1].self_attn.k_proj.weight  # tied across layers: not fused (either)
    layers[2].mlp.up_proj.register_forward_hook(lambda *a: None)  # a hook wraps one module's call
    attn = layers[3].self_attn
    attn.v_proj = nn.Linear(attn.v_proj.in_features, attn.v_proj.out_features, bias=True)  # bias on one only

    class Adapter(nn.Linear):
        pass

    mlp = layers[3].mlp
    mlp.gate_proj = Adapter(mlp.gate_proj.in_features, mlp.gate_proj.out_features, bias=False)
    report = fuse_siblings(model)
    assert report.groups == 3  # layer 0's and 1's mlp and layer 2's attention; everything else as it was
    assert all(isinstance(m, LinearPart) for m in (layers[0].mlp.gate_proj, layers[1].mlp.up_proj,
                                                  layers[2].self_attn.q_proj))
    for module in (layers[0].self_attn.q_proj, layers[1].self_attn.q_proj, layers[2].mlp.gate_proj,
                   layers[3].self_attn.q_proj, layers[3].mlp.up_proj):
        assert type(module) is nn.Linear
    assert not any(isinstance(m, FusedLinear) for m in (layers[0].self_attn, layers[3].mlp))


def test_the_engine_fuses_eager_decode_on_a_gpu_only():
    assert wanted("cuda", "auto", compile=False)
    assert not wanted("cpu", "auto", compile=False)  # measured slower on CPU (BENCHMARKS.md)
    assert not wanted("cuda", "stock", compile=False) and not wanted("cuda", "auto", compile=True)


def test_an_engine_on_cpu_leaves_the_projections_as_loaded(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer)
    engine = Engine(LoadedModel(model=model, tokenizer=smol_tokenizer, facts=model_facts(model, smol_tokenizer, name="t")),
                    SamplerSettings(temperature=0), RunOptions(max_new_tokens=4))
    assert engine.fusion.groups == 0 and type(model.model.layers[0].self_attn.q_proj) is nn.Linear
