"""Step 3 — prefill: one forward pass over the whole prompt fills the KV cache and scores the first answer token.

Its duration is the time to first token: long prompts wait here, since every prompt position passes all layers.
Prefill is always eager (also under --compile: one call per run, with a different length each time); a static
cache from core/compiled.py is filled by its decoder, which keeps the token count on the host.
"""

from __future__ import annotations

import time

import torch

from .adapter import forward_last_logits, input_device, synchronize


def prefill(model, prompt_ids: list[int], cache) -> tuple[torch.Tensor, float]:
    """prompt_ids: T ints -> (logits [V] for the first answer token, milliseconds incl. device sync)."""
    device = input_device(model)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # [1, T]
    decoder = getattr(cache, "decoder", None)  # a compiled fast path's static cache
    synchronize(device)
    start = time.perf_counter()
    logits = decoder.prefill(ids, cache) if decoder is not None else forward_last_logits(model, ids, cache)  # [V]
    synchronize(logits.device)
    return logits, (time.perf_counter() - start) * 1000.0
