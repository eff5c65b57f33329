"""The embedded model on its default CPU path, 4-bit matrices as the GGUF stores them (issue 25), against its float32
de-quantized reference (the `embedded` fixture): the weights, the scores, the greedy ids, the facts and the load."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tokentui.core.model.decode.adapter import new_cache
from tokentui.core.model.engine import Engine
from tokentui.core.model.speed import SpeedOptions
from tokentui.core.model.observe.fidelity import agreement, first_divergence, teacher_forced_logits
from tokentui.core.model.load.gguf_plan import _skeleton, plan_gguf
from tokentui.core.model.quant.gguf_quant import GROUP, GroupedInt4
from tokentui.core.model.decode.lean_step import LeanDecoder
from tokentui.core.model.quant.qlinear import (
    FusedQLinear, QLinear, QLMHead, chosen_kernel, kernel_available, quantized_modules,
)
from tokentui.core.model.load.precheck import embedded_gguf
from tokentui.core.runs.events import StepEvent
from tokentui.core.runs.facts import ModelFacts
from tokentui.core.runs.record_reader import build
from tokentui.core.settings import RunOptions, SamplerSettings
from test_engine_figures import assert_stages_in_order
from test_qlinear import bound

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not kernel_available(), reason="no int4 CPU kernel"),
              pytest.mark.usefixtures("one_torch_thread")]
PROMPT = "Is OpenAI open?"  # tokentui's default prompt (benchmarks/server_vs_local.py's too)
STEPS = 128
# llama-server on the same file, teacher-forced against the same float32 reference (BENCHMARKS.md, issue 15):
# 119/128 top-1, max |dp| 0.066, mean 0.0038 over the shown candidates
LLAMA_SERVER = {"agree": 119, "dp_max": 0.066, "dp_mean": 0.0038}


def greedy_ids(loaded, steps=STEPS):
    engine = Engine(loaded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=steps, ignore_eos=True))
    events = list(engine.run(PROMPT))
    prompt = next(e for e in events if type(e).__name__ == "PromptEvent")
    return prompt.ids, [e for e in events if isinstance(e, StepEvent)]


@pytest.fixture(scope="module")
def reference_run(embedded):
    return greedy_ids(embedded)


@pytest.fixture(scope="module")
def plan(embedded_quantized):
    """The conversion's reading of the file (before packing): the 4-bit matrices with their float32 scales."""
    return plan_gguf(embedded_gguf(), _skeleton(embedded_quantized.model.config))


# ------------------------------------------------------------------------------------------ the weights
def test_the_four_bit_matrices_are_the_references_weights(plan, embedded):
    """Per block type: with float32 scales, exactly the weights transformers de-quantized (up to one float32 rounding
    of a zero's sum); with the kernel's bfloat16 scales, within the documented bound."""
    reference = {name: p.detach() for name, p in embedded.model.named_parameters()}
    kinds = {}
    for name, matrix in plan.matrices.items():
        weight = reference["model.embed_tokens.weight" if name == plan.head else f"{name}.weight"]
        exact, rounded = matrix.dequantize(), matrix.dequantize(torch.bfloat16)
        ulps = 2.0 ** -22 * (8 * matrix.scale.abs() + matrix.zero.abs()).repeat_interleave(GROUP, dim=1)
        if matrix.halves:
            ulps = torch.zeros_like(weight)
        assert ((exact - weight).abs() <= ulps).all(), name
        bound = matrix.scale_bound().repeat_interleave(GROUP, dim=1)
        if matrix.halves:
            bound = bound[:, :matrix.in_features] + bound[:, matrix.in_features:]
        error = (rounded - weight).abs()
        assert (error <= bound * (1 + 1e-6) + 1e-12).all(), name
        kinds.setdefault(matrix.source, []).append(float((error / bound.clamp_min(1e-30)).max()))
    assert sorted(kinds) == ["Q4_1", "Q8_0"] and len(kinds["Q4_1"]) == 210 and len(kinds["Q8_0"]) == 1
    assert all(max(ratios) > 0.2 for ratios in kinds.values())  # the bound is close to what rounding does


