"""The engine's KV cache layers as transformers' own classes: `GrowableLayer` (core/model/decode/buffers.py's buffers as
a DynamicLayer: what the model's forward extends) and `BucketedLayer` (its attention shapes rounded up to buckets,
`--kv-shapes`: core/model/decode/static_cache.py says why and how), and `as_transformers`, which turns a GGUF later
start's PlainCache into transformers' cache holding the same buffers.

Kept apart from core/model/decode/adapter.py because subclassing DynamicLayer imports transformers, which a GGUF's
later start does without until something asks for the model's forward (buffers.py's docstring); this module is
imported only where such a cache is made.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .buffers import GrowableBuffers, PlainCache

__all__ = ["BUCKET", "BucketedLayer", "GrowableLayer", "as_transformers"]

BUCKET = 256  # positions per attention shape (static_cache.py)


class GrowableLayer(GrowableBuffers, DynamicLayer):
    """A full-attention cache layer that appends into a preallocated buffer instead of `torch.cat` (buffers.py)."""

    def reset(self) -> None:
        GrowableBuffers.reset(self)
        DynamicLayer.reset(self)

    def _unsupported(self, *args, **kwargs):
        raise NotImplementedError("GrowableLayer serves one sequence (batch 1, no beam search, no offloading)")

    batch_repeat_interleave = batch_select_indices = reorder_cache = offload = prefetch = _unsupported


def _round_up(tokens: int) -> int:
    return -(-max(1, tokens) // BUCKET) * BUCKET


class BucketedLayer(GrowableLayer):
    """A GrowableLayer whose one-token updates return keys and values padded to a multiple of BUCKET positions."""

    is_compileable = True  # transformers then builds the causal mask for a one-token query (static_cache.py)
    zero_fill = True
    exact_length = False  # attention reads the padded bucket: no step writes its rows itself

    def __init__(self, capacity: int = 0):
        super().__init__(_round_up(capacity) if capacity else 0)

    def _reserve(self, needed: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super()._reserve(_round_up(needed), key_states, value_states)

    def padded_length(self, tokens: int) -> int:
        """The attention length for a cache holding `tokens` positions: the next multiple of BUCKET."""
        return _round_up(tokens)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        end = self._length + query_length
        return (self.padded_length(end) if query_length == 1 else end), 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        if key_states.shape[-2] != 1:
            return keys, values
        n = self.padded_length(self._length)  # <= the buffer: _reserve rounds it up to a bucket
        return self._kbuf[..., :n, :], self._vbuf[..., :n, :]


def as_transformers(plain: PlainCache, config) -> DynamicCache:
    """transformers' cache for a model of `config` (transformers' config) holding `plain`'s buffers and positions,
    nothing copied; `plain` is left empty (its buffers have one owner). ValueError where transformers' cache for
    `config` is not one full-attention layer per plain layer (a config the plain cache was not made for)."""
    cache = DynamicCache(config=config)
    if len(cache.layers) != len(plain.layers) or any(type(layer) is not DynamicLayer for layer in cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise ValueError(f"transformers' cache for this config has {len(cache.layers)} layers ({', '.join(kinds)}), "
                         f"not the {len(plain.layers)} full-attention layers of the run's cache")
    layers = []
    for source in plain.layers:
        layer = GrowableLayer()
        layer.take_over(source)
        layers.append(layer)
    cache.layers = layers
    return cache
