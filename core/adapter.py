"""The one place that calls into the model and its KV cache.

transformers' forward/cache API moves between releases (the cache keyword was renamed in 5.24, `Cache.crop`
changed meaning in 5.15), so pyproject pins the range and every call goes through here: when the pin moves,
only this file changes.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache(model) -> DynamicCache:
    """An empty dynamic KV cache shaped like the one `generate` makes (sliding/hybrid layers from the config)."""
    return DynamicCache(config=model.config)


@torch.inference_mode()
def forward_last_logits(model, input_ids: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    """Run the model over `input_ids` extending `cache`; return the last position's scores.

    input_ids: [1, T] int64 on the model's input device  ->  logits: [V] (model dtype)
    `logits_to_keep=1` skips the LM head for all positions but the last (the only one that is read).
    """
    out = model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1]


def cache_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer; keys/values: [batch, kv_heads, tokens, head_dim]."""
    return [(layer.keys, layer.values) for layer in cache.layers if getattr(layer, "keys", None) is not None]


def cache_tokens(cache) -> int:
    return int(cache.get_seq_length())


def cache_nbytes(cache) -> int:
    """Bytes actually held by the cache tensors (the instrument's number: no formula, the tensors themselves)."""
    return sum(k.nbytes + v.nbytes for k, v in cache_layers(cache))


def input_device(model) -> torch.device:
    """Where token IDs go: the embedding's device (differs from model.device under a multi-GPU device_map)."""
    return model.get_input_embeddings().weight.device


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so a timer reads real time (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
