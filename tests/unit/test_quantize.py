"""`--quantize int4` (core/model/quant/quantize.py): a float model's matrices quantized here into the 4-bit GGUF path's
layout. The 4-bit values are within the documented bound of the float weights; the kernel multiplies exactly the
de-quantized ones; every module multiplies like F.linear on them within bfloat16 rounding; the engine's greedy ids
are `generate`'s on the same model; the model event and the panel say "quantized here"; bad combinations are one
line."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from arch_matrix import SPECS, build
from cli_run import tokentui
from tiny_models import INIT, assert_varies, generate_ids, tiny_model
from tokentui.core.errors import ModelLoadError, SettingsError
from tokentui.core.model.engine import Engine
from tokentui.core.model.observe.fidelity import first_divergence
from tokentui.core.model.quant.gguf_quant import BF16_ROUNDOFF, GROUP
from tokentui.core.model.decode.lean_step import lean_decoder
from tokentui.core.model.load.loader import LoadedModel, load_model, model_facts
from tokentui.core.model.quant.qlinear import (
    FusedQLinear,
    QLinear,
    QLinearPart,
    QLMHead,
    chosen_kernel,
    kernel_available,
    quantized_modules,
    step_weight_bytes,
)
from tokentui.core.model.quant.quantize import (
    QUANTIZE, quantization_bound, quantize_matrix, quantize_model, quantized_facts,
)
from tokentui.core.runs.events import PromptEvent, StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings

pytestmark = [pytest.mark.skipif(not kernel_available(), reason="no int4 CPU kernel in this torch"),
              pytest.mark.usefixtures("one_torch_thread")]


def assert_engine_is_generate(model, tokenizer, prompt: str, n: int, vary: bool = False) -> None:
    """The engine's greedy ids for `prompt` on `model` are transformers' generate's (the engine's oracle). On a
    kernel that rounds the activations to int16, the engine's native step and generate's forward may part at a
    near-tie only (a sum one rounding away moves an activation by an int16 step): the engine's own top-1 margin
    there under 1 % of its top probability. vary=True: generate's ids must vary (`assert_varies`: a model whose
    output does not depend on its context makes this oracle vacuous); this file's callers all pass it."""
    engine = Engine(LoadedModel(model=model, tokenizer=tokenizer, facts=model_facts(model, tokenizer, name="t")),
                    SamplerSettings(temperature=0), RunOptions(max_new_tokens=n, ignore_eos=True))
    events = list(engine.run(prompt))
    shown = next(e for e in events if isinstance(e, PromptEvent))
    steps = [e for e in events if isinstance(e, StepEvent)]
    expected = generate_ids(model, shown.ids, n, stop_at_eos=False)
    if vary:
        assert_varies(expected, f"generate's {n} greedy ids")
    modules = quantized_modules(model)
    if not modules or modules[0].kernel.activations != "int16":
        assert [e.id for e in steps] == expected
        return
    at = first_divergence([e.id for e in steps], expected)
    if at is not None:
        raw = sorted((c.raw_prob for c in steps[at].candidates), reverse=True)
        assert raw[0] - raw[1] < 1e-2 * raw[0], f"step {at + 1}: the engine's top-1 margin {raw[0] - raw[1]:.2e}"


