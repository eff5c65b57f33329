"""Where the step's new token looks, on the native decode step (issue 39): its attention weights from the queries the
step wrote and the keys it reads, without transformers' forward.

Why: the native step (core/model/native/decode_step.cpp) is one C++ call with no attention module for
core/model/observe/attention.py's wrapper to read; sending the step through the torch forward instead costs more than
the step itself (BENCHMARKS.md, issue 39). Asked for (`native_step.queries_into`), the step copies each layer's query
heads after the rotation into a buffer [L, heads, D]; the keys of every position up to the query's, its own
included, are in the cache's buffers already. The weights are then what the step's own attention computes and
transformers' eager attention writes: softmax(scale q·kᵀ) per query head over its key head (grouped-query: head h
reads key head h // (heads / kv_heads), as transformers' repeat_kv lays them out), `scale` the layers' `scaling`.
The native step serves only Llama / Qwen2 / Qwen3 layers of full attention on a growable cache (sliding layers keep
transformers' cache and the eager lean step): no window, soft-cap or sink to apply, every position 0..query visible.

`NativeAttention` is the capture `Inside` gives a run on the native step (Inside makes the QueryCatch, enters
`queries_into` around each forward and clears the catch once a step's views are taken): it also keeps attention.py's
capture active, for the forwards that still go through transformers' modules (the prefill, a step the logit lens
sends through the forward), and a step reads whichever caught it.
"""

from __future__ import annotations

import torch

from ...runs.attention import LayerAttention
from ..native.native_step import QueryCatch
from .attention import AttentionCapture, ranked_positions
from .native_capture import BesideForward

__all__ = ["NativeAttention", "native_weights"]


def native_weights(catch: QueryCatch) -> torch.Tensor:
    """The weights of the step `catch` caught: [L, heads, position + 1] float32, softmax(scale q·kᵀ) per layer and
    query head over the keys of positions 0..position (the cache's layers' `keys` [1, KV, position + 1, D])."""
    queries = catch.queries  # [L, H, D]
    layers, heads, dim = queries.shape
    kv = catch.kv_heads
    length = catch.position + 1
    scores = torch.empty(layers, kv, heads // kv, length)  # [L, KV, group, T]
    grouped = queries.view(layers, kv, heads // kv, dim)
    for n, layer in enumerate(catch.layers):  # each layer's keys are a buffer of their own: no copy into one stack
        keys = layer.keys[0]  # [KV, T, D]
        if keys.shape[-2] != length:
            raise ValueError(f"layer {n + 1}'s cache holds {keys.shape[-2]} positions, not {length}")
        torch.matmul(grouped[n], keys.transpose(-1, -2), out=scores[n])
    # as eager attention: the product, times the scale, softmax in float32
    return torch.softmax(scores.mul_(catch.scale).view(layers, heads, length), dim=-1)


class NativeAttention(BesideForward):
    """AttentionCapture's interface (`with`, `caught`, `take(query)`, `failure`) for a run on the native step: a
    step's weights from the queries it wrote (`native_weights`), a forward's through transformers' modules from
    attention.py's capture, kept active beside it."""

    def __init__(self, model, catch: QueryCatch, top: int, heads: bool):
        super().__init__(catch, AttentionCapture(model, top, heads))
        self.top, self.heads = top, heads

    @property
    def failure(self) -> str | None:
        return self.forward.failure

    def take(self, query: int) -> list[LayerAttention]:
        """The rows of the step caught last (layer order), its query at position `query`; clears what the forward's
        capture caught (the catch is Inside's to clear)."""
        if self.catch.position is None:
            return self.forward.take(query)
        self.forward.take(query)  # (nothing went through the forward: nothing to keep)
        if self.catch.position != query:
            raise ValueError(f"the native step's query sat at {self.catch.position}, not {query}")
        weights = native_weights(self.catch)  # [L, H, T]
        layers, heads, length = weights.shape
        mean = weights.mean(dim=1, keepdim=True)  # [L, 1, T]
        rows = torch.cat([mean, weights], dim=1) if self.heads else mean  # [L, R, T]
        per_layer = rows.shape[1]
        ranked = ranked_positions(rows.reshape(-1, length), 0, self.top)  # one top-k for every layer and head
        return [LayerAttention(layer=n + 1, query=query, window=None, top=ranked[n * per_layer],
                               heads=tuple(ranked[n * per_layer + 1: (n + 1) * per_layer]) if self.heads else None)
                for n in range(layers)]
