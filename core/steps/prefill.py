"""Step 3 — prefill: the prompt goes through the model, filling the KV cache and scoring the first answer token.

Its duration is the time to first token: long prompts wait here, since every prompt position passes all layers.
A prompt longer than one chunk (`PREFILL_CHUNK` tokens) is prefilled chunk by chunk, each chunk attending to the
cache the earlier ones filled — the same keys, values and first-token scores as one pass, up to float rounding —
so the engine can report progress (and honour stop) between chunks instead of going silent for a minute on a
long prompt. A prompt of one chunk or less is one pass, exactly as before.

Prefill is always eager (also under --compile: one call per run, with a different length each time); a static
cache from core/model/compiled.py is filled by its decoder, chunk by chunk too (its layers count the tokens written, so
each chunk lands after the previous one), which keeps the token count on the host.
"""

from __future__ import annotations

import time
from typing import Iterator

import torch

from ..model.adapter import forward_last_logits, input_device, synchronize
from ..model.lens import forward_last_states
from ..settings import PREFILL_CHUNK  # the default of RunOptions.prefill_chunk (tests lower it)


def prefill_chunks(model, prompt_ids: list[int], cache, chunk: int = PREFILL_CHUNK, states_out: list | None = None
                   ) -> Iterator[tuple[int, torch.Tensor | None, float]]:
    """Prefill `prompt_ids` (T ints) into `cache`, one chunk of at most `chunk` tokens per forward.

    Yields (prompt tokens in the cache so far, logits [V] for the first answer token on the last chunk else None,
    milliseconds of prefill so far incl. device sync: since prefill began, less any time the caller kept this
    generator suspended between chunks). A caller may stop iterating between chunks; the cache
    then holds the chunks done.
    `states_out`: when a list, the last chunk's forward also catches each decoder block's output at the last prompt
    position and appends them, [L, H], for the logit lens (core/model/lens.py; eager only, earlier chunks unchanged).
    """
    if chunk < 1:
        raise ValueError(f"prefill chunk must be >= 1 token, got {chunk}")
    device = input_device(model)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # [1, T]
    total = ids.shape[1]
    decoder = getattr(cache, "decoder", None)  # a compiled fast path's static cache
    if decoder is not None and states_out is not None:
        raise ValueError("a compiled run's prefill returns no hidden states (the logit lens is eager only)")
    synchronize(device)
    spent = 0.0  # seconds in the model, not counting time the caller held this generator suspended
    done = 0
    while done < total:
        start = time.perf_counter()
        part = ids[:, done:done + chunk]  # [1, <= chunk]
        if decoder is not None:
            logits = decoder.prefill(part, cache, first=(done == 0))
        elif states_out is not None and done + part.shape[1] == total:
            logits, states = forward_last_states(model, part, cache)  # [V], [L, H]
            states_out.append(states)
        else:
            logits = forward_last_logits(model, part, cache)  # [V]
        done += part.shape[1]
        synchronize(logits.device)
        spent += time.perf_counter() - start
        yield done, (logits if done == total else None), spent * 1000.0


def prefill(model, prompt_ids: list[int], cache, chunk: int = PREFILL_CHUNK) -> tuple[torch.Tensor, float]:
    """prompt_ids: T ints -> (logits [V] for the first answer token, milliseconds incl. device sync)."""
    logits, ms = None, 0.0
    for _, logits, ms in prefill_chunks(model, prompt_ids, cache, chunk):
        pass
    return logits, ms
