"""The sampler chain over the whole vocabulary, stage by stage, saying what each stage cut: the slow reference.

Each stage (core/samplers.py) masks the scores with the transformers LogitsProcessor it names (`Stage.oracle`):
the library already does each stage exactly as generate() does, so it is used rather than written again here. A
stage transformers lacks would add its own torch function beside `warper`. What this adds is the report: how many
entries each stage cut and the probability they had as the stage received them, what the dashboard's "cut by
<stage>" reads. It sorts and softmaxes the whole vocabulary: the tests' reference, not a decode step's path
(core/steps/select.py, the native call and the compiled step are checked against it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..samplers import STAGES

__all__ = ["Cut", "chain", "warper"]


@dataclass(frozen=True)
class Cut:
    """What one stage did: entries it set to -inf, and their probability in the distribution it received."""

    stage: str
    count: int
    mass: float
    left: int  # entries still in after it


def warper(stage, value):
    """The transformers LogitsProcessor a stage is (`Stage.oracle`), made for `value`."""
    from transformers.generation import logits_process  # heavy: only where the reference is wanted

    return getattr(logits_process, stage.oracle)(value)


def chain(logits: torch.Tensor, settings, report: bool = True) -> tuple[torch.Tensor, list[Cut]]:
    """The post-sampler distribution over the whole vocabulary ([V] float32), and what each active stage cut, in
    the chain's order (`report` False: no cuts counted, the distribution only). Greedy: one-hot on torch.argmax
    (first index on ties, as generate(do_sample=False)), no stage run."""
    scores = logits.reshape(1, -1).to(torch.float32)
    if settings.is_greedy:
        return torch.nn.functional.one_hot(scores[0].argmax(), scores.shape[-1]).to(torch.float32), []
    cuts = []
    for stage in STAGES:
        if not stage.active(settings):
            continue
        after = warper(stage, getattr(settings, stage.param.name))(None, scores.clone())
        if report:
            cut = torch.isinf(after) & ~torch.isinf(scores)  # [1, V] what this stage took out
            mass = torch.softmax(scores, dim=-1)[cut].sum()
            cuts.append(Cut(stage.name, int(cut.sum()), float(mass), int((~torch.isinf(after)).sum())))
        scores = after
    return torch.softmax(scores, dim=-1)[0], cuts
