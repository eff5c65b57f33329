"""Step 5 — decode: only the newest token goes through the model; every layer reads the KV cache (one key and
value per earlier position) and appends its own. Each decode run rereads all the weights, which bounds its speed.
"""

from __future__ import annotations

import time

import torch

from .adapter import forward_last_logits, input_device, synchronize


def decode_one_token(model, token_id: int, cache) -> tuple[torch.Tensor, float]:
    """token_id -> (logits [V] for the next token, milliseconds incl. device sync). Extends `cache` by one."""
    device = input_device(model)
    ids = torch.tensor([[token_id]], dtype=torch.long, device=device)  # [1, 1]
    start = time.perf_counter()
    logits = forward_last_logits(model, ids, cache)  # [V]
    synchronize(logits.device)
    return logits, (time.perf_counter() - start) * 1000.0
