"""Where the step's new token looks: each attention layer's weights for the last query of a forward (issue 39).

How: transformers' attention modules look their attention function up by name at every call
(`ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention_forward)`), and pass it the
query and the keys exactly as the layer uses them: RoPE applied, the KV cache's keys of every earlier position
(after the cache's update, so the new position's own key too), the mask, the scaling, the soft-cap (Gemma 2), the
sinks (GPT-OSS). While `AttentionCapture` is active, that name is served by a wrapper that runs the original function
unchanged (the forward's numbers are the same), then calls the model family's own `eager_attention_forward` on the
last query row alone, with the same keys and kwargs, and keeps the weights it returns: the same numbers as the
model's eager `output_attentions=True` (tests/unit/test_attention.py checks it, family by family), at the cost of one
[heads, 1, K] product and softmax per layer. Why not the compute path's own weights: sdpa and the native steps
never materialise them, and a hand-written softmax(q·k) would miss each family's extras (caps, sinks, masks).

Only for a forward through transformers' modules: the engine sends a step that wants attention through the torch
forward, as it does for the logit lens (core/model/decode/steps.py), so the native, lean and ggml steps stay as they
are when the view is off. Under --compile's whole step there is no such forward: not available, said once.

Positions: the keys a layer is given end at the query's position (a dynamic or sliding cache holds the latest
ones); a bucketed cache (core/model/decode/static_cache.py) gives a padded buffer from position 0, whose slots past
the query are masked (weight 0). Sliding layers are never bucketed, so those are the two cases.
"""

from __future__ import annotations

import sys
import threading
import weakref
from dataclasses import dataclass

import torch

from ...runs.attention import LayerAttention, visible_from
from ..architecture import decoder_config, model_parts
from ..decode.adapter import state_only

__all__ = ["AttentionCapture", "attention_unavailable", "has_state_only", "ranked_positions"]

_SUPPORTED = ("eager", "sdpa")  # attention implementations whose masks are plain tensors


_STATE_ONLY: "weakref.WeakKeyDictionary[object, bool]" = weakref.WeakKeyDictionary()


def has_state_only(model) -> bool:
    """adapter.state_only(model), found once per model: it builds a cache to read its layers' kinds, and the views
    ask before every forward while they are on (a model's layer kinds do not change)."""
    found = _STATE_ONLY.get(model)
    if found is None:
        found = _STATE_ONLY[model] = state_only(model)
    return found


def attention_unavailable(model) -> str | None:
    """Why the attention of `model`'s tokens cannot be shown (one line), None when it can."""
    if has_state_only(model):
        return "this model has no attention layers (a state-space model: each layer keeps a recurrent state)"
    parts = model_parts(model)
    if isinstance(parts, str):
        return f"the attention view needs the decoder blocks, and {parts}"
    impl = getattr(decoder_config(model), "_attn_implementation", None)
    if impl not in _SUPPORTED:
        return f"the attention view reads eager or sdpa attention, and this model runs {impl!r}"
    return None


@dataclass
class _Caught:
    weights: torch.Tensor  # [heads, K] float32: the last query row of each head
    keys: int  # K
    window: int | None  # the sliding window the layer passed its attention function (None: none passed)


# The wrapper installed under an implementation's name while at least one capture is active (refcounted), and the
# active captures' layers: id(attention module) -> (capture, layer number 1..L).
_LOCK = threading.Lock()
_ACTIVE: dict[int, tuple["AttentionCapture", int]] = {}


@dataclass
class _Installed:
    users: int  # active captures using the wrapper
    original: object  # what the mapping served under the name before (None for "eager": the family's own)
    had_local: bool  # whether that was a local override (put back on uninstall), not the library's entry


_INSTALLED: dict[str, _Installed] = {}


def _family_eager(module):
    """The model family's own eager attention function (its module's `eager_attention_forward`), or None."""
    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)


def _wrapper(name: str):
    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        installed = _INSTALLED.get(name)
        original = installed.original if installed is not None and installed.original is not None else None
        original = original or _family_eager(module)  # "eager" is not in the mapping: the family's own function
        out = original(module, query, key, value, attention_mask, *args, **kwargs)
        found = _ACTIVE.get(id(module))
        if found is not None:
            found[0]._catch(found[1], module, query, key, value, attention_mask, args, kwargs)
        return out

    return attention


def _functions():
    """transformers' attention registry, imported when a capture is first installed: its module (modeling_utils)
    takes over a second to import, which a run that never shows attention should not pay for at its start."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS


def _install(name: str) -> None:
    # transformers' GeneralInterface keeps an instance's overrides in `_local_mapping` over the library's entries:
    # read here only to put an earlier override back as it was
    registry = _functions()
    with _LOCK:
        installed = _INSTALLED.get(name)
        if installed is None:
            local = registry._local_mapping
            installed = _INSTALLED[name] = _Installed(0, registry.get(name), name in local)
            registry[name] = _wrapper(name)
        installed.users += 1


def _uninstall(name: str) -> None:
    registry = _functions()
    with _LOCK:
        installed = _INSTALLED[name]
        installed.users -= 1
        if installed.users:
            return
        del _INSTALLED[name]
        if installed.had_local:
            registry[name] = installed.original
        else:
            del registry[name]  # the local override only: the library's entry shows again


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The mask's last query row as eager attention takes it (added to the scores): a boolean mask (sdpa's, True:
    attend) becomes 0 / the dtype's minimum, as transformers' eager masks are built."""
    if mask is None or not isinstance(mask, torch.Tensor):
        return None
    row = mask[..., -1:, :]
    if row.dtype == torch.bool:
        return torch.zeros(row.shape, dtype=dtype, device=row.device).masked_fill(~row, torch.finfo(dtype).min)
    return row


