"""The native decode step for models whose matrices are GGUF tensors kept as stored (core/model/quant/ggml_linear.py's
GGMLLinear): a Llama / Mistral / Qwen2 / Qwen3 model's whole decode step as one C++ call (core/model/native/
ggml_step.cpp), every product through ggml's own CPU kernels, each matrix in its own format (a repacked Q4_0 / Q4_K
matrix by ggml's interleaved gemv on its packed copy, as GGMLLinear runs it).

Like core/model/native/native_step.py (the same C++ arithmetic between the products, step_math.h): the rotation's
cos / sin from the model's own rotary module, the KV buffers the cache's own (growable_layers), the embedding row from
the model's own embedding module and the head the model's own (a tied head: a GGMLLinear on the embedding's matrix,
through ggml's product), called once on the final hidden state.

Its states are not the model's forward's bit for bit: the norms and attention sum in another order. The products
are the same (GGMLLinear runs ggml's product for one row: the same 8-bit activation blocks, the same vec_dot or
interleaved gemv), but an activation one float32 rounding away may round to the neighbouring step of its 8-bit
block; so `ggml_step(model)` accepts the step only where, on three tokens after a four-token prompt (scratch
caches), its final hidden states are within TOLERANCE of the model's forward's (for a GGUF run as stored, on the
file's first start with these libraries: later starts take the verdict kept in its cache).
tests/unit/test_ggml_step.py holds it to the model's forward (greedy ids, cache rows), to `generate` on tiny Llama /
Qwen2 / Qwen3 models, and with repacked matrices to the same model kept as stored. A prompt's rows go through the
same modules and vectors (`layers`) in core/model/native/ggml_prefill.py.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..decode.adapter import cache_keyword, new_cache
from ..decode.buffers import growable_layers
from ..quant.ggml_linear import GGMLEmbedding, GGMLLinear, available

SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# max |difference| of the final norm's output from the model's forward's, relative to its largest |value| (or 1),
# for the step to be accepted. The two differ where a float32 rounding (norms and attention summed in another order)
# moves an activation across a rounding boundary of its 8-bit block: it then differs by one step, 1/127 of its
# block's largest, and the layers after carry that on. A token's products round hundreds of thousands of
# activations on a Qwen3-0.6B-sized model, so some cross at most steps; what that adds up to over 28 layers of
# random weights, in Q8_0 and a Q4_K_M mix, is in BENCHMARKS.md (ggml section): this bound is a few times its
# largest. A wrong weight, rotation, norm, bias or cache row moves the output by order 1.
TOLERANCE = 0.1
# a decoder layer's 7 matrices by their module paths, in LayerParts' order (core/model/load/gguf_direct.py reads them
# by the same names)
LAYER_MATRICES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                  "mlp.up_proj", "mlp.down_proj")
_STEPS: "weakref.WeakKeyDictionary[object, GGMLStep | None]" = weakref.WeakKeyDictionary()
_WHY: "weakref.WeakKeyDictionary[object, str]" = weakref.WeakKeyDictionary()
_TRUSTED: "weakref.WeakSet[object]" = weakref.WeakSet()  # `trust`
# `when_compared`'s callbacks
_KEEP: "weakref.WeakKeyDictionary[object, Callable[[bool, GGMLStep], None]]" = weakref.WeakKeyDictionary()
_LOCK = threading.RLock()


def _module(root: nn.Module, path: str):
    for part in path.split("."):
        root = getattr(root, part, None)
    return root


def _is_silu(act) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLU", "SiLUActivation")


def _rms(module) -> bool:
    """An RMSNorm-like module: a float32 weight and variance_epsilon (Llama's, Qwen2's, Qwen3's, Mistral's)."""
    weight = getattr(module, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.dtype == torch.float32 \
        and hasattr(module, "variance_epsilon") and "RMSNorm" in type(module).__name__


def _mats_of(layer: "LayerParts") -> tuple:
    return layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down


@dataclass(frozen=True)
class LayerParts:
    """One decoder layer as the ggml step reads it: its 7 matrices (GGMLLinear, q / k / v with their biases), its two
    RMSNorms' weights and Qwen3's q / k norms' (None elsewhere), float32."""

    q: GGMLLinear
    k: GGMLLinear
    v: GGMLLinear
    o: GGMLLinear
    gate: GGMLLinear
    up: GGMLLinear
    down: GGMLLinear
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None


@dataclass(frozen=True)
class StepParts:
    """What the ggml step runs, however it was found (`parts_of` a transformers model; core/model/load/gguf_direct.py
    from a GGUF's tensors without one): the embedding (GGMLEmbedding or nn.Embedding), the layers, the final norm's
    weight, the head (a GGMLLinear; a tied one over the embedding's matrix), the rotation (the model's rotary module,
    or core/model/native/rope.py's RopeTable: `rotary(x, position_ids) -> (cos, sin)`), and the shapes and scalars."""

    embed: nn.Module
    layers: tuple[LayerParts, ...]
    norm_weight: torch.Tensor
    head: nn.Module
    rotary: Callable
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    scale: float


