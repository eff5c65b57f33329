"""The native decode step on ggml's kernels (core/model/native/ggml_native.py, ggml_step.cpp) for models whose
matrices are GGUF tensors kept as stored: tiny Llama / Qwen2 (q/k/v bias) / Qwen3 (q/k RMSNorm) / Mistral models,
tied and untied, with every Linear a GGMLLinear in Q8_0, or K-quants mixed per matrix as a Q4_K_M file mixes them.
Held to the model's own forward through the same modules (which runs the same products: ggml's, on the same 8-bit
activation blocks): greedy ids over 20 steps, the KV cache rows, the logits; to `generate`'s float32 greedy ids
where Q8_0 keeps them; and refused, in one line, where it does not serve a model."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import DynamicCache

from test_ggml_kernels import bound_ggml
from tiny_models import INIT, assert_varies, tiny_model
from tokentui.core.model.decode.adapter import forward_last_logits, new_cache
from tokentui.core.model.native import ggml_native
from tokentui.core.model.native.ggml_native import GGMLStep, ggml_step, why_not
from tokentui.core.model.quant.ggml_linear import GGMLEmbedding, GGMLLinear, GGMLMatrix

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PROMPT = [5, 17, 99, 3, 250, 42]
# a K-quant-shaped config: every matrix's input width a multiple of 256 (the K-quants' block)
K_SHAPED = dict(hidden_size=256, intermediate_size=512, head_dim=64)
# a Q4_K_M-like mix: Q6_K for v, down and the (tied) embedding, Q4_K for the rest
MIXED = {"v_proj": "Q6_K", "down_proj": "Q6_K", "embed": "Q6_K"}


@pytest.fixture(scope="module", autouse=True)
def ggml():
    with bound_ggml():
        yield


class Vocabulary:
    """What tiny_model reads of a tokenizer: a 512-token vocabulary (ids only: nothing here is text)."""

    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __len__(self):
        return 512


def float_model(kind: str, *, random_norms: bool = True, **overrides):
    """A tiny float32 model at INIT (context-dependent greedy ids); Qwen2's q/k/v biases drawn large enough to
    matter. random_norms: every RMSNorm weight drawn from [0.5, 1.5], as trained models' are. (At the initial
    all-ones weights, a norm's output over a de-quantized embedding row is a few integers times one scale, so
    many values fall exactly on a rounding boundary of the 8-bit activation blocks, and float32 rounding in another
    order — the C++ step's — decides them: real, but a trained model's weights make it rare.)"""
    if kind == "mistral":  # (tiny_models has none: its config with no sliding window, as Mistral 7B v0.2 on)
        import transformers

        torch.manual_seed(0)
        config = transformers.MistralConfig(vocab_size=len(Vocabulary()), hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            sliding_window=None, initializer_range=INIT, **overrides)
        model = transformers.MistralForCausalLM(config).eval()
    else:
        model = tiny_model(kind, Vocabulary(), initializer_range=INIT, **overrides)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") and random_norms:
                p.uniform_(0.5, 1.5)
            if name.endswith("_proj.bias"):
                p.normal_(0.0, 0.5)
    return model


def stored(model, formats: dict[str, str] | str):
    """`model` (changed in place) with every Linear a GGMLLinear and the embedding a GGMLEmbedding of its weights
    quantized by ggml (formats: one for all, or per module name with Q4_K for the rest); a tied head is a GGMLLinear
    on the embedding's matrix (as a tied GGUF has no head tensor), an untied one on its own."""
    def fmt(name: str) -> str:
        return formats if isinstance(formats, str) else formats.get(name, "Q4_K")

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and name != "lm_head":
                setattr(module, name, GGMLLinear(GGMLMatrix.quantize(child.weight, fmt(name)), child.bias))
    tied = model.config.tie_word_embeddings
    table = GGMLEmbedding(GGMLMatrix.quantize(model.model.embed_tokens.weight, fmt("embed")))
    head = table.matrix if tied else GGMLMatrix.quantize(model.lm_head.weight, fmt("lm_head"))
    model.model.embed_tokens, model.lm_head = table, GGMLLinear(head)
    return model


def greedy(model, cache, steps: int, decode) -> list[int]:
    """The prompt through the model's forward, then `steps` greedy tokens through decode(token, cache) -> logits."""
    with torch.inference_mode():
        ids = [int(forward_last_logits(model, torch.tensor([PROMPT]), cache).argmax())]
        for _ in range(steps - 1):
            ids.append(int(decode(ids[-1], cache).argmax()))
    return ids


def forward_decode(model):
    return lambda token, cache: forward_last_logits(model, torch.tensor([[token]]), cache)


def rows_close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-4) -> bool:
    return bool(torch.isfinite(a).all()) and float((a - b).abs().max()) <= rel * max(1.0, float(b.abs().max()))


CASES = [(kind, fmt, True) for kind in ("llama", "qwen2", "qwen3") for fmt in ("Q8_0", "mixed")] + [
    ("mistral", "Q8_0", True), ("llama", "Q8_0", False), ("qwen3", "mixed", False)]


