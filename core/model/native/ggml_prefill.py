"""A prompt chunk through a model the ggml step decodes (core/model/native/ggml_native.py's GGMLStep: Llama, Mistral,
Qwen2, Qwen3 with every matrix a GGMLLinear), without transformers' forward: `prefill_hidden`.

The arithmetic is the forward's, on the same objects: each of a layer's 7 products is the same GGMLLinear called on
the chunk's rows (ggml's gemm on a repacked matrix, llama.cpp's matrix product through a ggml graph on one as
stored, as the forward calls it), q / k / v biases inside it; the RMSNorms by torch's F.rms_norm (as the lean
step's); the rotation from the model's own rotary module (its rope type and scaling) applied as `rotate_half` does;
keys and values appended to the run's cache through its layers' own `update` (buffers.py's GrowableBuffers);
attention by torch's scaled_dot_product_attention (transformers' sdpa path), each query seeing the cache's earlier
positions and the chunk's up to its own; SiLU MLP; residual adds. Only the last position goes through the final norm
(the run needs its scores alone).

Why hand-written rather than the forward: it is the one part of a plain run that still needed transformers' modeling
(the decode is the C++ step), which a start pays for in imports before its first token (issue 37, BENCHMARKS.md:
"What a first token without transformers could start from"). tests/unit/test_ggml_prefill.py holds it to the
forward: scores, the cache's keys and values, chunked and continued prompts, greedy ids, on tiny Llama / Qwen2 / Qwen3
models in Q8_0, Q4_0 and a Q4_K_M-like mix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["prefill_hidden"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Llama / Qwen RMSNorm in float32 as torch's one op (the lean step's too): x [..., W] -> [..., W]."""
    return F.rms_norm(x, weight.shape, weight, eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [1, heads, T, D] rotated by cos / sin [1, 1, T, D] as transformers' apply_rotary_pos_emb (`rotate_half`)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@torch.inference_mode()
def prefill_hidden(step, ids: torch.Tensor, cache) -> torch.Tensor:
    """ids [1, T] through `step`'s model, extending `cache` (its layers one per decoder layer, after any positions
    they hold) -> the last position's final norm output [1, H] (the head is the caller's: `step.head`).

    Shapes: x [T, H]; q [1, heads, T, D], k / v [1, KV, T, D]; the layer's keys / values after `update`
    [1, KV, S, D], S = past + T; the mask [T, S], key j seen by query i where j <= past + i (sdpa's causal
    rule where past is 0)."""
    T = int(ids.shape[1])
    past = int(cache.get_seq_length())
    positions = torch.arange(past, past + T, dtype=torch.long).unsqueeze(0)  # [1, T]
    x = step.embed(ids[0]).to(torch.float32)  # [T, H]
    cos, sin = step.rotary(x.unsqueeze(0), positions)  # [1, T, D] each
    cos, sin = cos.unsqueeze(1).to(torch.float32), sin.unsqueeze(1).to(torch.float32)  # [1, 1, T, D]
    # a cache holding nothing yet: sdpa's own causal rule (as transformers' sdpa path), else the offset mask
    seen = None if past == 0 else torch.arange(past + T).unsqueeze(0) <= (past + torch.arange(T)).unsqueeze(1)
    heads, kv_heads, D = step.heads, step.kv_heads, step.head_dim
    for layer, parts in zip(cache.layers, step.layers):
        h = rms_norm(x, parts.input_norm, step.eps)  # [T, H]
        q = parts.q(h).view(T, heads, D)
        k = parts.k(h).view(T, kv_heads, D)
        v = parts.v(h).view(T, kv_heads, D)
        if parts.q_norm is not None:  # Qwen3: each head normed before the rotation
            q, k = rms_norm(q, parts.q_norm, step.eps), rms_norm(k, parts.k_norm, step.eps)
        q = rotate(q.transpose(0, 1).unsqueeze(0), cos, sin)  # [1, heads, T, D]
        k = rotate(k.transpose(0, 1).unsqueeze(0), cos, sin)  # [1, KV, T, D]
        keys, values = layer.update(k, v.transpose(0, 1).unsqueeze(0).contiguous())  # [1, KV, S, D]
        attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=seen, is_causal=seen is None and T > 1,
                                                  scale=step.scale, enable_gqa=heads != kv_heads)  # [1, heads, T, D]
        x = x + parts.o(attended[0].transpose(0, 1).reshape(T, heads * D))
        h = rms_norm(x, parts.post_norm, step.eps)
        x = x + parts.down(F.silu(parts.gate(h)) * parts.up(h))
    return rms_norm(x[-1:], step.norm_weight, step.eps)  # [1, H]
