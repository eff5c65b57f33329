"""Step 3 — prefill: the prompt goes through the model, filling the KV cache and scoring the first answer token.

Its duration is the time to first token: long prompts wait here, since every prompt position passes all layers.
A prompt longer than one chunk (`PREFILL_CHUNK` tokens) is prefilled chunk by chunk, each chunk attending to the
cache the earlier ones filled — the same keys, values and first-token scores as one pass, up to float rounding —
so the engine can report progress (and honour stop) between chunks instead of going silent for a minute on a
long prompt. A prompt of one chunk or less is one pass, exactly as before.

Each chunk goes through the decode step the run's cache was made for (core/model/decode/steps.py: `prefill`).
Prefill is always eager (also under --compile: one call per run, with a different length each time); a static
cache from core/model/decode/compiled.py is filled by its decoder, chunk by chunk too (its layers count the tokens
written, so each chunk lands after the previous one), and the run's cache keeps the token count on the host.

Mamba-1's mixers in transformers (Mamba, FalconMamba, and the Mamba layers of Jamba and Zamba) cannot continue a
multi-token forward from a state: their conv takes the cached tail, but their selective scan starts from zeros (the
torch scan, like the mamba_ssm kernel, has no initial state) and then overwrites the cached SSM state with its own.
So a second chunk would forget the first; after the first chunk those models take their prompt one token at a time
(the decode path, which does read the state) — see `continues_chunks`, which the eager step (core/model/decode/
steps.py's TorchForward) asks. That keeps what chunking is for — progress and stop between chunks, and the memory of
at most one chunk in flight. One pass over the whole prompt would not: the torch scan holds three float32 tensors
of [d_inner, T, d_state] per layer (~96 x hidden floats per token, more than an attention layer's), so a long
prompt's single pass is not small.
"""

from __future__ import annotations

import time
from typing import Iterator

import torch

from ..model.decode.adapter import input_device, synchronize
from ..settings import PREFILL_CHUNK  # the default of RunOptions.prefill_chunk (tests lower it)


# model_type of the families whose multi-token forward restarts the SSM scan from zeros (transformers' Mamba-1
# mixer: mamba_selective_scan's "Initial hidden state is not supported"); Mamba-2 passes `initial_states` and
# continues, as do the other recurrent families (Qwen3-Next, LFM2)
_SCAN_RESTARTS = frozenset({"mamba", "falcon_mamba", "jamba", "zamba"})


def continues_chunks(model) -> bool:
    """Whether a multi-token forward of `model` continues the state its cache holds (a later prefill chunk can be
    one forward). False for transformers' Mamba-1 mixers, whose scan over more than one token starts from zeros."""
    return getattr(getattr(model, "config", None), "model_type", None) not in _SCAN_RESTARTS


def prefill_chunks(device, prompt_ids: list[int], cache, chunk: int = PREFILL_CHUNK, states_out: list | None = None,
                   *, continuing: bool = False) -> Iterator[tuple[int, torch.Tensor | None, float]]:
    """Prefill `prompt_ids` (T ints) into `cache` (the run's RunCache, core/model/decode/run_cache.py; `device`: where
    the model takes its input ids), one chunk of at most `chunk` tokens per forward.

    Yields (prompt tokens in the cache so far, logits [V] for the first answer token on the last chunk else None,
    milliseconds of prefill so far incl. device sync: since prefill began, less any time the caller kept this
    generator suspended between chunks). A caller may stop iterating between chunks; the cache
    then holds the chunks done.
    `states_out`: when a list, the last chunk's forward also catches each decoder block's output at the last prompt
    position and appends them, [L, H], for the logit lens (core/model/observe/lens.py; eager only, earlier chunks unchanged).
    `continuing`: `cache` already holds positions these ids go on from (a follow-up turn's reused prefix,
    core/model/turn.py), so not even the first chunk is the prompt's first; the counts are of `prompt_ids` alone.
    """
    if chunk < 1:
        raise ValueError(f"prefill chunk must be >= 1 token, got {chunk}")
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # [1, T]
    total = ids.shape[1]
    synchronize(device)
    spent = 0.0  # seconds in the model, not counting time the caller held this generator suspended
    done = 0
    while done < total:
        start = time.perf_counter()
        part = ids[:, done:done + chunk]  # [1, <= chunk]
        last = done + part.shape[1] == total
        logits = cache.step.prefill(cache, part, done == 0 and not continuing, states_out if last else None)  # [V]
        done += part.shape[1]
        synchronize(logits.device)
        spent += time.perf_counter() - start
        yield done, (logits if done == total else None), spent * 1000.0


def prefill(model, prompt_ids: list[int], cache, chunk: int = PREFILL_CHUNK) -> tuple[torch.Tensor, float]:
    """prompt_ids: T ints -> (logits [V] for the first answer token, milliseconds incl. device sync)."""
    logits, ms = None, 0.0
    for _, logits, ms in prefill_chunks(input_device(model), prompt_ids, cache, chunk):
        pass
    return logits, ms