@pytest.mark.parametrize("kind, fmt, tied", CASES)
def test_greedy_ids_and_cache_rows_are_the_models_own_forwards(kind, fmt, tied):
    shape = K_SHAPED if fmt == "mixed" else {}
    model = stored(float_model(kind, tie_word_embeddings=tied, **shape), MIXED if fmt == "mixed" else fmt)
    assert (model.lm_head.matrix is model.model.embed_tokens.matrix) == tied
    step = ggml_step(model)
    assert isinstance(step, GGMLStep) and why_not(model) == ""
    ours, theirs = new_cache(model, 8), new_cache(model, 8)  # 8 rows: the buffers grow under the step
    ids = greedy(model, ours, 20, step.step)
    assert ids == greedy(model, theirs, 20, forward_decode(model))
    assert_varies(ids, "the forward's 20 greedy ids")
    assert ours.get_seq_length() == theirs.get_seq_length() == len(PROMPT) + 19
    # float32 rounding apart (an 8-bit rounding boundary crossed would move a row by ~1%: these models have none)
    for a, b in zip(ours.layers, theirs.layers):
        assert rows_close(a.keys, b.keys) and rows_close(a.values, b.values)
    with torch.inference_mode():  # the logits: the model's own (tied) head on the step's final hidden state
        token = ids[-1]
        logits = step.step(token, ours)
        expected = forward_decode(model)(token, theirs)
    assert rows_close(logits, expected)


def test_q8_0_keeps_generates_float32_greedy_ids():
    # On this model (tiny Llama at INIT, as built) Q8_0's rounding moves no greedy choice over 24 steps; on the
    # others above it does at some step (their margins are a random model's), which is Q8_0's, not the step's.
    reference = float_model("llama", random_norms=False)
    x = torch.tensor([PROMPT])
    expected = reference.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=24,
                                  eos_token_id=-1)[0, len(PROMPT):].tolist()
    model = stored(copy.deepcopy(reference), "Q8_0")
    step = ggml_step(model)
    assert step is not None
    assert greedy(model, new_cache(model, 64), 24, step.step) == expected
    assert_varies(expected, "generate's 24 greedy ids")


@pytest.mark.parametrize("formats", ["mixed", "Q4_0"])
def test_the_same_bits_at_one_and_two_threads(formats):
    """Over a cache long enough that attention splits its heads over the threads (fork_rule.h: 4 heads, each 260 rows
    x head_dim 64, more heads than the grain of 65,536 multiply-adds a thread); in Q4_0 the layers' rows repacked, in
    the Q4_K_M-like mix as stored or repacked, split over the threads by fork_rule.h's shared_for."""
    model = stored(float_model("qwen3", **K_SHAPED), MIXED if formats == "mixed" else "Q4_0")
    step = ggml_step(model)
    assert model.config.num_attention_heads > (1 << 16) // (260 * model.config.head_dim)
    prompt = (PROMPT * 44)[:260]
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        cache = new_cache(model, 280)
        with torch.inference_mode():
            forward_last_logits(model, torch.tensor([prompt]), cache)
            results.append([step.hidden(token, cache) for token in (3, 99, 123)])
    torch.set_num_threads(1)
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("formats", ["Q4_0", "mixed"])
def test_repacked_matrices_decode_as_the_stored_ones(formats, monkeypatch):
    """Q4_0 / Q4_K matrices in ggml's interleaved layout (gemv, as llama-server on AVX2) against the same model kept
    as stored (vec_dot): the same greedy ids over 20 steps, logits a float32 rounding apart."""
    from tokentui.core.model.quant import ggml_linear

    reference = float_model("qwen3", **K_SHAPED)
    packed = stored(copy.deepcopy(reference), MIXED if formats == "mixed" else formats)
    monkeypatch.setenv(ggml_linear.REPACK_ENV, "0")
    plain = stored(copy.deepcopy(reference), MIXED if formats == "mixed" else formats)
    kernels = {m.kernel for m in packed.modules() if isinstance(m, GGMLLinear)}
    if kernels == {"vec_dot"}:
        pytest.skip("ggml has no interleaved kernels on this CPU / build")
    assert {"q4_0x8 gemv" if formats == "Q4_0" else "q4_Kx8 gemv"} <= kernels
    assert {m.kernel for m in plain.modules() if isinstance(m, GGMLLinear)} == {"vec_dot"}
    caches, steps = [new_cache(packed, 8), new_cache(plain, 8)], [ggml_step(packed), ggml_step(plain)]
    ids = [greedy(model, cache, 20, step.step) for model, cache, step in zip((packed, plain), caches, steps)]
    assert ids[0] == ids[1]
    assert_varies(ids[0], "the stored model's 20 greedy ids")
    with torch.inference_mode():
        logits = [step.step(ids[0][-1], cache) for step, cache in zip(steps, caches)]
    assert rows_close(logits[0], logits[1])


def test_a_cache_it_cannot_write_decodes_through_the_forward():
    model = stored(float_model("llama"), "Q8_0")
    a, b = DynamicCache(config=model.config), DynamicCache(config=model.config)  # transformers' own layers
    with torch.inference_mode():
        forward_last_logits(model, torch.tensor([PROMPT]), a)
        forward_last_logits(model, torch.tensor([PROMPT]), b)
        assert torch.equal(ggml_step(model).step(5, a), forward_decode(model)(5, b))
    assert a.get_seq_length() == b.get_seq_length() == len(PROMPT) + 1


@pytest.mark.parametrize("make, words", [
    (lambda: stored(float_model("llama", hidden_act="gelu"), "Q8_0"), "an MLP activation other than SiLU"),
    (lambda: float_model("llama"), "matrices not kept as GGUF tensors (Linear)"),
    (lambda: stored(float_model("qwen2", use_sliding_window=True, sliding_window=16), "Q8_0"), "sliding-window"),
])
def test_refused_in_one_line_where_it_does_not_serve(make, words):
    model = make()
    assert ggml_step(model) is None
    reason = why_not(model)
    assert words in reason and "\n" not in reason


def test_refused_where_its_states_are_not_the_forwards(monkeypatch):
    # the acceptance check itself: with no tolerance at all, float32 sums in another order are refused
    monkeypatch.setattr(ggml_native, "TOLERANCE", 0.0)
    model = stored(float_model("llama", **K_SHAPED), MIXED)
    assert ggml_step(model) is None
    assert why_not(model) == "its states differ from the model's forward by more than 8-bit rounding"
