"""The scripted engine (tests/fakes.py) with made-up attention and sublayer figures on each step while the run options
ask for them (`attention`, `attention_heads`, `attention_top`, `sublayers`; the lens as tests/snapshot_apps_explore.py's
LensEngine makes it), for the dashboard's attention view and sublayer column (issue 39). The weights are valid
distributions over the positions each step's query sees (core/runs/attention.py checks them), different per layer
and head, with the first token a sink, so the tests can tell layers, heads and steps apart."""

from __future__ import annotations

import math
from dataclasses import replace

from snapshot_apps_explore import LensEngine
from tokentui.core.runs.attention import LayerAttention, SublayerRow
from tokentui.core.runs.events import BranchEvent, LensRow, PromptEvent, StepEvent

LAYERS = LensEngine.LAYERS  # 12, as the lens's rows
HEADS = 3
LOGIT_SHIFT = 7.25


def weights(query: int, layer: int, head: int | None) -> list[float]:
    """A distribution over positions 0..query: the first token a sink (more of it in later layers), the query
    itself and the position before it next, the rest spread by a pattern that depends on the layer and head."""
    shift = 0 if head is None else head + 1
    raw = [1.0 + ((p * (layer + 2) + shift * 5) % 7) for p in range(query + 1)]
    raw[0] = 10.0 * (query + 1) * layer / LAYERS  # the sink
    raw[query] += 3.0 * (query + 1) / (layer + shift)
    if query >= 1:
        raw[query - 1] += 1.5 * (query + 1) / (1 + shift)
    total = sum(raw)
    return [w / total for w in raw]


def top(ws: list[float], k: int) -> tuple[tuple[int, float], ...]:
    order = sorted(range(len(ws)), key=lambda p: (-ws[p], p))[:k]
    return tuple((p, ws[p]) for p in order)


class AttentionEngine(LensEngine):
    """LensEngine plus StepEvent.attention and .sublayers as the options ask (the module docstring)."""

    def _run(self, prompt, system, run_id):
        yield from self._with_inside(super()._run(prompt, system, run_id))

    def _branch(self, point, run_id):
        yield from self._with_inside(super()._branch(point, run_id))

    def _with_inside(self, events):
        prompt_len = 0
        for event in events:
            if isinstance(event, (PromptEvent, BranchEvent)):
                prompt_len = len(event.ids if isinstance(event, PromptEvent) else event.prompt_ids)
            if isinstance(event, StepEvent):
                event = self.inside(event, prompt_len)
            yield event

    def inside(self, step: StepEvent, prompt_len: int) -> StepEvent:
        opts = self.options
        query = prompt_len + step.index - 1  # the forward that scored the step fed the position before its token
        # made-up raw logits: the raw probabilities' logs, shifted (a softmax does not see the shift)
        changes = {"candidates": [replace(c, logit=math.log(c.raw_prob) + LOGIT_SHIFT if c.raw_prob else None)
                                  for c in step.candidates]}
        if opts.attention:
            k = opts.attention_top
            changes["attention"] = [
                LayerAttention(layer, query, None, top(weights(query, layer, None), k),
                               tuple(top(weights(query, layer, h), k) for h in range(HEADS))
                               if opts.attention_heads else None)
                for layer in range(1, LAYERS + 1)]
        if opts.sublayers:
            lens = step.lens or self.lens_of(step)
            alt = step.candidates[-1]
            changes["sublayers"] = [
                SublayerRow(layer, 1.0 + layer, 0.5 * layer, 0.25 * layer + step.index % 3, 2.0 + layer,
                            after_attn=LensRow(layer, alt.id, alt.piece, 0.01) if layer % 4 == 0 else lens[layer - 1],
                            after_mlp=lens[layer - 1] if opts.logit_lens else None)
                for layer in range(1, LAYERS + 1)]
        return replace(step, **changes)
