"""A step that needs the whole sampler chain (a stage or an order the prefix path and the native and compiled
backends lack: the penalties, DRY, XTC, Mirostat ...; core/samplers.py `backend_gaps`): core/steps/stages.py
`run_chain` gives its distribution, and the token is drawn from it by the same exponential race over the same
per-id noise as core/steps/select.py's prefix path, so the same seed picks the same token wherever the
distributions agree. Its numbers travel in the same packed vector (core/steps/selection.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from ..samplers import ChainInput, chain_order, mirostat_update
from .selection import (Selection, _entropy, _pack, _scaled_entropy, _scores, _shape, _softmax, _unpack,
                        draw_uniforms, exp_noise, race_index)
from .stages import run_chain
from .topn import top_scores

__all__ = ["select_chain"]


def select_chain(logits: torch.Tensor, settings, generator: torch.Generator | None, top_n: int,
                 to_host: Callable[[torch.Tensor], list], given: ChainInput) -> Selection:
    """A step through the whole chain (core/steps/stages.py `run_chain`), packed and read back as `_select`'s.
    XTC's roll is one uniform from `generator`, drawn before the step's per-id noise, so a seeded run replays;
    the noise is `draw_uniforms`' (the same per id as the prefix path's), raced over the chain's distribution."""
    x = _scores(logits)  # [V] float32
    vocab = x.numel()
    n = max(0, min(int(top_n), vocab))
    greedy = settings.is_greedy
    steps = chain_order(settings)
    if given.xtc_roll is None and any(s.name == "xtc" for s in steps):
        given = replace(given, xtc_roll=float(torch.rand(1, generator=generator, device=x.device)))
    some, index, left = run_chain(x, settings, given)  # [m] probabilities of the ids `index` ([V]: None)
    gap = x.amax() - x  # [V] >= 0
    p = _softmax(x)  # [V] raw probabilities
    h = _entropy(p, gap)  # [] nats; NaN unless every score is finite
    ok = torch.isfinite(h) & torch.isfinite(some.sum())
    if greedy:
        j = some.max(dim=0).indices.reshape(1)  # one-hot: its one entry
    else:  # the step's one draw over the whole vocabulary; the noise of the ids in play only
        uniforms = draw_uniforms(generator, vocab, x.device)
        j = race_index(torch.where(ok, some, 1.0), exp_noise(uniforms if index is None else uniforms[index]))
    token = j if index is None else index.index_select(0, j)  # [1]
    probs = some if index is None else torch.zeros(vocab, device=x.device).index_copy(0, index, some)  # [V]
    raw_in = p if index is None else p.index_select(0, index)
    top_ids = top_scores(x, n)[1]  # [n] by raw score
    at = torch.cat([token, top_ids])
    raw, post = p.index_select(0, at), probs.index_select(0, at)
    kept = some > 0
    hs = -(some * torch.where(kept, some.log(), 0.0)).sum()  # [] nats, the post-sampler distribution's entropy
    rank = torch.count_nonzero(x > x.index_select(0, token))
    ints = torch.cat([token, torch.stack([rank, kept.sum()])])
    floats = torch.cat([raw[:1], post[:1], torch.stack([torch.where(kept, raw_in, 0.0).sum(), h, hs,
                                                        torch.ones_like(h), torch.zeros_like(h)])])
    temp_h = torch.zeros_like(h) if greedy else _scaled_entropy(gap, float(settings.temperature))
    counts = [None if s not in left else torch.tensor(left[s], dtype=torch.float32) for s in ("top_k", "top_p")]
    packed = _pack(torch.stack([ok, ok]), ints, floats, _shape(temp_h, *counts), top_ids, raw[1:], post[1:])
    sel = _unpack(to_host(packed), n, greedy=greedy)
    if greedy or not any(s.name == "mirostat" for s in steps):
        return sel
    return replace(sel, mirostat_mu=mirostat_update(given.mu, settings, sel.chosen_prob))