class AttentionCapture:
    """While active (`with capture:`), each attention layer of `model` keeps the weights of the last query of every
    forward (a later forward replaces them: a chunked prefill's last chunk stays). `take(query)` turns them into
    LayerAttention rows: the top `top` positions by head-mean weight, and per head when `heads`."""

    def __init__(self, model, top: int, heads: bool):
        self.model, self.top, self.heads = model, top, heads
        parts = model_parts(model)
        self._layers = {id(m): n for n, block in enumerate(parts.layers, 1) for m in block.modules()}
        self._impl = getattr(decoder_config(model), "_attn_implementation", None) or "eager"
        self._caught: dict[int, _Caught] = {}
        self.failure: str | None = None  # a layer whose eager function could not be found: why

    def __enter__(self) -> "AttentionCapture":
        _install(self._impl)
        with _LOCK:
            for key, layer in self._layers.items():
                _ACTIVE[key] = (self, layer)
        return self

    def __exit__(self, *exc) -> None:
        with _LOCK:
            for key in self._layers:
                if _ACTIVE.get(key, (None,))[0] is self:
                    del _ACTIVE[key]
        _uninstall(self._impl)

    def _catch(self, layer: int, module, query, key, value, mask, args, kwargs) -> None:
        eager = _family_eager(module)
        if eager is None:
            self.failure = f"{type(module).__name__} has no eager attention function to read its weights from"
            return
        extra = dict(kwargs)
        extra["dropout"] = 0.0
        with torch.no_grad():
            _, weights = eager(module, query[:, :, -1:], key, value, _additive(mask, query.dtype), *args, **extra)
        window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
        self._caught[layer] = _Caught(weights[0, :, -1].float(), int(key.shape[-2]),  # [heads, K]
                                      int(window) if isinstance(window, int) and window > 0 else None)

    @property
    def caught(self) -> bool:
        return bool(self._caught)

    def take(self, query: int) -> list[LayerAttention]:
        """The caught forward's rows (layer order), its query at position `query`; clears what was caught."""
        caught, self._caught = self._caught, {}
        rows = []
        for layer in sorted(caught):
            got = caught[layer]
            weights = got.weights  # [H, K]
            keys = got.keys
            # key slot j -> position: the keys end at the query, or (a padded bucket) start at 0
            start = query - keys + 1 if keys <= query + 1 else 0
            if keys > query + 1:
                weights = weights[:, : query + 1]
            window = got.window or _window(self.model, layer, query)
            seen = torch.nonzero(weights.amax(dim=0)).flatten()  # positions with a weight: what the mask let in
            if window is not None and seen.numel() and int(seen[0]) + start < visible_from(query, window):
                window = None  # the mask let in more than the window says: what the weights show stands
            # (masked positions have a weight of exactly 0, and `ranked_positions` lists none)
            ranked = ranked_positions(torch.cat([weights.mean(dim=0, keepdim=True), weights]) if self.heads
                          else weights.mean(dim=0, keepdim=True), start, self.top)
            rows.append(LayerAttention(layer=layer, query=query, window=window, top=ranked[0],
                                       heads=tuple(ranked[1:]) if self.heads else None))
        return rows


def ranked_positions(weights: torch.Tensor, start: int, k: int) -> list[tuple[tuple[int, float], ...]]:
    """weights [R, K] over positions start.. -> per row the top k (position, weight), highest first, zero weights
    left out (masked positions). One device-to-host copy for all rows."""
    values, index = torch.topk(weights, min(k, weights.shape[1]), dim=-1)  # [R, k]
    packed = torch.stack([(index + start).to(torch.float64), values.to(torch.float64)]).tolist()  # [2, R, k]
    return [tuple((int(p), w) for p, w in zip(positions, row) if w > 0.0) for positions, row in zip(*packed)]


def _window(model, layer: int, query: int) -> int | None:
    """Where the layer passed no sliding window of its own: the positions layer `layer` (1..L) sees from `query`,
    its own included, as the config says: a chunked layer's place in its chunk + 1, a sliding layer's window;
    None for full attention."""
    cfg = decoder_config(model)
    types = getattr(cfg, "layer_types", None)
    kind = types[layer - 1] if types and layer - 1 < len(types) else None
    sliding = getattr(cfg, "sliding_window", None)
    chunk = getattr(cfg, "attention_chunk_size", None)
    if kind == "chunked_attention" and chunk:
        return query % chunk + 1
    if kind == "sliding_attention" and sliding:
        return int(sliding)
    return None
