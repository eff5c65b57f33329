"""HF folders on CPU in their stored dtype (core/model/quant/hf_stored.py, core/model/load/loader.py): a bf16 / fp16
folder loads with no float32 copy of its matrices, each linear layer a view of the loaded tensor as ggml's rows, the
native ggml step decoding it with transformers' greedy ids; `--quantize int8`'s Q8_0 rows within Q8_0's rounding of
the weights; and without ggml's library the folder still runs, in torch, saying why."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tiny_models import INIT, assert_varies, generate_ids, tiny_model
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import load_model
from tokentui.core.model.observe.fidelity import first_divergence
from tokentui.core.model.quant import ggml_linear, hf_stored
from tokentui.core.model.quant.ggml_linear import GGMLLinear
from tokentui.core.runs.events import PromptEvent, StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")
STEPS = 16
PROMPT = "Is OpenAI open?"


def _ggml_or_skip():
    why = ggml_linear.available()
    if why is None:
        try:
            ggml_linear.load(lambda _: None)
        except Exception as err:  # noqa: BLE001 - the reason is the skip's line
            why = str(err)
    if why is not None:
        pytest.skip(f"ggml's library is not available: {why}")


def save_folder(tmp_path, tokenizer, kind: str, dtype: torch.dtype, **overrides):
    """A tiny random-weight model saved as `dtype` safetensors with the embedded model's tokenizer."""
    model = tiny_model(kind, tokenizer, initializer_range=INIT, **overrides).to(dtype)
    model.config.dtype = dtype
    folder = tmp_path / f"{kind}-{str(dtype).removeprefix('torch.')}"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_ids(loaded, steps=STEPS):
    engine = Engine(loaded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=steps, ignore_eos=True))
    events = list(engine.run(PROMPT))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    engine.last_steps = [e for e in events if isinstance(e, StepEvent)]  # the test's own note: the steps' candidates
    return engine, prompt.ids, [e.id for e in engine.last_steps]


def reference(folder, dtype):
    """transformers' own model from the same folder, in `dtype`."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


@pytest.fixture(scope="module")
def folders(smol_tokenizer, tmp_path_factory):
    """Tiny Qwen3 (q/k norms, tied head) and Llama (untied head) folders saved in bf16, fp16 and fp32."""
    root = tmp_path_factory.mktemp("stored")
    return {(kind, dtype): save_folder(root, smol_tokenizer, kind, dtype, tie_word_embeddings=kind == "qwen3")
            for kind in ("qwen3", "llama") for dtype in (torch.bfloat16, torch.float16, torch.float32)}


def linears(model):
    return [m for m in model.modules() if isinstance(m, GGMLLinear)]


# ------------------------------------------------------------------------------------------ as stored
def test_the_linear_layers_become_views_of_the_loaded_tensors(folders):
    """run_as_stored on transformers' own bf16 model: every linear layer's ggml rows are the very memory of the
    weight transformers loaded (same data pointer and bytes), the tied head the embedding table's."""
    _ggml_or_skip()
    model = reference(folders["qwen3", torch.bfloat16], torch.bfloat16)
    before = {path: (m.weight.data_ptr(), m.weight.detach().clone()) for path, m in hf_stored.stored_linears(model)}
    stored = hf_stored.run_as_stored(model)
    assert stored.facts is not None and stored.facts.blocks == "BF16" and stored.notice is None
    for path, (pointer, values) in before.items():
        layer = model.get_submodule(path)
        assert isinstance(layer, GGMLLinear) and layer.matrix.type_name == "BF16"
        assert layer.matrix.raw.data_ptr() == pointer
        assert torch.equal(layer.matrix.raw.view(torch.bfloat16), values)
    assert model.lm_head.matrix.raw.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_a_folder_loads_as_stored_and_decodes_like_its_float32_values(folders, kind, dtype):
    """load_model (--dtype auto, CPU): no float32 copy of a 16-bit matrix (the norms and biases alone are float32:
    they are what the C++ step reads, a few KB), the linear layers ggml rows of the stored dtype, the facts say so;
    the engine's greedy ids over 16 steps are transformers' `generate` on the same stored values in float32. (Not
    `generate` in bf16: transformers rounds every activation to bf16 there, and on the tiny Qwen3 that parts from its
    own float32 run at the first step; ggml's products round only their inputs, as llama.cpp does.)"""
    _ggml_or_skip()
    folder = folders[kind, dtype]
    loaded = load_model(str(folder), device="cpu")
    model = loaded.model
    assert {p.dtype for p in model.parameters() if p.dim() >= 2} == {dtype}  # the embedding table, as stored
    assert {p.dtype for p in model.parameters() if p.dim() < 2} == {torch.float32}
    layers = linears(model)
    name = hf_stored.STORED_TYPES[dtype]
    assert layers and all(m.matrix.type_name == name for m in layers)
    assert not any(type(m) is nn.Linear for m in model.modules())
    facts = loaded.facts
    assert facts.dtype == str(dtype).removeprefix("torch.") and facts.quantization.blocks == name
    size = torch.empty((), dtype=dtype).element_size()
    assert facts.quantization.weight_bytes == sum(m.in_features * m.out_features * size for m in layers)
    assert facts.tied_lm_head is (kind == "qwen3")
    assert facts.kv_bytes_per_value == 4  # the cache is float32, as the computation around the products
    oracle = reference(folder, torch.float32)
    assert facts.parameters == sum(p.numel() for p in oracle.parameters())
    engine, prompt, ids = run_ids(loaded)
    expected = generate_ids(oracle, prompt, STEPS, stop_at_eos=False)
    assert_varies(expected)
    assert ids == expected
    assert "ggml" in engine.facts.decode_plan


