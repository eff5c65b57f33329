"""Eager decode with attention shapes that change once per bucket, not every step (`--kv-shapes`).

Why: with transformers' dynamic cache a decode step's attention reads exactly the positions cached so far, so every
step is a new attention shape. On a GPU that is what made the first eager run slow (issue 27's H200 profile: on
Hopper SDPA picks cuDNN, which builds an execution plan per new shape, and a first run pays for each one). Here a
step's attention reads the cache rounded up to the next multiple of BUCKET positions, with a mask over the tail, so
one shape serves BUCKET consecutive steps.

How (chosen over transformers' StaticCache, which --compile uses: core/model/decode/compiled.py): a StaticCache
attends over its whole preallocated length at every step, which for a long --max-new-tokens means every early step
pays for the whole run's attention, and it cannot be cut back for a branch. `BucketedLayer` is the engine's
growable full-attention layer (core/model/decode/hf_layers.py's GrowableLayer: append into a preallocated, doubling buffer)
that hands attention a view of the buffer padded to the bucket, and tells transformers' mask builder that length
(`get_mask_sizes`): the mask is the causal one over real positions (the padding is beyond the query's position,
so masked). `is_compileable = True` is what makes transformers build that mask for a one-token query instead of
relying on SDPA's `is_causal` over exactly the keys it is given (masking_utils, `allow_is_causal_skip`). The
class is in core/model/decode/hf_layers.py with GrowableLayer (both are transformers' layer classes). The
buffer starts zeroed, so the masked tail is finite (a masked NaN would still poison the weighted sum).

Prefill (more than one query) sees the exact length, as before: its shape is the prompt's anyway, and an explicit
mask would take SDPA off its causal fast path. The KV figures are unchanged: the layer's `keys` / `values` stay the
used prefix (what the KV panel and the step's `kv_bytes` count), `allocated_nbytes` the buffer.

Which caches: a model whose every layer is plain full attention (or MLA, which caches per position the same way).
Sliding-window, chunked and recurrent layers keep transformers' own cache: a sliding layer's mask follows its
window, and a recurrent state has one shape already. Such a model decodes with the dynamic cache, and its model
facts say why (`kv_cache`). Whether bucketing is the default on each device: `--kv-shapes auto` (BENCHMARKS.md,
"Bucketed KV shapes", has the measurement behind it).
"""

from __future__ import annotations

import torch

from .adapter import config_cache, state_only


def bucketing_problem(model) -> str | None:
    """Why `model`'s cache cannot take bucketed shapes (sliding, chunked, recurrent layers); None: it can."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    if state_only(model):
        return "this model keeps only a recurrent state (the Mamba family), which has one shape already"
    layers = DynamicCache(config=model.config).layers
    others = sorted({type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer})
    if not layers:
        return "its cache has no per-position layers"
    if others:
        return f"its cache has {', '.join(others)} layers, which keep transformers' own shapes"
    return None


def new_eager_cache(config, capacity: int, bucketed: bool):
    """The eager path's cache for a model of `config` (core/model/decode/adapter.py's `config_cache`, `capacity`
    positions reserved), its
    full-attention layers bucketed when `bucketed` (the caller has checked `bucketing_problem`). A 4-bit model's
    lean and native steps (core/model/decode/steps.py) decode only on unbucketed ones: they attend over exactly the
    keys the cache returns, so never over a padded bucket (core/model/decode/plan.py chooses accordingly)."""
    from .hf_layers import BucketedLayer, GrowableLayer

    cache = config_cache(config, capacity)  # (a model's config: its transformers' model need not exist)
    if bucketed:
        cache.layers = [BucketedLayer(capacity) if type(layer) is GrowableLayer else layer for layer in cache.layers]
    return cache


def kv_shapes_for(choice: str, device: torch.device) -> bool:
    """Whether `--kv-shapes choice` buckets on `device`: "auto" buckets on CUDA only (docs/design-record.md)."""
    if choice == "auto":
        return device.type == "cuda"
    return choice == "bucketed"


def describe(bucketed: bool, problem: str | None, choice: str, compiled: bool = False) -> str:
    """The model facts' `kv_cache` line: which cache eager decoding uses, and why when it is not the one asked
    (`compiled`: --compile's static cache decodes first; eager decoding serves the runs it does not cover)."""
    if compiled:
        return ("static (--compile): one buffer per 256 * 2^k bucket, attention over all of it; runs it does not "
                "cover decode eagerly, " + describe(bucketed, problem, choice))
    if bucketed:
        from .hf_layers import BUCKET

        return f"bucketed: attention over {BUCKET}-position buckets (the mask hides the unused tail)"
    if problem is not None and choice != "dynamic":
        return f"dynamic: exact length every step (not bucketed: {problem})"
    return "dynamic: exact length every step"
