"""The one place that calls into the model and its KV cache.

transformers' forward/cache API moves between releases (the cache keyword became `cache` in 5.24 for every
family, `past_key_values` and the Mamba family's `cache_params` before; `Cache.crop` changed meaning in 5.15; cache
layers are classes since 5.0), so pyproject pins the range and every call goes through here (core/model/decode/
compiled.py's compiled step takes its keyword from here too): this file adapts to the installed version by reading
the forward's signature and the cache's layer classes, so the rest of the code never asks which version runs.

transformers is imported by the functions that need it, not by this module: a GGUF's later start decodes on a
cache of tokentui's own (core/model/decode/buffers.py's PlainCache) and imports no transformers unless something asks
for the model's forward; the functions that account for a cache read a PlainCache without it. The cache layers that
are transformers' classes are in core/model/decode/hf_layers.py.
"""

from __future__ import annotations

import inspect

import torch

from .buffers import GrowableBuffers, PlainCache

# The first allocation covers the prompt plus at most this many new tokens; past that the buffer doubles, so a huge
# --max-new-tokens does not reserve gigabytes for a run that stops at the first end token.
_FIRST_EXTRA_TOKENS = 4096


def new_cache(model, capacity: int | None = None):
    """An empty KV cache for `model`: `config_cache` of its config."""
    return config_cache(model.config, capacity)


def config_cache(config, capacity: int | None = None):
    """An empty KV cache (transformers' DynamicCache) shaped like the one `generate` makes for a model of `config`
    (sliding/hybrid layers from the config; a GGUF later start's StoredConfig through `transformers_config`).

    With `capacity` (the tokens a run may need: prompt + max new tokens), full-attention layers append into a
    preallocated buffer (hf_layers.py's GrowableLayer) instead of re-concatenating the whole cache each step;
    sliding-window and other special layers stay transformers' own.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    from .hf_layers import GrowableLayer

    cache = DynamicCache(config=transformers_config(config))
    if capacity is not None:
        first = int(capacity)
        cache.layers = [GrowableLayer(first) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def transformers_config(config):
    """`config` as transformers' own config class: itself, or for a GGUF later start's StoredConfig (core/model/load/
    stored_config.py) transformers' base config class made from its values (what transformers' cache classes and
    its rope functions read, methods included)."""
    from ..load.stored_config import StoredConfig

    if not isinstance(config, StoredConfig):
        return config
    from transformers.configuration_utils import PreTrainedConfig

    return PreTrainedConfig.from_dict(config.to_dict())


def new_static_cache(model, length: int):
    """transformers' StaticCache of `length` positions for `model` (--compile's, core/model/decode/compiled.py)."""
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=length)


def static_capacity(cache) -> int:
    """The positions a static cache holds at most: its attention layers' preallocated length (a hybrid model's
    recurrent layers, LFM2's conv ones, have none). `cache`: transformers' StaticCache."""
    return int(next(layer.max_cache_len for layer in cache.layers if getattr(layer, "max_cache_len", None)))


def drop_positions(cache, count: int) -> None:
    """Cut `count` positions off the end of `cache` (core/model/branch.py's crop). transformers' `Cache.crop(n)`
    took an absolute length for n >= 0 before 5.15 and refuses it since; a negative n ("remove |n| positions")
    means the same in every version, so that is the only form called here."""
    if count > 0:
        cache.crop(-count)


def first_capacity(prompt_tokens: int, max_new_tokens: int, max_context: int = 0) -> int:
    """Tokens to reserve up front: the whole run, but at most _FIRST_EXTRA_TOKENS past the prompt and never past
    the model's context."""
    wanted = prompt_tokens + min(max_new_tokens, _FIRST_EXTRA_TOKENS)
    return min(wanted, max_context) if max_context else wanted


_KEYWORDS: dict[type, str] = {}
# The forward's name for the cache, newest first: `cache` (transformers >= 5.24, every family; the older names still
# work there but warn a FutureWarning on every call, which must not reach the user's output), `past_key_values`
# (before), `cache_params` (the Mamba family before 5.24).
_CACHE_NAMES = ("cache", "past_key_values", "cache_params")


def cache_keyword(model) -> str:
    """The forward's keyword for the cache in the installed transformers (cached per model class), read off the
    forward's signature (transformers' deprecation wrapper keeps the new one's): the first of _CACHE_NAMES it takes;
    `past_key_values` for a forward that names none (it takes them through **kwargs). The class's forward is read,
    not the instance's: a wrapper put on one model (a hook taking *args, **kwargs) must not decide for its class;
    a subclass whose forward only passes **kwargs on is read through its bases' forwards."""
    kind = type(model)
    if kind not in _KEYWORDS:
        named = (name for klass in kind.__mro__ if "forward" in vars(klass)
                 for name in _CACHE_NAMES if name in inspect.signature(vars(klass)["forward"]).parameters)
        _KEYWORDS[kind] = next(named, "past_key_values")
    return _KEYWORDS[kind]


def state_only(model) -> bool:
    """Whether `model`'s cache holds only recurrent state, no positions (the Mamba family): every layer of the
    cache transformers builds for it is a linear-attention (conv / SSM state) layer without an attention part."""
    from transformers import DynamicCache
    from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin

    layers = DynamicCache(config=model.config).layers
    return bool(layers) and all(isinstance(layer, LinearAttentionCacheLayerMixin)
                                and not isinstance(layer, CacheLayerMixin) for layer in layers)


def call_model(model, input_ids: torch.Tensor, cache, **extra):
    """One forward of `input_ids` [1, T] extending `cache` (under the keyword the model takes), `logits_to_keep=1`
    so the LM head runs for the last position only. The positions fed are counted by the caller (core/model/decode/
    run_cache.py's RunCache: a cache of recurrent layers only, Mamba's, has no layer that counts them)."""
    return model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **{cache_keyword(model): cache}, **extra)


