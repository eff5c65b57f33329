"""A step that needs the whole sampler chain (a stage or an order the prefix path and the native and compiled
backends lack: the penalties, DRY, XTC, Mirostat ...; core/samplers.py `backend_gaps`): core/steps/stages.py
`run_chain` gives its distribution, and the token is drawn from it by the same exponential race over the same
per-id noise as core/steps/select.py's prefix path, so the same seed picks the same token wherever the
distributions agree. Its numbers travel in the same packed vector (core/steps/selection.py).

On a CPU where tokentui's native library builds, the same step is one C++ call (core/model/native/select_chain.cpp,
`op`): the stages as a small program (`program`: a code and its numbers per stage, in the step's order; the
sparse stages carry the ids they touch, worked out here from the history), the same report and the same draw."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from ..samplers import ChainInput, chain_order, check_vocab, mirostat_update
from . import penalties
from .selection import (Selection, _entropy, _pack, _scaled_entropy, _scores, _shape, _softmax, _unpack,
                        draw_uniforms, exp_noise, race_index)
from .stages import run_chain
from .topn import top_scores

__all__ = ["program", "select_chain"]

# The stage codes of select_chain.cpp's program (its `Code`), and the numbers per entry (its WIDTH).
_CODES = {"logit_bias": 1, "penalties": 2, "dry": 3, "temperature": 4, "dynatemp": 5, "top_n_sigma": 6, "top_k": 7,
          "typ_p": 8, "top_p": 9, "min_p": 10, "xtc": 11, "mirostat": 12}
_WIDTH = 6


def with_xtc_roll(given: ChainInput, steps, generator: torch.Generator | None, device) -> ChainInput:
    """`given` with XTC's roll for this step: where XTC is among `steps` (the step's `chain_order`) and none is
    given, one uniform from `generator`, drawn before the step's per-id noise. The one place the roll is drawn, so
    a decode step and a paused step's preview (core/model/preview.py) take it from the same place in the stream."""
    if given.xtc_roll is None and any(s.name == "xtc" for s in steps):
        return replace(given, xtc_roll=float(torch.rand(1, generator=generator, device=device)))
    return given


def select_chain(logits: torch.Tensor, settings, generator: torch.Generator | None, top_n: int,
                 to_host: Callable[[torch.Tensor], list], given: ChainInput, op: Callable | None = None) -> Selection:
    """A step through the whole chain (core/steps/stages.py `run_chain`), packed and read back as `_select`'s.
    XTC's roll is one uniform from `generator`, drawn before the step's per-id noise, so a seeded run replays;
    the noise is `draw_uniforms`' (the same per id as the prefix path's), raced over the chain's distribution.
    `op`: the native chain (select_chain.cpp) to run it with; None: the torch operations."""
    x = _scores(logits)  # [V] float32
    vocab = x.numel()
    n = max(0, min(int(top_n), vocab))
    greedy = settings.is_greedy
    steps = chain_order(settings)
    given = with_xtc_roll(given, steps, generator, x.device)
    if op is not None:
        check_vocab(settings, vocab)
        codes, ids, values = program(settings, steps, given, vocab)
        packed = op(x.contiguous(), codes, ids, values, n, greedy, float(settings.temperature),
                    given.xtc_roll or 0.0, None if greedy else generator)
        return _mirostat(_unpack(to_host(packed), n, greedy=greedy), settings, steps, given)
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
    return _mirostat(_unpack(to_host(packed), n, greedy=greedy), settings, steps, given)


def _mirostat(sel: Selection, settings, steps, given: ChainInput) -> Selection:
    if sel.greedy or not any(s.name == "mirostat" for s in steps):
        return sel
    return replace(sel, mirostat_mu=mirostat_update(given.mu, settings, sel.chosen_prob))


def program(settings, steps, given: ChainInput, vocab: int) -> tuple[list[float], list[int], list[float]]:
    """select_chain.cpp's program for `steps` (the chain's order): _WIDTH numbers per stage (its code, then its
    settings), and for the sparse stages the ids they touch with a value each (logit bias: the bias; penalties:
    the id's count in the window; DRY: core/steps/penalties.py's float32 penalty), at [start, start + count)."""
    s = settings
    codes: list[float] = []
    ids: list[int] = []
    values: list[float] = []

    def entry(name: str, *numbers: float) -> None:
        codes.extend([_CODES[name], *numbers] + [0.0] * (_WIDTH - 1 - len(numbers)))

    def sparse(name: str, found: list[int], found_values: list[float], *numbers: float) -> None:
        entry(name, len(ids), len(found), *numbers)
        ids.extend(found)
        values.extend(found_values)

    for stage in steps:
        name = stage.name
        if name == "logit_bias":
            sparse(name, [t for t, _ in s.logit_bias], [b for _, b in s.logit_bias])
        elif name == "penalties":
            found, times = penalties.window_counts(penalties.window(given.ids, s.repeat_last_n), vocab)
            sparse(name, found, times, s.repeat_penalty, s.frequency_penalty, s.presence_penalty)
        elif name == "dry":
            found, amounts = penalties.dry_penalties(penalties.window(given.ids, s.dry_penalty_last_n),
                                                     s.dry_multiplier, s.dry_base, s.dry_allowed_length,
                                                     given.breakers, vocab)
            sparse(name, found, amounts.tolist())
        elif name == "temperature" and s.dynatemp_range > 0 and not s.mirostat:
            entry("dynatemp", s.temperature, s.dynatemp_range, s.dynatemp_exp)
        elif name == "xtc":
            entry(name, s.xtc_probability, s.xtc_threshold)
        elif name == "mirostat":
            entry(name, 2.0 * s.mirostat_tau if given.mu is None else given.mu)
        else:  # one number: the stage's own setting (temperature, top-nσ, top-k, typical-p, top-p, min-p)
            entry(name, float(getattr(s, stage.param.name)))
    return codes, ids, values
