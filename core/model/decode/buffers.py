"""A KV cache layer that appends into a preallocated buffer (`GrowableBuffers`), and the cache of a GGUF's later start
made of such layers alone (`PlainCache`), without transformers.

Why the buffers: transformers' DynamicLayer concatenates on every step, copying the whole layer cache each time:
O(tokens) per step and O(tokens^2) per run (at 2,000 tokens of SmolLM2 that is ~90 MB copied per step). Here a step
copies only the new token; the buffer doubles when full (amortised O(1)). `keys` / `values` are views of the used
prefix, so attention reads exactly what it reads with a DynamicLayer (same values, same shape; the numbers out of
the model are bit-identical, which tests/unit/test_fastpaths.py checks) and `nbytes` of those views is the bytes held
for the tokens used (`used_nbytes`: the same count without making the views). `allocated_nbytes` is the reserved
buffer. The native steps write the next row themselves (`room_for_one`, `count_one`). The views are made when read,
not when a row is counted: a native step counts a row in each of its layers every token, and making 2 views per
layer there was a measurable part of a CPU token (BENCHMARKS.md, "Around the kernels").

Why a cache of tokentui's own (`PlainCache`): a GGUF's later start runs the native ggml step on a cache whose every
layer is full attention (the step refuses any other: ggml_native.check_config), and transformers' cache classes
were the one part of such a run that still imported transformers (~0.4 s of a cold start: issue 37, BENCHMARKS.md,
"A later start without transformers"). What needs transformers' forward on that run (the lens, a fan-out) takes the
cache over as transformers' own first (core/model/decode/run_cache.py's `RunCache.for_forward`): the same buffers,
nothing copied. core/model/decode/hf_layers.py's GrowableLayer is these buffers as a transformers DynamicLayer.
"""

from __future__ import annotations

import torch

__all__ = ["GrowableBuffers", "PlainCache", "PlainLayer", "growable_layers"]


