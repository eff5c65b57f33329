"""The sampler chain over the whole vocabulary, stage by stage, saying what each stage cut: the reference, and the
path a step takes when it needs a stage the fast backends lack.

Each stage (core/samplers.py) runs in the step's order (`chain_order`: the logit bias first, then --samplers'
order; Mirostat 2.0 replaces the chain as llama.cpp's does). A stage transformers has a LogitsProcessor for
(`Stage.oracle`: temperature, top-k, typical-p, top-p, min-p) is that processor: the library already does it
exactly as generate() does, so it is used rather than written again. The others are core/steps/penalties.py's
torch functions with llama.cpp's semantics. What this adds is the report (`Cut`): how many entries each stage cut,
the probability they had as the stage received them, the entropy it left and which ids it cut, what the dashboard's
"cut by <stage>" reads.

`chain` is the reference (the tests' oracle and a paused step's preview: it keeps the whole vocabulary); `run_chain`
is the same computation for a decode step, which, once a stage has left only a few entries (top-k), carries on with
those alone instead of the whole vocabulary (core/steps/select_chain.py runs it for a step the prefix path cannot
take, where the native chain, core/model/native/select_chain.cpp, does not: off CPU, or without the native library).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..samplers import ChainInput, chain_order, check_vocab
from . import penalties

__all__ = ["Cut", "chain", "cut_by", "run_chain", "warper"]

_LN2 = math.log(2.0)


@dataclass(frozen=True)
class Cut:
    """What one stage did: entries it set to -inf, their probability in the distribution it received, the
    entries still in after it and the entropy (bits) of what it left; `mask` ([V] bool) says which ids it cut."""

    stage: str
    count: int
    mass: float
    left: int  # entries still in after it
    entropy_bits: float = 0.0  # of the distribution after it (softmax of what it left)
    mask: torch.Tensor | None = field(default=None, compare=False, repr=False)


def cut_by(cuts: list[Cut], token_id: int) -> str | None:
    """The stage that cut `token_id` (its registry name: "min_p"), None when no stage did."""
    return next((c.stage for c in cuts if c.mask is not None and bool(c.mask[token_id])), None)


def warper(stage, value):
    """The transformers LogitsProcessor a stage is (`Stage.oracle`), made for `value`."""
    from transformers.generation import logits_process  # heavy: only where the reference is wanted

    return getattr(logits_process, stage.oracle)(value)


def _apply(stage, scores: torch.Tensor, settings, given: ChainInput) -> torch.Tensor:
    """One stage on scores [1, n] (the whole vocabulary for the stages that read ids)."""
    name, s = stage.name, settings
    if name == "logit_bias":
        return penalties.bias(scores, s.logit_bias)
    if name == "penalties":
        recent = penalties.window(given.ids, s.repeat_last_n)
        return penalties.penalize(scores, recent, s.repeat_penalty, s.frequency_penalty, s.presence_penalty)
    if name == "dry":
        recent = penalties.window(given.ids, s.dry_penalty_last_n)
        return penalties.dry(scores, recent, s.dry_multiplier, s.dry_base, s.dry_allowed_length, given.breakers)
    if name == "temperature" and s.dynatemp_range > 0 and not s.mirostat:
        return penalties.dynamic_temperature(scores, s.temperature, s.dynatemp_range, s.dynatemp_exp)
    if name == "top_n_sigma":
        return penalties.top_n_sigma(scores, s.top_n_sigma)
    if name == "xtc":  # no roll given (the reference, the tests): the step where it fires, to show what it cuts
        roll = 0.0 if given.xtc_roll is None else given.xtc_roll
        return penalties.xtc(scores, s.xtc_probability, s.xtc_threshold, roll)
    if name == "mirostat":
        return penalties.mirostat_v2(scores, 2.0 * s.mirostat_tau if given.mu is None else given.mu)
    return warper(stage, getattr(s, stage.param.name))(None, scores.clone())


def _entropy_bits(scores: torch.Tensor) -> float:
    p = torch.softmax(scores, dim=-1)
    logs = torch.where(p > 0, torch.log_softmax(scores, dim=-1), 0.0)
    return max(0.0, float(-(p * logs).sum())) / _LN2


def _greedy(scores: torch.Tensor) -> torch.Tensor:
    """One-hot on torch.argmax (first index on ties), as generate(do_sample=False)."""
    return torch.nn.functional.one_hot(scores[0].argmax(), scores.shape[-1]).to(torch.float32)


def chain(logits: torch.Tensor, settings, report: bool = True,
          given: ChainInput | None = None) -> tuple[torch.Tensor, list[Cut]]:
    """The post-sampler distribution over the whole vocabulary ([V] float32), and what each stage that ran cut, in
    the chain's order (`report` False: no cuts counted, the distribution only). `given`: the run's tokens so far
    and the stages' state (core/samplers.py `ChainInput`; None: no history, Mirostat's first step, XTC firing).
    Greedy: the logits processors (bias, penalties, DRY), then one-hot on their argmax."""
    scores = logits.reshape(1, -1).to(torch.float32)
    check_vocab(settings, scores.shape[-1])
    given = given or ChainInput()
    cuts = []
    for stage in chain_order(settings):
        after = _apply(stage, scores, settings, given)
        if report:
            cut = torch.isinf(after) & ~torch.isinf(scores)  # [1, V] what this stage took out
            mass = torch.softmax(scores, dim=-1)[cut].sum()
            cuts.append(Cut(stage.name, int(cut.sum()), float(mass), int((~torch.isinf(after)).sum()),
                            _entropy_bits(after), cut[0]))
        scores = after
    if settings.is_greedy:
        return _greedy(scores), cuts
    return torch.softmax(scores, dim=-1)[0], cuts


def run_chain(x: torch.Tensor, settings,
              given: ChainInput) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, int]]:
    """`chain`'s distribution for a decode step from [V] float32 scores: (probabilities, the ids they are of,
    how many entries were left after each stage, by name). Once a stage leaves at most a sixteenth of a large
    vocabulary, the stages after it run on those entries alone, and the probabilities come back for those ids
    (every other id has 0); otherwise over the whole vocabulary, ids None. Each remaining stage reads only the
    scores it is given; one that reads token ids (bias, penalties, DRY) first puts them back in place."""
    vocab = x.numel()
    check_vocab(settings, vocab)
    scores = x.reshape(1, -1)
    index = None  # the ids of the entries `scores` holds, once compacted
    left: dict[str, int] = {}
    for stage in chain_order(settings):
        if index is not None and not stage.warps:  # it reads ids: back to the whole vocabulary
            scores = torch.full((1, vocab), -math.inf, device=x.device).index_copy(1, index, scores)
            index = None
        scores = _apply(stage, scores, settings, given)
        if not stage.cutting and not (stage.name == "temperature" and settings.dynatemp_range > 0):
            continue  # it only moved scores (a dynamic temperature of 0 keeps the top one alone: counted)
        finite = torch.isfinite(scores)
        left[stage.name] = count = int(finite.sum())
        if index is None and stage.cutting and vocab > 4096 and count <= vocab // 16:
            index = finite[0].nonzero()[:, 0]
            scores = scores.index_select(1, index)
    probs = _greedy(scores) if settings.is_greedy else torch.softmax(scores, dim=-1)[0]
    return probs, index, left
