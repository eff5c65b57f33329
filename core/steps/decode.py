"""Step 5 — decode: only the newest token goes through the model; every layer reads the KV cache (one key and
value per earlier position) and appends its own. Each decode run rereads all the weights, which bounds its speed.
"""

from __future__ import annotations

import time

import torch

from ..model.decode.adapter import synchronize


def decode_one_token(token_id: int, cache, states_out: list | None = None, sync: bool = True
                     ) -> tuple[torch.Tensor, float]:
    """token_id -> (logits [V] for the next token, milliseconds incl. device sync). Extends `cache` (the run's
    RunCache, core/model/decode/run_cache.py) by one, through the decode step that cache was made for (the engine's
    plan: core/model/decode/plan.py).

    The timed span ends with a device sync on GPUs, so `forward_ms` is real; selection syncs right after anyway
    (it has to read the chosen token). `sync=False` leaves the forward queued on the device (the milliseconds are
    then only the host's time to queue it): the engine does so when CUDA events time the step (core/model/observe/timing.py).
    `states_out`: when a list, the forward also catches each decoder block's output at this position and appends
    them, [L, H], for the logit lens (core/model/observe/lens.py; through transformers' forward, which every step
    but the compiled whole one can switch to at any token). None: the step is exactly the plain one.
    """
    start = time.perf_counter()
    logits = cache.step.step(cache, token_id, states_out)  # [V]
    if sync:
        synchronize(logits.device)
    return logits, (time.perf_counter() - start) * 1000.0
