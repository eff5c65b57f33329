"""A decode step with fewer host operations, for Llama-family models whose matrices are 4-bit (core/model/quant/qlinear.py).

Why: with the weights 4-bit, a SmolLM2 decode step reads ~100 MB instead of 538, and the host work around the
kernels becomes a large share of it: transformers' forward runs ~2,400 tensor operations and ~400 module calls for
one token (its masks, cache positions, output containers and per-module hooks), where the arithmetic needs about
half of those. This step calls the same modules and the same functions the model's own forward calls, in the same
order (the model's own `apply_rotary_pos_emb`, its attention interface, its norms, its 4-bit projections; q/k/v and
gate/up as one fused product each), and leaves out the rest. It writes into the same KV cache, so a run can switch
between it and the model's forward at any step (the logit lens asks the forward for hidden states).

It is used only where it gives the model's own scores: `lean_decoder(model)` runs three tokens through both on a
scratch cache and keeps the lean step only if every score is bit-identical (torch.equal); else decode stays the
model's forward. On tokentui's own kernels the native step (core/model/native/native_step.py: this step's arithmetic in
C++, one call a token) decodes instead, checked against this one. Supported: decoder-only Llama, Mistral, Qwen2 and Qwen3 models with full attention (no sliding
window) and transformers' sdpa attention.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..quant.gguf_quant import GROUP
from ..quant.qlinear import FusedQLinear, QLinear, QLinearPart, quantized_modules

SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_DECODERS: "weakref.WeakKeyDictionary[object, LeanDecoder | None]" = weakref.WeakKeyDictionary()
_LOCK = threading.RLock()  # held while a model's step is made and checked, so it is checked once
_STACKS: "weakref.WeakKeyDictionary[LeanDecoder, list[torch.Tensor | None]]" = weakref.WeakKeyDictionary()


def _fused_of(*parts) -> FusedQLinear | None:
    """The FusedQLinear behind `parts` when they are exactly its parts, in order."""
    fused = getattr(parts[0], "fused", None)
    if not all(isinstance(p, QLinearPart) and p.fused is fused for p in parts):
        return None
    return fused if [p.index for p in parts] == list(range(len(fused.widths))) else None


def _joined_bias(parts) -> torch.Tensor | None:
    """One bias for a fused product (Qwen2's q/k/v), or None when no part has one."""
    if all(p.bias is None for p in parts):
        return None
    return torch.cat([p.bias if p.bias is not None else p.bias.new_zeros(p.out_features) for p in parts])


@dataclass(frozen=True)
class _Layer:
    norm1: nn.Module
    qkv: FusedQLinear
    qkv_bias: torch.Tensor | None
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    attn: nn.Module
    o_proj: QLinear
    norm2: nn.Module
    gate_up: FusedQLinear
    act: nn.Module
    down: QLinear


def llama_layer(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, weights: tuple, shape: tuple[int, int, int, int],
                norm, product, attend, act) -> torch.Tensor:
    """One Llama-family decoder layer for one token: the arithmetic the lean step runs eagerly and the compiled lean
    step compiles (core/model/decode/compiled_lean.py), written once. What differs between the two is passed in:
    `norm(x, weight)` (an RMSNorm), `product(h, packed, scale_zeros)` (a 4-bit product), `attend(q, k, v)` (writes
    this position's k and v to the cache and attends over it: [1, heads, 1, D], [1, KV, 1, D] x2 -> [1, heads * D]),
    `act` (the MLP's activation module).

    Shapes: x [1, H] -> [1, H]; cos / sin [1, 1, 1, D]; `weights`: one layer's row of `stacked_weights`' 13 kinds
    (what `norm` and `product` take; None for a kind the model does not have); `shape`: (heads, kv_heads, head_dim,
    the MLP width)."""
    w1, qkv_p, qkv_s, qkv_b, qn, kn, o_p, o_s, w2, gu_p, gu_s, d_p, d_s = weights
    heads, kv_heads, dim, width = shape
    half, q_width, k_width = dim // 2, heads * dim, kv_heads * dim
    qkv = product(norm(x, w1), qkv_p, qkv_s)  # [1, q + k + v]
    if qkv_b is not None:
        qkv = qkv + qkv_b
    qk = qkv[:, :q_width + k_width].view(1, heads + kv_heads, 1, dim)
    if qn is not None:  # Qwen3: a norm per head before the rotation
        qk = torch.cat([norm(qk[:, :heads], qn), norm(qk[:, heads:], kn)], 1)
    # transformers' apply_rotary_pos_emb, once for q and k: x * cos + rotate_half(x) * sin
    qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin
    out = attend(qk[:, :heads], qk[:, heads:], qkv[:, q_width + k_width:].view(1, kv_heads, 1, dim))
    x = x + product(out, o_p, o_s)
    gate_up = product(norm(x, w2), gu_p, gu_s)
    return x + product(act(gate_up[:, :width]) * gate_up[:, width:], d_p, d_s)


class LeanDecoder:
    """One model's lean decode step (see the module docstring): `step(token_id, cache) -> logits [V]`, on a
    transformers cache; core/model/decode/steps.py's LeanTorch decodes a run with it.

    `fused_norms`: RMSNorm as torch's one-op `F.rms_norm` instead of the model's module (eight operations); used
    only when that, too, gives bit-identical scores."""

    def __init__(self, model, fused_norms: bool = True):
        inner = model.model
        self.fused_norms = fused_norms
        self.embed, self.rotary, self.norm, self.head = inner.embed_tokens, inner.rotary_emb, inner.norm, model.lm_head
        self.device = self.embed.weight.device
        self.layers: list[_Layer] = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv, gate_up = _fused_of(attn.q_proj, attn.k_proj, attn.v_proj), _fused_of(mlp.gate_proj, mlp.up_proj)
            if qkv is None or gate_up is None or not isinstance(attn.o_proj, QLinear) \
                    or not isinstance(mlp.down_proj, QLinear) or attn.o_proj.halves or mlp.down_proj.halves:
                raise ValueError("not fused 4-bit q/k/v and gate/up")
            if _joined_bias((mlp.gate_proj, mlp.up_proj)) is not None or attn.o_proj.bias is not None \
                    or mlp.down_proj.bias is not None:
                raise ValueError("biases outside q/k/v")
            self.layers.append(_Layer(layer.input_layernorm, qkv, _joined_bias((attn.q_proj, attn.k_proj, attn.v_proj)),
                                      getattr(attn, "q_norm", None), getattr(attn, "k_norm", None), attn,
                                      attn.o_proj, layer.post_attention_layernorm, gate_up, mlp.act_fn,
                                      mlp.down_proj))
        first = self.layers[0].attn
        self.head_dim, self.heads = first.head_dim, first.config.num_attention_heads
        self.kv_heads = first.config.num_key_value_heads
        self.gqa = self.heads != self.kv_heads

    @staticmethod
    def supports(model) -> bool:
        config = getattr(model, "config", None)
        if type(model).__name__ not in SUPPORTED or config is None or not quantized_modules(model):
            return False
        if getattr(config, "_attn_implementation", None) != "sdpa":
            return False
        types = getattr(config, "layer_types", None) or ["full_attention"]
        sliding = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
        return all(t == "full_attention" for t in types) and not sliding

    # -------------------------------------------------------------------------------------------- the step
    def _norm(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.fused_norms:
            return F.rms_norm(x, module.weight.shape, module.weight, module.variance_epsilon)
        return module(x)

    @staticmethod
    def _product(x: torch.Tensor, weights, _=None) -> torch.Tensor:
        """x [1, in] float32 -> [1, out] float32 through the 4-bit kernel (QLinear's arithmetic, 2-D throughout)."""
        kernel = weights.kernel
        return kernel.mm(x.to(kernel.activation_dtype).contiguous(), weights.packed, weights.scale_zeros).to(x.dtype)

    @torch.inference_mode()
    def step(self, token_id: int, cache) -> torch.Tensor:
        """One token through the model, extending `cache` (a transformers DynamicCache) -> logits [V]."""
        return self.head(self.hidden(token_id, cache))[0]

    @torch.inference_mode()
    def hidden(self, token_id: int, cache) -> torch.Tensor:
        """`step` up to the head: the final norm's output [1, H].

        Shapes: x [1, H]; q/k rotated together as [1, heads + kv_heads, 1, D]; attention as transformers' sdpa
        path calls it for one query (enable_gqa, no mask, not causal)."""
        position = cache.get_seq_length()
        ids = torch.full((1,), token_id, dtype=torch.long, device=self.device)  # [1]
        x = F.embedding(ids, self.embed.weight)  # [1, H]
        cos, sin = self.rotary(x, torch.full((1, 1), position, dtype=torch.long, device=self.device))
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [1, 1, 1, D]
        q_width = self.heads * self.head_dim

        def norm(h: torch.Tensor, module: nn.Module) -> torch.Tensor:
            return self._norm(module, h)

        for index, layer in enumerate(self.layers):
            def attend(q, k_new, v_new, index=index, layer=layer):
                k, v = cache.update(k_new, v_new, index)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
                                                     scale=layer.attn.scaling, is_causal=False, enable_gqa=self.gqa)
                return out.reshape(1, q_width)

            weights = (layer.norm1, layer.qkv, None, layer.qkv_bias, layer.q_norm, layer.k_norm, layer.o_proj, None,
                       layer.norm2, layer.gate_up, None, layer.down, None)
            x = llama_layer(x, cos, sin, weights, (self.heads, self.kv_heads, self.head_dim, layer.gate_up.widths[0]),
                            norm, self._product, attend, layer.act)
        return self._norm(self.norm, x)


def stacked_weights(decoder: LeanDecoder) -> list[torch.Tensor | None]:
    """Each kind of per-layer weight as one tensor [L, ...] (None for a kind the model does not have), made once
    per model. Why: every tensor handed to a compiled graph is checked and unwrapped on every call; 13 stacked
    tensors instead of ~400 per-layer ones cut that from ~0.9 to ~0.3 ms a step (docs/design-record.md); the
    native step (core/model/native/native_step.py) reads its layers' weights by offsets into the same stacks. The
    4-bit modules are re-pointed at their rows of the stacks (same values, in place, as core/model/quant/weight_layout.py
    re-lays float weights), so the weights are held once."""
    with _LOCK:
        if decoder in _STACKS:
            return _STACKS[decoder]
        rows = [(layer.norm1.weight, layer.qkv.packed, layer.qkv.scale_zeros, layer.qkv_bias,
                 getattr(layer.q_norm, "weight", None), getattr(layer.k_norm, "weight", None),
                 layer.o_proj.packed, layer.o_proj.scale_zeros, layer.norm2.weight, layer.gate_up.packed,
                 layer.gate_up.scale_zeros, layer.down.packed, layer.down.scale_zeros) for layer in decoder.layers]
        stacked: list[torch.Tensor | None] = []
        for kind in zip(*rows):
            if all(t is None for t in kind):
                stacked.append(None)
                continue
            if any(t is None for t in kind) or len({(t.dtype, tuple(t.shape)) for t in kind}) != 1:
                raise ValueError("layers differ in a weight's shape")
            stacked.append(torch.stack([t.detach() for t in kind]))
        for index, layer in enumerate(decoder.layers):  # the packed matrices: one copy, the stacks' rows
            for module, packed, scale_zeros in ((layer.qkv, 1, 2), (layer.o_proj, 6, 7), (layer.gate_up, 9, 10),
                                                (layer.down, 11, 12)):
                module.packed, module.scale_zeros = stacked[packed][index], stacked[scale_zeros][index]
        _STACKS[decoder] = stacked
        return stacked


def _bit_identical(model, decoder: LeanDecoder) -> bool:
    """Three tokens after a four-token prompt, through the model's forward and through `decoder`, on scratch caches:
    every score equal."""
    from .adapter import forward_last_logits, new_cache

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a few small forwards: on a busy 2-core machine two threads only wait on each other
    try:
        return _same_scores(model, decoder, forward_last_logits, new_cache)
    finally:
        torch.set_num_threads(threads)


def _same_scores(model, decoder: LeanDecoder, forward_last_logits, new_cache) -> bool:
    prompt = torch.tensor([[1, 2, 3, 4]], device=decoder.device)
    ours, theirs = new_cache(model, 8), new_cache(model, 8)
    forward_last_logits(model, prompt, ours)
    forward_last_logits(model, prompt, theirs)
    for token in (5, 6, 7):
        expected = forward_last_logits(model, torch.full((1, 1), token, device=decoder.device), theirs)
        if not torch.equal(decoder.step(token, ours), expected):
            return False
    return True


def lean_decoder(model) -> LeanDecoder | None:
    """The lean step for `model` (made and checked once per model), or None where the model's forward is used."""
    with _LOCK:
        if model not in _DECODERS:
            _DECODERS[model] = decoder = None  # while it is checked, its own scratch caches get no lean step
            for fused_norms in ((True, False) if LeanDecoder.supports(model) else ()):
                try:
                    candidate = LeanDecoder(model, fused_norms)
                    if _bit_identical(model, candidate):
                        decoder = candidate
                        break
                except Exception:  # a structure this step does not know after all: the forward it is
                    break
            _DECODERS[model] = decoder
        return _DECODERS[model]


@contextlib.contextmanager
def disabled(model):
    """Engines made for `model` meanwhile decode through the model's forward, not the lean step (their decode plan
    is chosen as they are made; for measuring one against the other: benchmarks/bench_quant.py)."""
    saved = lean_decoder(model)
    with _LOCK:
        _DECODERS[model] = None
    try:
        yield
    finally:
        with _LOCK:
            _DECODERS[model] = saved
