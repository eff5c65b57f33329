"""KV cache accounting: what the dashboard's KV panel shows, from the tensors and from the config.

The two must agree (a test checks): nbytes of the cache tensors == 2 * layers * kv_heads * head_dim * tokens *
bytes per element. They differ only for sliding-window layers, which cap their tokens.
"""

from __future__ import annotations

import torch

from .adapter import cache_nbytes, cache_tokens

__all__ = ["cache_nbytes", "cache_tokens", "kv_shape", "kv_bytes_per_token"]


def kv_shape(config) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a decoder config (text config for multimodal models)."""
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers, kv_heads, head_dim


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    layers, kv_heads, head_dim = kv_shape(config)
    return 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