def test_each_packed_module_multiplies_like_the_reference_weights(embedded_quantized, embedded, plan):
    """Every 4-bit module of the cached model, on a random input, against F.linear by the float32 reference's
    weights: within bfloat16's rounding of the activations, the scales and the output (the bound of
    tests/unit/test_qlinear.py, from the file's own scales)."""
    model, reference = embedded_quantized.model, dict(embedded.model.named_parameters())
    names = {id(m): n for n, m in model.named_modules()}
    checked = 0
    torch.manual_seed(0)
    for module in quantized_modules(model):
        name = names[id(module)]
        if isinstance(module, FusedQLinear):
            parent, _, fused = name.rpartition(".")
            members = [f"{parent}.{p.removesuffix('_proj')}_proj"
                       for p in fused.removeprefix("fused_").split("_proj_")]
            matrices = [plan.matrices[m] for m in members]
            matrix = GroupedInt4(torch.cat([m.q for m in matrices]), torch.cat([m.scale for m in matrices]),
                                 torch.cat([m.zero for m in matrices]), "Q4_1")
            weight = torch.cat([reference[f"{m}.weight"] for m in members])
            run = module.product
        else:
            matrix = plan.matrices[name]
            weight = reference["model.embed_tokens.weight" if isinstance(module, QLMHead) else f"{name}.weight"]
            # the head: its kernel pass alone (QLinear's forward; QLMHead's own recomputes the top scores exactly)
            run = (lambda x, head=module: QLinear.forward(head, x)) if isinstance(module, QLMHead) else module
        x = torch.randn(2, module.in_features)
        exact = F.linear(x.double(), weight.double()).float()
        assert ((run(x) - exact).abs() <= bound(x, matrix, exact)).all(), name
        checked += 1
    assert checked == 30 * 4 + 1  # fused q/k/v, o, fused gate/up, down per layer; the head


# ------------------------------------------------------------------------------------------ the scores
def test_greedy_ids_equal_the_float32_references(embedded_quantized, reference_run):
    prompt_ids, reference = reference_run
    ours = greedy_ids(embedded_quantized)[1]
    at = first_divergence([s.id for s in ours], [s.id for s in reference])
    margin = None
    if at is not None:  # say whether it is a near-tie in the reference (its top-1 over its second)
        raw = sorted((c.raw_prob for c in reference[at].candidates), reverse=True)
        margin = raw[0] - raw[1]
    assert at is None, f"first divergence at step {at + 1}: reference top-1 margin {margin:.4f}"


def test_closer_to_the_reference_than_llama_server(embedded_quantized, embedded, reference_run):
    prompt_ids, steps = reference_run
    tokens = [s.id for s in steps]
    reference = teacher_forced_logits(embedded.model, prompt_ids, tokens)
    # the teacher-forced reference is the run's own scores (the oracle reads what the run computed)
    assert torch.equal(reference[5].softmax(-1).topk(10).indices,
                       torch.tensor([c.id for c in steps[5].candidates[:10]]))
    ours = agreement(reference, teacher_forced_logits(embedded_quantized.model, prompt_ids, tokens))
    assert ours.positions == STEPS
    assert ours.agree > LLAMA_SERVER["agree"], ours
    assert ours.dp_max < LLAMA_SERVER["dp_max"] and ours.dp_mean < LLAMA_SERVER["dp_mean"], ours
    assert all(margin < 0.05 for _, margin in ours.disagreements)  # any disagreement is a near-tie


def test_the_lean_step_gives_the_forwards_scores(embedded_quantized, embedded):
    from tokentui.core.model.native import native_step

    options = RunOptions(max_new_tokens=2)
    with native_step.disabled(embedded_quantized.model):  # the lean torch step where the native one does not serve
        assert Engine(embedded_quantized, SamplerSettings(temperature=0.0), options,
                      speed=SpeedOptions(kv_shapes="dynamic")).plan.step.name == "lean torch step"
        # a bucketed cache hands attention a padded view: the lean step, which attends over what it is given, is
        # not used
        assert Engine(embedded_quantized, SamplerSettings(temperature=0.0), options,
                      speed=SpeedOptions(kv_shapes="bucketed")).plan.step.name == "transformers' forward"
    # float32: through the forward
    assert Engine(embedded, SamplerSettings(temperature=0.0), options).plan.step.name == "transformers' forward"
    model = embedded_quantized.model
    lean = LeanDecoder(model)
    a, b = new_cache(model, 64), new_cache(model, 64)
    from tokentui.core.model.decode.adapter import forward_last_logits

    prompt = torch.tensor([[1, 504, 2113, 30]])
    forward_last_logits(model, prompt, a)
    forward_last_logits(model, prompt, b)
    for token in (28, 1562, 314, 253, 5549):
        assert torch.equal(lean.step(token, a), forward_last_logits(model, torch.tensor([[token]]), b))


def test_the_logit_lens_still_works_on_the_4bit_path(embedded_quantized):
    engine = Engine(embedded_quantized, SamplerSettings(temperature=0.0),
                    RunOptions(max_new_tokens=3, ignore_eos=True, logit_lens=True))
    steps = [e for e in engine.run(PROMPT) if isinstance(e, StepEvent)]
    assert len(steps) == 3 and all(s.lens for s in steps)