def test_each_weight_within_the_bound_and_the_kernel_constants_exact():
    torch.manual_seed(0)
    w = torch.randn(48, 256) * 0.05
    w[3, 32:64] = 0.125  # a constant group: every weight exactly its zero
    m = quantize_matrix(w)
    assert m.q.dtype == torch.uint8 and int(m.q.max()) <= 15 and m.source == "int4"
    # scale and zero are bfloat16 values already: what the kernel reads is the matrix itself
    assert torch.equal(m.dequantize(torch.bfloat16), m.dequantize())
    error = (w - m.dequantize()).abs().reshape(48, 256 // GROUP, GROUP).amax(dim=-1)  # [N, G]
    assert (error <= quantization_bound(m)).all()
    assert torch.equal(m.dequantize()[3, 32:64], w[3, 32:64])
    # the levels are used: the error is about half a level, not the bound's slack
    assert float((error / m.scale.clamp_min(1e-12)).median()) < 0.6
    # and the rounding is real (a quantizer that kept the floats would prove nothing)
    assert float(error.max()) > 1e-3


def test_a_tiny_llama_quantized_whole_with_the_lean_step_and_generate_greedy_ids(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer, tie_word_embeddings=False, initializer_range=INIT)
    stock = tiny_model("llama", smol_tokenizer, tie_word_embeddings=False,
                       initializer_range=INIT)  # same seed: the same float weights
    kept = quantize_model(model)
    assert kept == 0
    layers = model.config.num_hidden_layers
    fused = [m for m in quantized_modules(model) if isinstance(m, FusedQLinear)]
    assert len(fused) == 2 * layers and isinstance(model.lm_head, QLMHead) and not model.lm_head.tied
    facts = quantized_facts(model, kept)
    assert facts.quantized_here and facts.blocks == "int4" and facts.matrices == 7 * layers
    kernel = chosen_kernel()  # the scales are bf16 values whichever kernel runs them; the activations its own
    activations = {"avx2-fp32": "fp32", "avx2-int16": "int16", "torch-int4": "bf16"}[kernel.name]
    assert facts.kernel == kernel.name and model.lm_head.exact_scores == 256
    assert facts.summary() == f"int4 weights quantized here (4-bit, group 32, bf16 scales) · {activations} activations"
    assert facts.weight_bytes == step_weight_bytes(model)
    # each module multiplies like F.linear on the float weights it stands for, within the quantizer's bound
    # plus bf16 activations (one product checked against the stock float model)
    x = torch.randn(4, 64)
    q_stock = stock.model.layers[0].self_attn.q_proj
    with torch.inference_mode():
        got = model.model.layers[0].self_attn.q_proj(x)
        exact = q_stock(x)
    m = quantize_matrix(q_stock.weight)
    per_weight = quantization_bound(m).repeat_interleave(GROUP, dim=1)
    limit = x.abs() @ per_weight.t() + 2 * BF16_ROUNDOFF * (x.abs() @ q_stock.weight.abs().t()) + 1e-4
    assert ((got - exact).abs() <= limit).all()
    assert lean_decoder(model) is not None  # the 4-bit path's lean decode step takes it
    assert_engine_is_generate(model, smol_tokenizer, "Is OpenAI open?", 24, vary=True)


def test_the_model_event_round_trips_and_an_older_record_reads_as_a_files_blocks(smol_tokenizer):
    import json as _json
    from dataclasses import replace

    from tokentui.core.runs.facts import ModelFacts
    from tokentui.core.runs.record_reader import build

    model = tiny_model("llama", smol_tokenizer)
    kept = quantize_model(model)
    facts = model_facts(model, smol_tokenizer, name="t")
    facts = replace(facts, quantization=quantized_facts(model, kept))
    data = _json.loads(_json.dumps({k: v for k, v in facts.to_dict().items() if k != "event"}))
    assert build(ModelFacts, data, "model") == facts
    del data["quantization"]["quantized_here"]  # a record from before --quantize
    assert build(ModelFacts, data, "model").quantization.quantized_here is False


def test_the_head_scores_the_candidates_with_the_float_rows(smol_tokenizer):
    """Tied head: its 256 highest scores are the float32 product with the embedding table (the model stays tied)."""
    model = tiny_model("qwen2", smol_tokenizer)  # q/k/v with biases
    embed = model.get_input_embeddings().weight
    quantize_model(model)
    head = model.get_output_embeddings()
    assert isinstance(head, QLMHead) and head.weight is embed
    h = torch.randn(2, 64)
    with torch.inference_mode():
        scores = head(h)
    top = scores.topk(10, dim=-1).indices
    exact = (h @ embed.t()).detach()
    # float32 products (summed in another order: float32 rounding), not the 4-bit ones (off by ~1e-2 here)
    torch.testing.assert_close(scores.gather(1, top), exact.gather(1, top), rtol=1e-5, atol=1e-6)
    rest = scores.topk(2000, dim=-1).indices[:, -100:]
    assert float((scores.gather(1, rest) - exact.gather(1, rest)).abs().max()) > 1e-3


def test_matrices_the_kernel_cannot_take_stay_float(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer, intermediate_size=72)  # gate/up 72 rows, down 72 inputs: not 16/32
    kept = quantize_model(model)
    assert kept == 2 * 3  # gate, up and down of each of 2 layers
    assert type(model.model.layers[0].mlp.down_proj) is nn.Linear
    assert isinstance(model.model.layers[0].self_attn.q_proj, QLinearPart)
    assert quantized_facts(model, kept).dequantized == 6


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_architecture_quantizes_and_decodes_like_its_own_generate(name, smol_tokenizer):
    """tests/arch_matrix.py's 38 families: their linear layers go 4-bit (GPT-2's Conv1D and Falcon's FalconLinear
    included), whatever the kernel cannot take is counted as kept float, and the engine's greedy ids are generate's
    on the quantized model."""
    model = build(name, smol_tokenizer)
    kept = quantize_model(model)
    facts = quantized_facts(model, kept)
    assert facts.matrices > 0 and facts.dequantized == kept
    floats = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n and "wte" not in n
              and "wpe" not in n and "word_embeddings" not in n]
    assert kept <= len(floats)
    assert_engine_is_generate(model, smol_tokenizer, "Hi", 8, vary=True)


