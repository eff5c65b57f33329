"""Mirostat 2.0's state across a run's steps (the stage itself: core/samplers.py's registry, core/steps/
penalties.py's truncation): split from core/samplers.py, which re-exports both. No torch here."""

from __future__ import annotations

import math

__all__ = ["mirostat_mu", "mirostat_update"]


def mirostat_update(mu: float | None, settings, prob: float) -> float:
    """Mirostat 2.0's mu after a step that drew a token of post-sampler probability `prob` from mu (None: a
    fresh start, 2 * tau): llama_sampler_mirostat_v2_apply's mu -= eta * (-log2 p - tau). A forced token the chain
    had cut (p = 0, which llama.cpp never draws) leaves mu as it was rather than sending it to -inf."""
    start = 2.0 * settings.mirostat_tau if mu is None else mu
    if prob <= 0:
        return start
    return start - settings.mirostat_eta * (-math.log2(prob) - settings.mirostat_tau)


def mirostat_mu(steps) -> float | None:
    """Mirostat 2.0's mu after `steps`, the run's steps so far as (settings, chosen post-sampler probability)
    pairs, `mirostat_update` after each, from 2 * tau at the first step with mirostat on (and again after a step
    with it off, or with another tau or eta, as llama.cpp makes a new sampler then). None: the last step had it
    off. This is where the state lives: in the steps' own record, nothing kept beside it, so a branch or a step
    revisited in time travel starts from the state the run had there."""
    mu, current = None, None
    for settings, prob in steps:
        key = (settings.mirostat_tau, settings.mirostat_eta) if settings.mirostat and not settings.is_greedy else None
        if key is None:
            mu, current = None, None
            continue
        if key != current:
            mu, current = None, key
        mu = mirostat_update(mu, settings, prob)
    return mu
