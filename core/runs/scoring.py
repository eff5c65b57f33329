"""The figures of a scored text (or a forced phrase) from its steps: torch-free, so the engine that emits the
`score_summary` event and the dashboard that shows a phrase's surprisal compute them the same way.

Each step's `chosen_raw_prob` is the model's own probability of the given token (softmax of the raw logits, before
temperature / top-k / top-p): the figures describe the model, not the sampler. logprob = Σ ln p (nats); perplexity
= exp(−logprob / tokens); a token's surprisal is −log₂ p bits.
"""

from __future__ import annotations

import math
from typing import Iterable

from .events import StepEvent
from .explore_events import ScoredToken, ScoreSummary

__all__ = ["LEAST_LIKELY", "percent", "scored_tokens", "score_summary", "surprisal_bits"]

LEAST_LIKELY = 5  # tokens a summary lists


def surprisal_bits(p: float | None) -> float | None:
    """−log₂ p (inf for p = 0; None where p was not reported)."""
    if p is None:
        return None
    return math.inf if p <= 0 else -math.log2(p)


def percent(p: float, digits: int = 2) -> str:
    """A probability as a percentage with `digits` decimals — the one rule every probability tokentui shows follows
    (the dashboard's columns with 1, text with 2) — and, where it is too small for them to show (it would read
    0.00%), its leading digits in exponent form, `digits` significant: 5.0e-06% (2), 5e-06% (1)."""
    fixed = f"{p * 100:.{digits}f}"
    if p == 0 or float(fixed) != 0:
        return fixed + "%"
    return f"{p * 100:.{max(0, digits - 1)}e}%"


def scored_tokens(steps: Iterable[StepEvent]) -> list[ScoredToken]:
    """Each step as a ScoredToken (its raw probability; 0 where not reported)."""
    return [ScoredToken(index=s.index, id=s.id, piece=s.piece, raw_prob=s.chosen_raw_prob or 0.0,
                        rank=s.chosen_rank) for s in steps]


def score_summary(steps: Iterable[StepEvent], forward_ms: float | None = None, least: int = LEAST_LIKELY
                  ) -> ScoreSummary:
    """The summary of `steps` (module docstring); the `least` least likely tokens, least likely first (ties: the
    earlier step first). A token of probability 0 (underflow) makes logprob −inf and perplexity inf."""
    tokens = scored_tokens(steps)
    logprob = sum(math.log(t.raw_prob) if t.raw_prob > 0 else -math.inf for t in tokens)
    perplexity = math.exp(-logprob / len(tokens)) if tokens and logprob > -math.inf else math.inf
    if not tokens:
        perplexity = 1.0
    ordered = sorted(tokens, key=lambda t: (t.raw_prob, t.index))
    return ScoreSummary(tokens=len(tokens), logprob=logprob, perplexity=perplexity, least_likely=ordered[:least],
                        forward_ms=forward_ms)
