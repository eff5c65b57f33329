"""Each sampler stage's whole-vocabulary torch reference (core/samplers.py names the stages), and the chain of them.

`apply(name, scores, value)`: float32 scores [..., V] in, the scores with the cut entries at -inf out (temperature
divides), exactly what the stage's transformers warper does (tests/unit/test_sampler_chain.py holds each to it).
Slow and obvious: they sort or softmax the whole vocabulary. core/steps/select.py gets the same distribution from a
prefix of it; these are what it, the native call and the compiled step are checked against, with the warpers.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..samplers import STAGES

__all__ = ["APPLY", "chain_probs", "warper"]


def _temperature(scores: torch.Tensor, t: float) -> torch.Tensor:
    return scores / t


def _top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    k = min(int(k), scores.shape[-1])
    kth = torch.topk(scores, k, dim=-1).values[..., -1:]
    return scores.masked_fill(scores < kth, -math.inf)  # ties at the k-th stay, as TopKLogitsWarper


def _top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    probs = torch.softmax(scores, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # the mass strictly before each entry, in order
    cut = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= p)
    return scores.masked_fill(cut, -math.inf)  # the top entry has 0 before it: it always stays


def _min_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    probs = torch.softmax(scores, dim=-1)
    return scores.masked_fill(probs < p * probs.amax(dim=-1, keepdim=True), -math.inf)  # the top entry stays


APPLY: dict[str, Callable[[torch.Tensor, object], torch.Tensor]] = {
    "temperature": _temperature, "top_k": _top_k, "top_p": _top_p, "min_p": _min_p,
}


def warper(stage, value):
    """The transformers LogitsProcessor a stage is held to (`Stage.oracle`), made for `value`."""
    from transformers.generation import logits_process  # heavy: only where the oracle is wanted

    return getattr(logits_process, stage.oracle)(value)


def chain_probs(logits: torch.Tensor, settings) -> torch.Tensor:
    """The post-sampler distribution over the whole vocabulary by the stages' own references, in the chain's order;
    [V] float32 (greedy: one-hot on torch.argmax, as generate(do_sample=False))."""
    scores = logits.reshape(1, -1).to(torch.float32)
    if settings.is_greedy:
        return torch.nn.functional.one_hot(scores[0].argmax(), scores.shape[-1]).to(torch.float32)
    for stage in STAGES:
        if stage.active(settings):
            scores = APPLY[stage.name](scores, getattr(settings, stage.param.name))
    return torch.softmax(scores, dim=-1)[0]
