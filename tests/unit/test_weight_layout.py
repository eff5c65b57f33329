"""The transposed weight layout (core/model/quant/weight_layout.py) against the stock model it came from: same values, same tied
tensors, scores within float rounding, and greedy IDs identical to `generate` on a stock-layout copy (tiny models at
an init where the ids vary, and every step's logits one full forward's)."""

from __future__ import annotations

import pytest
import torch

from tiny_models import INIT, assert_engine_is_the_oracle, generate_ids, tiny_model
from tokentui.core.model.engine import Engine
from tokentui.core.errors import SettingsError
from tokentui.core.runs.events import LoadProgress, PromptEvent, StepEvent
from tokentui.core.model.quant.weight_layout import is_wide_cpu_linear, transpose_wide_weights
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.core.model.speed import SpeedOptions


def stock_and_relaid(kind, tokenizer, **overrides):
    overrides.setdefault("initializer_range", INIT)  # output that depends on the context: generate's ids vary
    stock = tiny_model(kind, tokenizer, **overrides)
    relaid = tiny_model(kind, tokenizer, **overrides)  # same seed: the same weights
    report = transpose_wide_weights(relaid)
    return stock, relaid, report


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_same_values_only_wide_matrices_moved_and_ties_kept(kind, smol_tokenizer):
    stock, relaid, report = stock_and_relaid(kind, smol_tokenizer)
    a, b = stock.state_dict(), relaid.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    moved = {name for name, m in relaid.named_modules() if isinstance(m, torch.nn.Linear)
             and not m.weight.is_contiguous()}
    wide = {name for name, m in stock.named_modules() if is_wide_cpu_linear(m)}
    assert moved == wide and len(wide) == report.matrices
    # gate and up (128 x 64) in each of 2 layers, and the vocabulary head (49,152 x 64); q in Qwen3 is 128 x 64
    expected = {f"model.layers.{i}.mlp.{p}_proj" for i in range(2) for p in ("gate", "up")} | {"lm_head"}
    if kind == "qwen3":
        expected |= {f"model.layers.{i}.self_attn.q_proj" for i in range(2)}
    assert wide == expected
    assert report.bytes == sum(dict(stock.named_modules())[n].weight.nbytes for n in wide)
    head, emb = relaid.get_output_embeddings().weight, relaid.get_input_embeddings().weight
    assert head is emb and head.stride() == (1, head.shape[0])  # still one tied tensor, stored [in, out]
    assert transpose_wide_weights(relaid).matrices == 0  # idempotent


def test_scores_within_float_rounding_and_generate_unchanged(smol_tokenizer):
    stock, relaid, _ = stock_and_relaid("llama", smol_tokenizer)
    ids = torch.tensor([list(range(300, 340))])
    with torch.inference_mode():
        a, b = stock(ids).logits, relaid(ids).logits
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    assert generate_ids(stock, ids[0].tolist(), 24, stop_at_eos=False, vary=True) == \
        generate_ids(relaid, ids[0].tolist(), 24, stop_at_eos=False)


def test_half_precision_and_narrow_models_are_left_alone(smol_tokenizer):
    bf16 = tiny_model("llama", smol_tokenizer).to(torch.bfloat16)
    assert transpose_wide_weights(bf16).matrices == 0
    narrow = tiny_model("llama", smol_tokenizer, intermediate_size=96, tie_word_embeddings=False)
    narrow.lm_head = torch.nn.Linear(64, 100, bias=False)  # 100 < 2 * 64: not wide
    report = transpose_wide_weights(narrow)
    assert report.matrices == 0 and report.describe() == "weights: stock layout"


def loaded(model, tokenizer):
    return LoadedModel(model=model, tokenizer=tokenizer, facts=model_facts(model, tokenizer, name="tiny"))


def test_engine_relays_on_cpu_by_default_and_stock_opts_out(smol_tokenizer):
    stages = []
    engine = Engine(loaded(tiny_model("llama", smol_tokenizer), smol_tokenizer), progress=stages.append)
    assert engine.layout.matrices == 5 and not engine.model.lm_head.weight.is_contiguous()
    assert any(isinstance(s, LoadProgress) and "5 wide matrices" in s.stage for s in stages)
    kept = Engine(loaded(tiny_model("llama", smol_tokenizer), smol_tokenizer),
                  speed=SpeedOptions(weight_layout="stock"))
    assert kept.layout.matrices == 0
    assert all(p.is_contiguous() for p in kept.model.parameters())
    before = torch.get_num_threads()
    try:
        limited = Engine(loaded(tiny_model("llama", smol_tokenizer), smol_tokenizer), speed=SpeedOptions(threads=1))
        assert limited.layout.matrices == 5 and torch.get_num_threads() == 1  # --threads also bounds the copy
    finally:
        torch.set_num_threads(before)
    with pytest.raises(SettingsError, match="weight-layout must be auto or stock"):
        SpeedOptions(weight_layout="sideways")


def test_engine_greedy_on_relaid_weights_equals_generate_on_stock(smol_tokenizer):
    stock = tiny_model("qwen3", smol_tokenizer, initializer_range=INIT)
    engine = Engine(loaded(tiny_model("qwen3", smol_tokenizer, initializer_range=INIT), smol_tokenizer),
                    SamplerSettings(temperature=0),
                    RunOptions(max_new_tokens=32, ignore_eos=True))
    assert engine.layout.matrices > 0
    events = list(engine.run("Is OpenAI open?"))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    assert_engine_is_the_oracle(stock, prompt.ids, [e for e in events if isinstance(e, StepEvent)])


def test_embedded_model_engine_equals_stock_generate_128_tokens(embedded, embedded_stock):
    """The real model: the engine (re-laid weights) against generate on a copy that no engine ever touched."""
    engine = Engine(embedded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=128, ignore_eos=True))
    relaid = [m for m in embedded.model.modules() if isinstance(m, torch.nn.Linear) and not m.weight.is_contiguous()]
    assert len(relaid) == 61  # 30 x (gate, up) + the tied head (an earlier engine may have done it already)
    assert all(p.is_contiguous() for p in embedded_stock.model.parameters())
    events = list(engine.run("Is OpenAI open?"))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    assert [e.id for e in events if isinstance(e, StepEvent)] == generate_ids(embedded_stock.model, prompt.ids, 128, stop_at_eos=False)


def test_the_command_line_offers_exactly_the_layouts_the_engine_knows():
    from tokentui.cli import build_parser
    from tokentui.core.model.quant.weight_layout import LAYOUTS

    action = next(a for a in build_parser()._actions if a.dest == "weight_layout")
    assert tuple(action.choices) == LAYOUTS and action.default == "auto"
