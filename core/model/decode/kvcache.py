"""KV cache accounting: what the dashboard's KV panel shows, from the tensors and from the model's layer kinds.

The two must agree (tests/unit/test_architecture_matrix.py checks it per architecture): the nbytes of the cache's
tensors == core/runs/architecture.py's `kv_bytes_at(groups, tokens, bytes per value)`, where the groups say what
each layer holds (full attention: 2 × kv_heads × head_dim per position; a sliding window caps its positions; MLA
holds the latent and the rotary key; a recurrent layer a fixed-size state). `kv_bytes_per_token` is the growth per
position while no window is full.
"""

from __future__ import annotations

import torch

from ...runs.architecture import kv_bytes_at, kv_bytes_per_token as _bytes_per_token
from .adapter import cache_nbytes, cache_tokens
from ..architecture import kv_groups

__all__ = ["cache_nbytes", "cache_tokens", "kv_bytes_at", "kv_bytes_per_token", "kv_groups", "kv_mismatch"]


def kv_bytes_per_token(model, dtype: torch.dtype) -> int:
    """Bytes one more cached position adds to `model`'s cache in `dtype` (while no sliding window is full)."""
    return _bytes_per_token(kv_groups(model), torch.empty((), dtype=dtype).element_size())


def kv_mismatch(facts, tokens: int, measured: int) -> str | None:
    """None when the model's layer kinds (`facts.kv_groups`) predict the `measured` nbytes of a cache holding
    `tokens` positions (or cannot predict them), else what the engine says once, after prefill: an architecture
    whose cache holds something tokentui's reading of it does not know."""
    groups = getattr(facts, "kv_groups", None)
    if not groups or not facts.kv_bytes_per_value:
        return None
    predicted = kv_bytes_at(groups, tokens, facts.kv_bytes_per_value)
    if predicted is None or predicted == measured:
        return None
    return (f"the KV cache holds {measured:,} bytes for {tokens:,} positions where this model's layer kinds give "
            f"{predicted:,}: its per-token figure and formula are not exact for this architecture (the sizes shown "
            "are the tensors' own)")
