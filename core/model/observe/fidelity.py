"""How close one model's scores are to another's on the same tokens: the 4-bit path against its float32 reference
(tests/unit/test_quantized_embedded.py, benchmarks/bench_quant.py), measured as the dashboard shows candidates.

Teacher-forced: both models read the same prompt and the same answer tokens (the reference's own greedy answer), so
every position compares the two on one prefix; a position's candidates are its `top` highest raw probabilities
(softmax of the raw scores, as the candidates panel's "raw" column), and |dp| is taken over the ids in both lists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...steps.decode import decode_one_token
from ...steps.prefill import prefill
from ..decode.steps import LeanTorch, TorchForward


def teacher_forced_logits(model, prompt_ids: list[int], tokens: list[int], lean_step=None) -> list[torch.Tensor]:
    """Scores [V] (float32) for each of `tokens`' positions: after the prompt, then after each token in turn, as a
    run computes them (one prefill, then one decode step per token through the model's forward, whose scores the
    eager lean step gives bit for bit). `lean_step`: decode through that step instead (an object with
    `step(token_id, cache)`: the native step, --compile's core/model/decode/compiled_lean.py)."""
    step = TorchForward(model) if lean_step is None else LeanTorch(model, lean_step)
    cache, _ = step.new_cache(len(prompt_ids), len(tokens))
    logits, _ = prefill(model, prompt_ids, cache, chunk=max(1, len(prompt_ids)))
    out = [logits.float()]
    for token in tokens[:-1]:
        logits, _ = decode_one_token(token, cache)
        out.append(logits.float())
    return out


@dataclass(frozen=True)
class Agreement:
    """Top-1 agreement and |dp| over the shown candidates of a contender against a reference, per position.

    positions: positions compared; agree: where both top-1 ids are the same; disagreements: (position, reference
    top-1 margin over its second, in probability) where they are not; dp_max / dp_mean: over the (position, id)
    pairs in both top lists; dp_max_at: (position, id) of the largest; pairs: how many pairs."""

    positions: int
    agree: int
    disagreements: list[tuple[int, float]]
    dp_max: float
    dp_max_at: tuple[int, int]
    dp_mean: float
    pairs: int


def agreement(reference: list[torch.Tensor], contender: list[torch.Tensor], top: int = 10) -> Agreement:
    agree, pairs, total, worst, where, disagreements = 0, 0, 0.0, -1.0, (0, 0), []
    for position, (ref, got) in enumerate(zip(reference, contender)):
        p_ref, p_got = ref.double().softmax(-1), got.double().softmax(-1)
        ref_top, got_top = p_ref.topk(top), p_got.topk(top)
        if ref_top.indices[0] == got_top.indices[0]:
            agree += 1
        else:
            disagreements.append((position, float(ref_top.values[0] - ref_top.values[1])))
        shared = sorted(set(ref_top.indices.tolist()) & set(got_top.indices.tolist()))
        for token in shared:
            dp = abs(float(p_ref[token] - p_got[token]))
            pairs, total = pairs + 1, total + dp
            if dp > worst:
                worst, where = dp, (position, token)
    return Agreement(positions=min(len(reference), len(contender)), agree=agree, disagreements=disagreements,
                     dp_max=worst, dp_max_at=where, dp_mean=total / max(pairs, 1), pairs=pairs)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where two token sequences differ (the shorter one's length if one is a prefix), or None."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))