# ------------------------------------------------------------------------------------------ facts and load
def test_the_model_event_says_how_the_weights_run(embedded_quantized, embedded):
    facts = embedded_quantized.facts
    q = facts.quantization
    kernel = chosen_kernel()
    if kernel.exact_scores:  # tokentui's float32 kernel: float32 throughout, no score recomputed
        assert q.summary() == "Q4_1 weights as stored (4-bit, group 32, fp32 scales) · fp32 activations"
        assert q.head == "Q8_0 8-bit"  # its int8 values as stored, one product
    elif kernel.name == "avx2-int16":  # its int16 activations: the best scores recomputed from the float rows
        assert q.summary() == "Q4_1 weights as stored (4-bit, group 32, fp32 scales) · int16 activations"
        assert q.head == "Q8_0 8-bit; its 256 highest scores recomputed in float32"
    else:
        assert q.summary() == "Q4_1 weights as stored (4-bit, group 32, bf16 scales) · bf16 activations"
        assert q.head == "Q8_0 as two 4-bit halves; its 256 highest scores recomputed in float32"
    assert q.kernel == kernel.name
    exact = 0 if kernel.exact_scores else 256
    assert (q.matrices, q.dequantized, q.dequantized_blocks, q.exact_scores) == (211, 1, "Q8_0", exact)
    assert facts.dtype == "float32" and facts.tied_lm_head is True and embedded.facts.quantization is None
    for field in ("parameters", "layers", "hidden_size", "vocab_rows", "kv_bytes_per_token", "max_context"):
        assert getattr(facts, field) == getattr(embedded.facts, field), field
    held = sum(m.weight_nbytes for m in quantized_modules(embedded_quantized.model))
    assert held < q.weight_bytes < held + 2 * 2**20  # the 4-bit matrices, norms, a row in, 256 head rows
    data = json.loads(json.dumps(facts.to_dict()))
    assert data["quantization"]["blocks"] == "Q4_1" and "quantization" not in embedded.facts.to_dict()
    assert facts.dequantized_from is None and "dequantized_from" not in data  # the 4-bit values are not a copy
    assert build(ModelFacts, {k: v for k, v in data.items() if k != "event"}, "model") == facts


def test_first_start_converts_once_and_later_starts_read_the_cache(embedded_quantized_cold, embedded_quantized,
                                                                   isolated_dirs):
    cold_loaded, cold = embedded_quantized_cold
    assert_stages_in_order(cold)
    names = [s.stage for s in cold]
    assert all("(first start only)" in n for n in names[1:-1])
    reading = [s.fraction for s in cold if s.stage.startswith("reading the GGUF's 4-bit blocks")]
    assert reading[0] == 0.0 and reading[-1] == 1.0 and len(reading) > 10
    assert any(n.startswith("packing 211 4-bit matrices") for n in names)
    from conftest import quantized_cache
    from tokentui.core.model.load.loader import load_model

    warm = []
    with quantized_cache(isolated_dirs):  # the cache the cold start filled
        load_model(None, device="cpu", progress=warm.append)
    assert [s.stage for s in warm] == ["finding the model", "reading weights", "ready"]
    assert embedded_quantized.facts.load_seconds < cold_loaded.facts.load_seconds
    cached = list((isolated_dirs["TOKENTUI_CACHE_DIR"].with_name("cache-4bit") / "quantized").glob("*/.complete"))
    assert len(cached) == 1
    for a, b in zip(quantized_modules(cold_loaded.model), quantized_modules(embedded_quantized.model)):
        assert torch.equal(a.packed, b.packed) and torch.equal(a.scale_zeros, b.scale_zeros)
    x = torch.randn(1, 576)
    assert torch.equal(cold_loaded.model.lm_head(x), embedded_quantized.model.lm_head(x))


def test_float32_asks_for_the_de_quantized_reference(embedded):
    assert embedded.facts.quantization is None
    assert not [m for m in embedded.model.modules() if isinstance(m, QLinear)]
    assert np.isclose(embedded.facts.parameters, 134_515_008)


def test_the_reference_says_it_is_the_files_blocks_de_quantized(embedded_cold, embedded, isolated_dirs):
    from gguf import GGUFReader

    from tokentui.core.model.load.loader import BLOCKS_FILE, load_model

    stored = {t.tensor_type.name for t in GGUFReader(str(embedded_gguf())).tensors}  # the file's own tensor table
    expected = "+".join(sorted(stored - {"F32", "F16", "BF16"}))
    assert expected == "Q4_1+Q8_0"
    cold, _ = embedded_cold
    assert cold.facts.dequantized_from == embedded.facts.dequantized_from == expected  # first start and later ones
    assert cold.facts.dtype == "float32" and cold.facts.quantization is None
    data = json.loads(json.dumps(embedded.facts.to_dict()))
    assert data["dequantized_from"] == expected and build(ModelFacts, {k: v for k, v in data.items()
                                                                        if k != "event"}, "model") == embedded.facts
    # a folder converted before the block types were saved beside it: read from the file once, then saved
    saved = next((isolated_dirs["TOKENTUI_CACHE_DIR"] / "converted").glob(f"*/{BLOCKS_FILE}"))
    saved.unlink()
    assert load_model(None, device="cpu", dtype="float32").facts.dequantized_from == expected
    assert saved.is_file()