@torch.inference_mode()
def forward_last_logits(model, input_ids: torch.Tensor, cache) -> torch.Tensor:
    """Run the model over `input_ids` extending `cache`; return the last position's scores.

    input_ids: [1, T] int64 on the model's input device  ->  logits: [V] (model dtype)
    """
    return call_model(model, input_ids, cache).logits[0, -1]


@torch.inference_mode()
def forward_all_logits(model, input_ids: torch.Tensor, cache) -> torch.Tensor:
    """Run the model over `input_ids` extending `cache`; return every position's scores (a scored text's one
    forward, core/model/scoring.py). The caller counts the positions fed, as for `call_model`.

    input_ids: [1, T] int64 on the model's input device  ->  logits: [T, V] (model dtype)
    """
    out = model(input_ids=input_ids, use_cache=True, logits_to_keep=0, **{cache_keyword(model): cache})
    return out.logits[0]


@torch.inference_mode()
def forward_batch_logits(model, input_ids: torch.Tensor, cache) -> torch.Tensor:
    """One decode step of a batch (a fan-out's rows, core/model/fanout.py): each row's next token extending its row
    of `cache`; every row the same length, so no padding and no attention mask.

    input_ids: [N, 1] int64 on the model's input device  ->  logits: [N, V] (model dtype)
    """
    return call_model(model, input_ids, cache).logits[:, -1]


def _states(layer) -> list[torch.Tensor]:
    """A recurrent layer's fixed-size tensors (conv and SSM / recurrent states), as initialised so far."""
    out = []
    for name in ("conv_states", "recurrent_states"):
        for tensor in (getattr(layer, name, None) or {}).values():
            if isinstance(tensor, torch.Tensor):
                out.append(tensor)
    return out


def cache_layers(cache, tokens: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer that caches per position, as the tensors that hold the cached tokens; keys/values:
    [batch, kv_heads, tokens, head_dim] (MLA: the latent [batch, 1, tokens, rank] and the rotary key). For a static
    (preallocated, fixed-size) cache these are the used prefix of each buffer, `tokens` long (the count kept on the
    host: reading the static layers' own would wait for the device). Recurrent layers' fixed-size states are
    `cache_states`."""
    out = []
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor) or keys.dim() != 4:
            continue  # no K/V here (a recurrent or shared layer), or a dynamic layer before its first update
        if tokens is not None and getattr(layer, "is_compileable", False):
            keys, values = keys[..., :tokens, :], values[..., :tokens, :]
        out.append((keys, values))
    return out


def cache_states(cache) -> list[list[torch.Tensor]]:
    """Per layer, the fixed-size recurrent state tensors it holds (empty for an attention layer)."""
    return [_states(layer) for layer in cache.layers]


def cache_tokens(cache, fed: int = 0) -> int:
    """Positions the cache has seen: transformers' count off the first layer that tracks one, else (a cache of
    recurrent layers only) `fed`, the positions the caller fed through `call_model`. A PlainCache counts its own."""
    if isinstance(cache, PlainCache):
        return cache.get_seq_length()
    from transformers.cache_utils import CacheLayerMixin

    if any(isinstance(layer, CacheLayerMixin) for layer in cache.layers):
        return int(cache.get_seq_length())
    return int(fed)


def cache_nbytes(cache, tokens: int | None = None) -> int:
    """Bytes held for the cached tokens and any recurrent state, read off the tensors themselves (no formula);
    `tokens`: a static cache's positions in use (`cache_layers`)."""
    if all(isinstance(layer, GrowableBuffers) for layer in cache.layers):  # every step reads this: no views made
        return sum(layer.used_nbytes() for layer in cache.layers)
    kv = sum(k.nbytes + v.nbytes for k, v in cache_layers(cache, tokens))
    return kv + sum(t.nbytes for states in cache_states(cache) for t in states)


def cache_allocated_nbytes(cache) -> int:
    """Bytes reserved by the cache: >= cache_nbytes for preallocated caches (growable or static)."""
    total = sum(t.nbytes for states in cache_states(cache) for t in states)
    for layer in cache.layers:
        if not isinstance(getattr(layer, "keys", None), torch.Tensor):
            continue
        allocated = getattr(layer, "allocated_nbytes", None)
        total += allocated if allocated is not None else layer.keys.nbytes + layer.values.nbytes
    return total


def input_device(model) -> torch.device:
    """Where token IDs go: the embedding's device (differs from model.device under a multi-GPU device_map). A ggml
    embedding's (core/model/quant/ggml_linear.py) is its rows': its `weight` is a float32 copy made on demand."""
    embedding = model.get_input_embeddings()
    matrix = getattr(embedding, "matrix", None)
    return matrix.raw.device if matrix is not None else embedding.weight.device


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so a timer reads real time (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