def check_config(config, family: str) -> None:
    """ValueError (one line) for a config the ggml step does not run: another family, sliding-window layers."""
    if family not in SUPPORTED:
        raise ValueError(f"family {family}: the ggml step runs {', '.join(SUPPORTED)}")
    types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in types) or (
            getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)):
        raise ValueError(f"family {family}: its layers have sliding-window attention")


def parts_of(model) -> StepParts:
    """`model`'s modules as the ggml step reads them. ValueError (one line: why not) for a model it cannot run."""
    family = type(model).__name__
    check_config(model.config, family)
    inner = model.model
    embed, norm = inner.embed_tokens, inner.norm
    if not isinstance(embed, (GGMLEmbedding, nn.Embedding)):
        raise ValueError(f"an embedding of another kind ({type(embed).__name__})")
    if not _rms(norm):
        raise ValueError(f"family {family}: its final norm is not an RMSNorm in float32")
    epsilons, scales, layers = {norm.variance_epsilon}, set(), []
    for layer in inner.layers:
        mats = [_module(layer, path) for path in LAYER_MATRICES]
        if not all(isinstance(m, GGMLLinear) for m in mats):
            kinds = sorted({type(m).__name__ for m in mats if not isinstance(m, GGMLLinear)})
            raise ValueError(f"family {family}: its layers have matrices not kept as GGUF tensors "
                             f"({', '.join(kinds)})")
        if any(m.bias is not None for m in mats[3:]):
            raise ValueError(f"family {family}: its layers have biases outside q/k/v")
        if not _is_silu(layer.mlp.act_fn):
            raise ValueError("an MLP activation other than SiLU")
        attn = layer.self_attn
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        qk = [getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)]
        if not all(_rms(n) for n in norms) or (any(n is not None for n in qk) and not all(_rms(n) for n in qk)):
            raise ValueError(f"family {family}: its layers have norms other than float32 RMSNorm")
        epsilons.update(n.variance_epsilon for n in (*norms, *qk) if n is not None)
        scales.add(attn.scaling)
        layers.append(LayerParts(*mats, *(n.weight.detach() for n in norms),
                                 *(None if n is None else n.weight.detach() for n in qk)))
    if len(epsilons) != 1 or len(scales) != 1:
        raise ValueError("layers differ in their norm epsilon or attention scale")
    config = model.config
    return StepParts(embed=embed, layers=tuple(layers), norm_weight=norm.weight.detach(), head=model.lm_head,
                     rotary=inner.rotary_emb, heads=config.num_attention_heads, kv_heads=config.num_key_value_heads,
                     head_dim=inner.layers[0].self_attn.head_dim, eps=float(epsilons.pop()),
                     scale=float(scales.pop()))


class GGMLStep:
    """One model's native decode step on ggml's kernels: `step(token_id, cache) -> logits [V]` and `hidden(token_id,
    cache) -> [1, H]`, as NativeStep's. Made from a model's modules (`GGMLStep(model)`; ValueError, one line, for a
    model it cannot run) or from parts found without one (`from_parts`). Get one for a model with `ggml_step`."""

    def __init__(self, model):
        self._setup(parts_of(model), lambda: model)

    @classmethod
    def from_parts(cls, parts: StepParts, model_of: Callable[[], nn.Module]) -> "GGMLStep":
        """The step over `parts`; `model_of()` gives transformers' model (built on demand) for a cache of another
        kind, which only its forward extends."""
        step = cls.__new__(cls)
        step._setup(parts, model_of)
        return step

    def _setup(self, parts: StepParts, model_of: Callable[[], nn.Module]) -> None:
        self._model_of = model_of
        self.embed, self.rotary, self.head = parts.embed, parts.rotary, parts.head
        self.layers: list[LayerParts] = list(parts.layers)  # for a prompt's rows (ggml_prefill.py)
        self.heads, self.kv_heads, self.head_dim = parts.heads, parts.kv_heads, parts.head_dim
        self.eps, self.scale, self.norm_weight = parts.eps, parts.scale, parts.norm_weight
        self._mats = [m.run_bytes for layer in self.layers for m in _mats_of(layer)]  # interleaved, huge pages or file
        self._types = [m.matrix.type for layer in self.layers for m in _mats_of(layer)]
        self._packed = [int(m.packed is not None) for layer in self.layers for m in _mats_of(layer)]
        self._vectors: list[torch.Tensor | None] = []
        for layer in self.layers:
            self._vectors += [layer.input_norm, layer.post_norm]
            self._vectors += [None if m.bias is None else m.bias.detach() for m in (layer.q, layer.k, layer.v)]
            self._vectors += [layer.q_norm, layer.k_norm]

    @torch.inference_mode()
    def step(self, token_id: int, cache) -> torch.Tensor:
        """One token through the model, extending `cache` (after a prefill: its layers hold buffers) -> logits [V];
        the model's own forward where the cache is of another kind."""
        return self.head(self.hidden(token_id, cache))[0]

    @torch.inference_mode()
    def hidden(self, token_id: int, cache) -> torch.Tensor:
        """`step` up to the head: the final norm's output [1, H].

        Shapes: x [1, H]; cos / sin [D] for this position; the buffers [1, KV, capacity, D], row `position`
        written by the C++ step, which the layers then count."""
        layers = growable_layers(cache)
        ids = torch.full((1,), token_id, dtype=torch.long)  # [1]
        if layers is None:
            return self._forward_hidden(ids.view(1, 1), cache)
        position = cache.get_seq_length()
        x = self.embed(ids).to(torch.float32).contiguous()  # [1, H]
        cos, sin = self.rotary(x, torch.full((1, 1), position, dtype=torch.long))
        buffers = [layer.room_for_one() for layer in layers]
        hidden = torch.ops.tokentui_ggml.decode_step(
            x, position, cos.reshape(-1).float().contiguous(), sin.reshape(-1).float().contiguous(),
            [k for k, _ in buffers], [v for _, v in buffers], self._mats, self._types, self._packed, self._vectors,
            self.norm_weight, self.heads, self.kv_heads, self.eps, self.scale)  # [1, H]
        for layer in layers:
            layer.count_one()
        return hidden

    def _forward_hidden(self, ids: torch.Tensor, cache) -> torch.Tensor:
        """The model's own forward of ids [1, T] extending `cache` -> the last position's final hidden state [1, H]."""
        inner = self._model_of().model
        out = inner(input_ids=ids, use_cache=True, **{cache_keyword(inner): cache})
        return out.last_hidden_state[:, -1]