def test_without_ggml_the_folder_runs_in_torch_and_says_why(folders, monkeypatch):
    """ggml's library not available: the folder loads as transformers loads it, in its dtype where this CPU
    multiplies in it (else float32), the load's notice names the reason, and the engine's ids are `generate`'s."""
    monkeypatch.setattr(ggml_linear, "available", lambda: "planted: no library here")
    folder = folders["llama", torch.bfloat16]
    loaded = load_model(str(folder), device="cpu")
    kept = torch.bfloat16 if hf_stored.cpu_lacks(torch.bfloat16) is None else torch.float32
    assert {p.dtype for p in loaded.model.parameters()} == {kept}
    assert not linears(loaded.model) and loaded.facts.quantization is None
    assert "planted: no library here" in loaded.notice
    engine, prompt, ids = run_ids(loaded)
    assert "transformers' forward" in engine.facts.decode_plan
    assert ids == generate_ids(reference(folder, kept), prompt, STEPS, stop_at_eos=False)


def test_a_cpu_without_16_bit_instructions_gets_float32(folders, monkeypatch):
    """Where the CPU lacks the dtype's instructions and ggml's kernels are not there, torch would emulate its bf16
    products (several times slower than float32): the model is cast to float32, and the notice says why."""
    monkeypatch.setattr(ggml_linear, "available", lambda: "planted: no library here")
    monkeypatch.setattr(hf_stored, "cpu_lacks", lambda dtype: "planted: no BF16 instructions")
    loaded = load_model(str(folders["llama", torch.bfloat16]), device="cpu")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
    assert "cast to float32" in loaded.notice and "planted: no BF16 instructions" in loaded.notice


# ------------------------------------------------------------------------------------------ --quantize int8
def q8_bound(weight: torch.Tensor) -> torch.Tensor:
    """Per weight: how far Q8_0 may move it. Each block of 32 has d = max|w| / 127 and levels round(w / d) in
    -127..127, times d rounded to float16: half a level, plus 127 levels times float16's half-ulp of d (2^-11 d)."""
    blocks = weight.float().reshape(weight.shape[0], -1, 32)
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127
    return (d * (0.5 + 127 * 2.0 ** -11) + 1e-12).expand_as(blocks).reshape(weight.shape)


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_quantize_int8_rows_within_q8_0_rounding_and_greedy_its_own_forward(folders, kind):
    """--quantize int8: every linear layer (the head too, tied or not; not the embedding table) is Q8_0 rows
    within Q8_0's rounding of the stored weights; the engine's greedy ids are `generate`'s through the same
    modules; the facts label it."""
    _ggml_or_skip()
    folder = folders[kind, torch.bfloat16]
    loaded = load_model(str(folder), device="cpu", quantize="int8")
    model, original = loaded.model, reference(folder, torch.float32)
    layers = dict((path, m) for path, m in model.named_modules() if isinstance(m, GGMLLinear))
    assert set(layers) == {path for path, _ in hf_stored.stored_linears(original)}
    for path, layer in layers.items():
        assert layer.matrix.type_name == "Q8_0"
        weight = original.get_submodule(path).weight
        assert ((layer.weight - weight).abs() <= q8_bound(weight)).all(), path
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16  # the table stays as loaded
    quant = loaded.facts.quantization
    assert quant.blocks == "Q8_0" and quant.quantized_here and quant.matrices == len(layers)
    assert quant.summary() == "Q8_0 weights quantized here (8-bit, group 32, fp16 scales) · int8 activations"
    assert quant.weight_bytes == sum(m.matrix.nbytes for m in layers.values())
    engine, prompt, ids = run_ids(loaded)
    assert "Q8_0 weights (--quantize)" in engine.facts.decode_plan
    expected = generate_ids(model, prompt, STEPS, stop_at_eos=False)
    assert_varies(expected)
    assert_same_or_near_tie(engine, ids, expected)


def assert_same_or_near_tie(engine, ids, expected) -> None:
    """The engine's ids are `expected`, or part from them only where its top two candidates were within 5 % of each
    other: its native step's sums run in another order than the forward's, and an activation one float32 rounding
    away can round to the next step of its 8-bit block (core/model/native/ggml_native.py) - at a near-tie that can
    flip the pick, and the runs part there (measured: the tiny Qwen3 in Q8_0 at step 11, candidates 2.3 % apart)."""
    at = first_divergence(ids, expected)
    if at is not None:
        raw = sorted((c.raw_prob for c in engine.last_steps[at].candidates), reverse=True)
        assert raw[0] - raw[1] < 5e-2 * raw[0], f"step {at + 1}: the engine's top-1 margin {raw[0] - raw[1]:.2e}"


def test_quantize_int8_without_ggml_is_one_line(folders, monkeypatch):
    from tokentui.core.errors import ModelLoadError

    monkeypatch.setattr(ggml_linear, "load", lambda progress: "planted: cannot build")
    with pytest.raises(ModelLoadError, match="^--quantize int8 runs on ggml's kernels, which are not available "
                                             r"\(planted: cannot build\)"):
        load_model(str(folders["llama", torch.bfloat16]), device="cpu", quantize="int8")