class GrowableBuffers:
    """A full-attention layer's keys and values [batch, kv_heads, positions, head_dim], appended into a buffer that
    doubles when full (the module docstring). A mixin: PlainLayer alone, GrowableLayer with transformers'
    DynamicLayer (hf_layers.py)."""

    zero_fill = False  # a new buffer starts zeroed (hf_layers.py's BucketedLayer reads past the end)
    exact_length = True  # attention reads exactly the cached positions (a native step may write the next row)

    def __init__(self, capacity: int = 0):
        super().__init__()
        self._keys0: torch.Tensor | None = None  # what `keys` reads before there are buffers
        self._values0: torch.Tensor | None = None
        self.is_initialized = False
        self.capacity = max(0, int(capacity))
        self._length = 0
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    @property
    def keys(self) -> torch.Tensor | None:
        """The cached positions' keys [batch, kv_heads, positions, head_dim]: a view of the buffer's used prefix."""
        return self._keys0 if self._kbuf is None else self._kbuf[..., : self._length, :]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:  # transformers' layer sets it in its __init__ and reset
        self._keys0 = value

    @property
    def values(self) -> torch.Tensor | None:
        """The cached positions' values, as `keys`."""
        return self._values0 if self._vbuf is None else self._vbuf[..., : self._length, :]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._values0 = value

    def used_nbytes(self) -> int:
        """`keys.nbytes + values.nbytes`, without making the views: the used rows of the two buffers."""
        if self._kbuf is None:
            return sum(t.nbytes for t in (self._keys0, self._values0) if t is not None)
        return self._length * (self._kbuf.nbytes // self._kbuf.shape[-2] + self._vbuf.nbytes // self._vbuf.shape[-2])

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._length = 0
        self._kbuf = self._vbuf = None
        self.keys = key_states[..., :0, :]
        self.values = value_states[..., :0, :]
        self.is_initialized = True

    def _reserve(self, needed: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        old = 0 if self._kbuf is None else self._kbuf.shape[-2]
        size = max(needed, self.capacity, 2 * old)
        new = "new_zeros" if self.zero_fill else "new_empty"
        kbuf = getattr(key_states, new)((*key_states.shape[:-2], size, key_states.shape[-1]))
        vbuf = getattr(value_states, new)((*value_states.shape[:-2], size, value_states.shape[-1]))
        if self._length:
            kbuf[..., : self._length, :].copy_(self._kbuf[..., : self._length, :])
            vbuf[..., : self._length, :].copy_(self._vbuf[..., : self._length, :])
        self._kbuf, self._vbuf = kbuf, vbuf

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self._length, self._length + key_states.shape[-2]
        if self._kbuf is None or end > self._kbuf.shape[-2]:
            self._reserve(end, key_states, value_states)
        self._kbuf[..., start:end, :].copy_(key_states)
        self._vbuf[..., start:end, :].copy_(value_states)
        self._length = end
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length

    @property
    def has_buffers(self) -> bool:
        return self._kbuf is not None

    def room_for_one(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole key and value buffers [1, KV, capacity, D], with room for one more position, for a step that
        writes row `get_seq_length()` itself (core/model/decode/compiled_lean.py); `count_one` then counts it.

        One row past it stays free as well: the compiled step's graph holds `position + 1 < capacity` as a guard
        (dynamo's, from the slices), so a buffer exactly full would make it compile again."""
        if self._length + 2 > self._kbuf.shape[-2]:
            self._reserve(self._length + 2, self._kbuf, self._vbuf)
        return self._kbuf, self._vbuf

    def count_one(self) -> None:
        """The row at `get_seq_length()` is written: the cache holds one more position."""
        self._length += 1

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove (transformers >= 5.15 semantics)")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self._length = max(0, self._length - abs(tokens_to_remove))

    def reset(self) -> None:
        self._length = 0
        self._kbuf = self._vbuf = None
        self.keys = self.values = None
        self.is_initialized = False

    def take_over(self, other: "GrowableBuffers") -> None:
        """Hold `other`'s buffers and positions from now on, and leave `other` empty (one owner: a plain cache's
        layer handed to transformers' cache, hf_layers.py)."""
        self.capacity, self._length, self._kbuf, self._vbuf = other.capacity, other._length, other._kbuf, other._vbuf
        self._keys0, self._values0, self.is_initialized = other._keys0, other._values0, other.is_initialized
        if other.is_initialized:
            self.dtype, self.device = other.dtype, other.device
        other.reset()

    @property
    def allocated_nbytes(self) -> int:
        return 0 if self._kbuf is None else self._kbuf.nbytes + self._vbuf.nbytes


class PlainLayer(GrowableBuffers):
    """A GrowableBuffers layer on its own (no transformers' class): a PlainCache's."""


class PlainCache:
    """A run's KV cache of full-attention layers only, each a PlainLayer: what the native ggml step and its prefill
    (core/model/native/ggml_prefill.py) read and write on a GGUF's later start. `layers`, `get_seq_length` and
    `crop` as transformers' cache has them, for the engine's accounting (core/model/decode/adapter.py) and a branch's
    crop."""

    def __init__(self, layers: int, capacity: int = 0):
        if layers < 1:
            raise ValueError(f"a plain cache has 1 or more layers, not {layers}")
        self.layers = [PlainLayer(capacity) for _ in range(int(layers))]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_seq_length()

    def crop(self, tokens_to_remove: int) -> None:
        for layer in self.layers:
            layer.crop(tokens_to_remove)

    def expanded(self, n: int, capacity: int) -> "PlainCache":
        """A copy at batch `n` (each row this cache's one), room for `capacity` positions a row; this one is left
        as it was."""
        out = PlainCache(len(self.layers), capacity)
        for source, fresh in zip(self.layers, out.layers):
            if source.is_initialized and source.get_seq_length():
                fresh.update(source.keys.expand(n, -1, -1, -1), source.values.expand(n, -1, -1, -1))
        return out


def growable_layers(cache) -> list[GrowableBuffers] | None:
    """`cache`'s layers when every one is a GrowableBuffers layer read at its exact length and holding buffers (after
    a prefill), for a step that writes the buffers itself (core/model/decode/compiled_lean.py, core/model/native/
    native_step.py, ggml_native.py); else None."""
    layers = cache.layers
    if not layers or not all(isinstance(layer, GrowableBuffers) and layer.exact_length and layer.has_buffers
                             for layer in layers):
        return None
    return layers