def close_enough(ours: torch.Tensor, forward: torch.Tensor) -> bool:
    """`ours` within TOLERANCE of the forward's, relative to its largest |value| (or 1); every value finite."""
    bound = TOLERANCE * max(1.0, float(forward.abs().max()))
    return bool(torch.isfinite(ours).all()) and float((ours - forward).abs().max()) <= bound


def close_to_forward(model, step: GGMLStep) -> bool:
    """Three tokens after a four-token prompt, through `step` and the model's forward on scratch caches: the final
    norm's outputs `close_enough`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a few small steps: on a busy 2-core machine two threads only wait on each other
    try:
        with torch.inference_mode():
            prompt = torch.tensor([[1, 2, 3, 4]])
            ours, theirs = new_cache(model, 8), new_cache(model, 8)
            step._forward_hidden(prompt, ours)
            step._forward_hidden(prompt, theirs)
            return all(close_enough(step.hidden(token, ours), step._forward_hidden(torch.tensor([[token]]), theirs))
                       for token in (5, 6, 7))
    finally:
        torch.set_num_threads(threads)


def trust(model) -> None:
    """`ggml_step(model)` takes the step without comparing it with the forward (`close_to_forward`, ~0.35 s on a
    Qwen3-0.6B-sized model): the model's file passed the comparison on its first start with the same libraries
    (`libraries()`; core/model/load/gguf_stored.py keeps that verdict in the file's cache). The step is still made
    from the model as it is when first asked for, and refused for what its construction refuses."""
    with _LOCK:
        _TRUSTED.add(model)


def when_compared(model, keep: "Callable[[bool, GGMLStep], None]") -> None:
    """`keep(accepted, step)` once `ggml_step(model)` has compared the step with the forward (not where it is trusted or
    cannot be made): how a file's first start keeps the verdict."""
    with _LOCK:
        _KEEP[model] = keep


def ggml_step(model) -> GGMLStep | None:
    """The ggml step for `model` (made and checked once per model, when first asked for), or None where it does not
    serve it (`why_not` says why); the comparison with the forward skipped for a model `trust`ed."""
    with _LOCK:
        if model not in _STEPS:
            _STEPS[model] = found = None
            why = available()
            if why is None:
                try:
                    candidate = GGMLStep(model)
                    if model in _TRUSTED or _compared(model, candidate):
                        found = candidate
                    else:
                        why = "its states differ from the model's forward by more than 8-bit rounding"
                except (ValueError, RuntimeError, AttributeError) as err:
                    why = (str(err).splitlines() or [type(err).__name__])[0]
            else:
                why = f"ggml's kernels are not available: {why}"
            _STEPS[model], _WHY[model] = found, why or ""
        return _STEPS[model]


def _compared(model, step: GGMLStep) -> bool:
    """`close_to_forward`, its verdict handed to what `when_compared` registered for `model`."""
    accepted = close_to_forward(model, step)
    keep = _KEEP.pop(model, None)
    if keep is not None:
        keep(accepted, step)
    return accepted


def libraries() -> str:
    """The native libraries bound now, by their files' names (each keyed by its sources and build: tokentui's step
    and ggml's kernels): what a verdict of `close_to_forward` holds for."""
    from ..native import q4_native
    from ..quant.ggml_linear import bound_library

    return f"{q4_native.library_name()}|{bound_library()}"


def why_not(model) -> str:
    """One line for the model panel: why the ggml step does not decode `model` ("" where it does)."""
    ggml_step(model)
    with _LOCK:
        return _WHY.get(model, "")