def test_a_model_none_of_whose_layers_fits_is_refused(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer, hidden_size=48, intermediate_size=72, head_dim=12)
    with pytest.raises(ModelLoadError, match="none of this model's layers"):
        quantize_model(model)


def test_quantizing_twice_or_on_a_gpu_is_one_line(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer)
    quantize_model(model)
    with pytest.raises(ModelLoadError, match="4-bit already"):
        quantize_model(model)
    with pytest.raises(SettingsError, match="CPU only"):
        load_model(None, device_map="auto", quantize="int4")
    with pytest.raises(SettingsError, match="float32"):
        load_model(None, dtype="bfloat16", quantize="int4")
    with pytest.raises(SettingsError, match="quantized already and run as stored"):
        load_model(None, quantize="int4")  # the embedded GGUF runs as stored
    with pytest.raises(SettingsError, match="--quantize must be"):
        load_model(None, quantize="int2")


def test_the_command_line_offers_exactly_what_the_engine_knows():
    from tokentui.cli import build_parser

    action = next(a for a in build_parser()._actions if "--quantize" in a.option_strings)
    assert tuple(action.choices) == QUANTIZE and action.default == "none"


@pytest.mark.slow
def test_headless_quantize_int4_on_the_float_reference(embedded, isolated_dirs):
    """The real command line: `--dtype float32 --quantize int4` re-quantizes the embedded model's de-quantized
    copy; the model event says so and counts what it quantized; greedy picks the top candidate at every step."""
    result = tokentui("--headless", "--json", "--dtype", "float32", "--quantize", "int4", "--temperature", "0",
                      "--max-new-tokens", "8", "--ignore-eos", "--no-record")
    assert result.returncode == 0, result.stderr[-2000:]
    events = [json.loads(line) for line in result.stdout.splitlines()]
    model = next(e for e in events if e["event"] == "model")
    quant = model["quantization"]
    assert quant["quantized_here"] is True and quant["blocks"] == "int4" and quant["bits"] == 4
    assert quant["matrices"] == 7 * model["layers"] and quant["dequantized"] == 0
    assert 0 < quant["weight_bytes"] < 0.25 * 4 * model["parameters"]  # well under float32's bytes
    steps = [e for e in events if e["event"] == "step"]
    assert len(steps) == 8 and all(s["chosen_rank"] == 0 and s["id"] == s["candidates"][0]["id"] for s in steps)


def test_quantize_with_a_server_is_refused_in_one_line():
    result = tokentui("--headless", "--server", "http://127.0.0.1:9", "--quantize", "int4")
    assert result.returncode != 0 and "--quantize is for a model tokentui loads itself" in result.stderr
    assert "Traceback" not in result.stderr
