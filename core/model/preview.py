"""A step of a run seen again under other sampler settings, without advancing the run (issue 38, 4): the engine's
side of core/runs/preview.py's request and answer.

Where the step's scores come from. Per-step logits are not stored: a 49,152- or 151,936-float vector per step is
192 KiB to 594 KiB a step, 48 to 148 MiB for a 256-step run, for steps nobody may look at again. A preview
recomputes them instead, the way a branch does (core/model/branch.py): the KV cache that holds the step's prefix
(the paused run's own, or the latest finished run's) is COPIED (core/model/fanout.py's `expand_cache` at batch 1:
a few MiB for the embedded model), the copy cut back to the prefix less its last id (`crop_cache`), and that id fed
through the run's own decode step: one single-token forward, the same backend the run used, so the scores are the
step's own (tests/unit/test_preview_step.py checks them against a fresh forward). The run's cache is only read.
Only when no cache holds the prefix (another run's step; a cache that cannot be cut back: --compile's static one,
sliding windows) is the prefix read afresh, in one forward into a cache of its own. Measured (BENCHMARKS.md,
"Preview on the step in view"): on the embedded model the forward is ~21 ms of a ~39 ms preview and of a ~78 ms
key-to-paint on a busy 2-core CPU, inside the 100 ms target; keeping the latest step's logits as well would save
that one forward for one step only, so one way of getting the scores serves every step.

When the model may be used. The forward runs on the asker's thread (the model process answers questions on its
reader thread: core/model/process_main.py), so it must never overlap a step of a run: the engine lends its cache
only while the model is idle — no run on it, or the run waiting at its step gate, held there for the preview's
length (`Engine.idle_cache`). A run that is generating refuses the preview in one line (pause first).

What comes back: the chain of core/steps/stages.py over the whole vocabulary (the tests' reference itself, so the
probabilities shown are the oracle's), what each stage cut, the top candidates with the stage that cut each, and
the token the settings would take: greedy's argmax, or the draw of core/steps/select.py's `select` with a
generator seeded with the settings' seed (a run's first draw with that seed), which a branch from the preview
forces (tui/preview.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import torch

from ..errors import PromptError, SettingsError
from ..runs.preview import PreviewCandidate, PreviewRequest, StageRow, StepPreview
from ..samplers import ChainInput, chain_order, stage_named
from ..steps.decode import decode_one_token
from ..steps.display import display_piece
from ..steps.select import select
from ..steps.select_chain import with_xtc_roll
from ..steps.stages import chain
from .branch import HeldCache, crop_cache, reusable_positions
from .decode.adapter import first_capacity, forward_last_logits, new_cache, synchronize
from .fanout import expand_cache
from .sampler_input import RunHistory
from .speed import use_threads

__all__ = ["preview_step", "step_logits", "describe"]

_LN2 = math.log(2.0)


def _check(engine, request: PreviewRequest) -> None:
    rows = engine.facts.vocab_rows
    bad = next((i for i in request.prefix if i >= rows), None)
    if bad is not None:
        raise SettingsError(f"step preview: token id {bad} is not in this model's vocabulary (ids 0..{rows - 1})")
    n = len(request.prefix)
    if engine.facts.max_context and n > engine.facts.max_context:
        raise PromptError(f"step preview: the step's prefix is {n} tokens, past this model's context of "
                          f"{engine.facts.max_context}")


def step_logits(engine, request: PreviewRequest) -> tuple[torch.Tensor, str, float]:
    """(the step's scores [V] float32, how they were had: "kv" or "prefill", the forward's milliseconds), computed
    while the engine lends its idle cache (SettingsError, one line, while a run is generating)."""
    prefix = request.prefix
    with engine.idle_cache() as lent, torch.inference_mode():
        use_threads(engine.device, engine.speed.decode_threads())
        held = HeldCache(*lent) if lent is not None else None
        keep, _why = reusable_positions(held, prefix)
        if keep:
            capacity = first_capacity(held.cache.tokens(), 1, engine.facts.max_context)
            copy = expand_cache(engine.config, held.cache, 1, capacity)  # the run's cache is only read
            crop_cache(copy, keep)
            logits, forward_ms = decode_one_token(prefix[-1], copy)
            return logits.reshape(-1).to(torch.float32).clone(), "kv", forward_ms
        # A cache of its own (transformers' dynamic one, never the plan's: --compile's static cache is shared with
        # the run), one forward over the whole prefix.
        use_threads(engine.device, engine.speed.prefill_thread_count(len(prefix)))
        started = time.perf_counter()
        logits = forward_last_logits(engine.model, torch.tensor([list(prefix)], device=engine.device),
                                     new_cache(engine.model))
        synchronize(logits.device)
        forward_ms = (time.perf_counter() - started) * 1000.0
        use_threads(engine.device, engine.speed.decode_threads())
        return logits.reshape(-1).to(torch.float32).clone(), "prefill", forward_ms


def _entropy_bits(probs: torch.Tensor) -> float:
    nonzero = probs[probs > 0]
    return max(0.0, float(-(nonzero * nonzero.log()).sum()) / _LN2)


def _setting(stage, settings) -> str:
    """A stage's value as the panels write it: its first setting's (the one that turns it on)."""
    return stage.param.text(getattr(settings, stage.param.name))


def describe(logits: torch.Tensor, settings, top_n: int, vocab, at: int = 0, source: str = "kv",
             forward_ms: float = 0.0, given=None) -> StepPreview:
    """The step whose scores are `logits` ([V]) under `settings`: core/steps/stages.py's chain over the whole
    vocabulary, its cuts, the top `top_n` candidates by raw score and the token the settings take (`vocab`: the
    engine's TokenBytes, for the pieces; `given`: the step's ChainInput, the run's tokens before it and the stages'
    state). The draw is a run's first with the settings' seed: XTC's roll first (core/steps/select_chain.py
    `with_xtc_roll`), then the per-id noise, and the chain shown is the one that roll gives (XTC cuts only when it
    fires), so what is shown is what the pick was drawn from."""
    scores = logits.reshape(-1).to(torch.float32)
    generator = torch.Generator(device=scores.device).manual_seed(settings.seed)
    given = with_xtc_roll(given if given is not None else ChainInput(), chain_order(settings), generator,
                          scores.device)
    probs, cuts = chain(scores, settings, given=given)  # [V] the post-sampler distribution, each stage's cut
    raw = torch.softmax(scores, dim=-1)  # [V]
    n = max(1, min(top_n, scores.numel()))
    top_ids = torch.topk(scores, n).indices.tolist()
    cut_by: dict[int, str] = {}
    stages = []
    for cut in cuts:
        stage = stage_named(cut.stage)
        for i in top_ids:  # the first stage whose mask holds it cut it
            if i not in cut_by and cut.mask is not None and bool(cut.mask[i]):
                cut_by[i] = stage.label
        stages.append(StageRow(cut.stage, stage.label, _setting(stage, settings), cut.left, cut.count,
                               min(1.0, max(0.0, cut.mass)), cut.entropy_bits))
    sel = select(scores, settings, generator, top_n=1, given=given)
    pick = sel.token_id
    candidates = tuple(PreviewCandidate(i, display_piece(vocab, i), float(raw[i]), float(probs[i]),
                                        vocab.is_special(i), cut_by.get(i) if float(probs[i]) == 0.0 else None,
                                        float(scores[i]))
                       for i in top_ids)
    kept = probs > 0
    return StepPreview(
        at=at, settings=settings, candidates=candidates, stages=tuple(stages), kept_count=int(kept.sum()),
        kept_mass=min(1.0, float(raw[kept].sum())), entropy_bits=_entropy_bits(raw),
        sampled_entropy_bits=_entropy_bits(probs), pick=pick, pick_piece=display_piece(vocab, pick),
        pick_raw_prob=float(raw[pick]), pick_prob=min(1.0, float(probs[pick])),
        pick_rank=int((scores > scores[pick]).sum()), greedy=settings.is_greedy, source=source,
        forward_ms=forward_ms)


def preview_step(engine, request: PreviewRequest) -> StepPreview:
    """`Engine.preview_step`: step `request.at` of the run `request` names, under `request.settings` (the module
    docstring says how); nothing of the run changes."""
    if not isinstance(request, PreviewRequest):
        raise SettingsError(f"step preview needs a PreviewRequest, got {type(request).__name__}")
    started = time.perf_counter()
    _check(engine, request)
    logits, source, forward_ms = step_logits(engine, request)
    given = RunHistory(engine.tokenizer, engine.token_bytes, list(request.prefix), request.mu).given(request.settings)
    with torch.inference_mode():
        report = describe(logits, request.settings, request.top_n, engine.token_bytes, request.at, source, forward_ms,
                          given)
    return replace(report, total_ms=(time.perf_counter() - started) * 1000.0)
