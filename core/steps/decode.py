"""Step 5 — decode: only the newest token goes through the model; every layer reads the KV cache (one key and
value per earlier position) and appends its own. Each decode run rereads all the weights, which bounds its speed.
"""

from __future__ import annotations

import time

import torch

from ..model.decode.adapter import forward_last_logits, input_device, synchronize
from ..model.observe.lens import forward_last_states


def decode_one_token(model, token_id: int, cache, states_out: list | None = None, sync: bool = True
                     ) -> tuple[torch.Tensor, float]:
    """token_id -> (logits [V] for the next token, milliseconds incl. device sync). Extends `cache` by one.

    The timed span ends with a device sync on GPUs, so `forward_ms` is real; selection syncs right after anyway
    (it has to read the chosen token). `sync=False` leaves the forward queued on the device (the milliseconds are
    then only the host's time to queue it): the engine does so when CUDA events time the step (core/model/observe/timing.py).
    `states_out`: when a list, the forward also catches each decoder block's output at this position and appends
    them, [L, H], for the logit lens (core/model/observe/lens.py; eager only). None: the forward is exactly the plain one.
    """
    decoder = getattr(cache, "decoder", None)  # a compiled fast path's static cache (core/model/decode/compiled.py)
    if decoder is not None and states_out is not None:
        raise ValueError("the compiled decode step returns no hidden states (the logit lens is eager only)")
    lean = getattr(cache, "lean_step", None) if states_out is None else None  # core/model/decode/lean_step.py
    start = time.perf_counter()
    if decoder is not None:
        logits = decoder.step(token_id, cache)  # [V]
    elif lean is not None:  # the same scores as the model's forward, with fewer host operations
        logits = lean.step(token_id, cache)  # [V]
    else:
        # torch.full, not torch.tensor: filling on the device needs no host-to-device copy (a sync on CUDA).
        ids = torch.full((1, 1), token_id, dtype=torch.long, device=input_device(model))  # [1, 1]
        if states_out is None:
            logits = forward_last_logits(model, ids, cache)  # [V]
        else:
            logits, states = forward_last_states(model, ids, cache)  # [V], [L, H]
            states_out.append(states)
    if sync:
        synchronize(logits.device)
    return logits, (time.perf_counter() - start) * 1000.0
