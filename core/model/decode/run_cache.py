"""One run's KV cache as the engine holds it: the cache object (transformers', or a PlainCache of tokentui's own:
core/model/decode/buffers.py) and what tokentui knows about it.

Why a wrapper: what the engine needs to know about a run's cache besides its tensors — which decode step fills it
(core/model/decode/steps.py) and how many positions were fed (a cache of recurrent layers only, Mamba's, has no
layer that counts them; a static cache counts on the device, and reading that count would wait for the device) —
lives here, on an object of tokentui's, instead of as attributes set on transformers' object. transformers' cache
(`kv`) is what the model's forward extends and is read only through core/model/decode/adapter.py.
"""

from __future__ import annotations

from .adapter import cache_allocated_nbytes, cache_nbytes, cache_tokens
from .buffers import PlainCache

__all__ = ["RunCache"]


class RunCache:
    """A run's cache: `kv` (transformers' cache object, or a PlainCache until a forward asks for it: `for_forward`),
    `step` (the DecodeStep that prefills and extends it,
    core/model/decode/steps.py, which imports this module: so not annotated here) and `fed` (the positions fed
    through it so far: prompt chunks, decoded tokens; cut back by a crop). `static`: `kv` is preallocated whole and
    its positions are counted here only (--compile's static cache)."""

    __slots__ = ("kv", "step", "fed", "static")

    def __init__(self, kv, step, static: bool = False, fed: int = 0):
        if fed < 0:
            raise ValueError(f"a cache holds 0 or more positions, not {fed}")
        self.kv = kv
        self.step = step
        self.static = static
        self.fed = int(fed)

    def for_forward(self, model):
        """`kv` as `model`'s forward extends it: transformers' cache. A PlainCache (a GGUF later start's native ggml
        step's, core/model/decode/buffers.py) is taken over by transformers' cache for `model`'s config first, its
        buffers and positions moved, nothing copied; `kv` is that cache from then on."""
        if isinstance(self.kv, PlainCache):
            from .hf_layers import as_transformers

            self.kv = as_transformers(self.kv, model.config)
        return self.kv

    def tokens(self) -> int:
        """Positions the cache holds: transformers' count where a layer keeps one (what the tensors hold), else
        (a static cache, a cache of recurrent layers only) the positions fed."""
        return self.fed if self.static else cache_tokens(self.kv, self.fed)

    def nbytes(self) -> int:
        """Bytes held for the cached positions and any recurrent state, read off the tensors themselves."""
        return cache_nbytes(self.kv, self.fed if self.static else None)

    def allocated_nbytes(self) -> int:
        """Bytes the cache has reserved (>= nbytes for a preallocated cache)."""
        return cache_allocated_nbytes(self.kv)

    def __repr__(self) -> str:
        return f"RunCache({type(self.kv).__name__}, {self.step.name!r}, fed={self.fed})"
