"""Branching: go back to one step of a run, force another token there, and let the model go on from it.

A run's step k (0-based `StepEvent.index`) is selected from the scores the model gives after reading the prompt
(L ids) and the tokens t0..t(k-1): at that selection the KV cache holds L + k - 1 positions plus the one being fed
(the prompt's last id for k = 0, else t(k-1)). A branch at step k with token x keeps t0..t(k-1), takes x at step
k instead of t(k), then generates on with the sampler settings in force, exactly like a run. A branch point with a
phrase (core/model/forcing.py) forces each of its tokens at steps k, k + 1, ... in turn (each step `forced`), then
generates on:

    BranchEvent, [Notice], [PrefillProgress...], PrefillEvent, StepEvent(index=k, forced=True), StepEvent(k+1)...,
    DoneEvent (or ErrorEvent)

KV reuse. The engine keeps the KV cache of its latest finished run (or branch) and the ids it holds
(`HeldCache`). When those ids start with the branch's prompt + t0..t(k-2), the cache is cut back (`crop_cache`) to
L + k - 1 positions and only the one token at position L + k - 1 is fed again: one decode pass recomputes step
k's scores exactly (the candidates and probabilities reported are the genuine ones of that step), instead of a
prefill of L + k tokens. Otherwise — no held cache (a fresh process), another prompt, a cache that cannot be cut
back (--compile's static cache, sliding-window layers) — the prefix is prefilled afresh; when a held cache had
the prefix but could not be cut, a Notice says why. `BranchEvent.kv_reused_tokens` and
`PrefillEvent.reused_tokens` say how many positions were reused (0: prefilled afresh), `PrefillEvent.tokens` how
many the model computed.

The forced step. Selection runs as usual on the recomputed scores (same settings, on a copy of the sampler's
random generator, so the forced step draws nothing and the branch's first sampled step draws the seed's first
numbers); then its choice is replaced by x: `chosen_rank`, `chosen_raw_prob` and `chosen_prob` are x's. A token
that top-k / top-p (or greedy) cut has `chosen_prob` 0, and a Notice says so.

Numbering and length: steps keep their index (the branch's first step is index k; the UI shows k + 1).
`RunOptions.max_new_tokens` bounds the branch's own steps, the forced one included; `DoneEvent.tokens` / `runs`
count the branch's own steps, and `DoneEvent.text` is the whole answer, t0..t(k-1) + the branch's tokens decoded
in one shot (so "one-shot decode == text" holds for a branch too).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Iterator

from .decode.adapter import cache_layers, drop_positions
from ..steps.decode import decode_one_token
from ..steps.detokenize import IncrementalDetokenizer
from ..steps.display import display_piece
from ..errors import PromptError, SettingsError
from ..runs.ending import stopped_before_first_token
from ..runs.scoring import percent
from ..runs.events import BranchEvent, Event, Notice, PrefillEvent, PrefillProgress, StepEvent
from .forcing import ForcePhrase, check_phrase, forced_selection
from .observe.inside import Inside, forward_states
from .observe.lens import lens_unavailable
from ..steps.prefill import prefill_chunks
from ..runs.branch_point import BranchPoint
from ..runs.turns import common_prefix
from .speed import use_threads

__all__ = ["BranchPoint", "HeldCache", "branch_events", "crop_cache", "crop_problem", "forced_selection",
           "reusable_positions", "shared_positions"]


@dataclass(frozen=True)
class HeldCache:
    """The KV cache an engine keeps after a run (its RunCache, core/model/decode/run_cache.py), and the ids whose
    keys and values it holds, in order."""

    cache: object
    ids: tuple[int, ...]


# --------------------------------------------------------------------------------------------- the cache
def crop_problem(cache) -> str | None:
    """Why `cache` (a RunCache) cannot be cut back to a prefix (None: it can): its decode step says
    (core/model/decode/steps.py)."""
    return cache.step.crop_problem(cache)


def crop_cache(cache, tokens: int) -> None:
    """Cut `cache` (a RunCache of full-attention layers: DynamicLayer, GrowableBuffers) back to its first `tokens`
    positions.

    core/model/decode/adapter.py's `drop_positions` cuts transformers' cache; the result is checked: a crop that
    left another length raises RuntimeError.
    """
    held = cache.tokens()
    if not 0 <= tokens <= held:
        raise ValueError(f"cannot crop a cache of {held} positions to {tokens}")
    if tokens < held:
        drop_positions(cache.kv, held - tokens)
        cache.fed = tokens
    if cache.tokens() != tokens or any(k.shape[-2] != tokens for k, _ in cache_layers(cache.kv)):
        raise RuntimeError(f"the KV cache holds {cache.tokens()} positions after a crop to {tokens}")


def reusable_positions(held: HeldCache | None, prefix: tuple[int, ...]) -> tuple[int, str | None]:
    """(positions of `held` a branch over `prefix` (prompt + tokens before the step) can reuse, a Notice text or
    None). The step's scores come from feeding prefix[-1], so the cache must hold prefix[:-1] (at least)."""
    keep = len(prefix) - 1
    if held is None or keep < 1 or len(held.ids) < keep or held.ids[:keep] != prefix[:keep]:
        return 0, None
    problem = _held_crop_problem(held)
    if problem is not None:
        return 0, f"the KV cache of the last run was not reused: {problem}; prefilling the {len(prefix)}-token " \
                  "prefix afresh"
    return keep, None


def _held_crop_problem(held: HeldCache) -> str | None:
    """Why `held` cannot be cut back to one of its prefixes (None: it can)."""
    problem = crop_problem(held.cache)
    if problem is None and held.cache.tokens() != len(held.ids):
        problem = f"the held cache has {held.cache.tokens()} positions for {len(held.ids)} ids"
    return problem


def shared_positions(held: HeldCache | None, ids) -> tuple[int, str | None]:
    """(positions of `held` a run over `ids` can reuse, a Notice text or None): a follow-up turn's rule
    (core/model/turn.py). The longest common prefix of the held ids and `ids`, but never all of `ids` (the last is
    fed to score the first answer token), under the same crop rule as a branch's (`reusable_positions`)."""
    if held is None:
        return 0, None
    keep = min(common_prefix(held.ids, ids), len(ids) - 1)
    if keep < 1:
        return 0, None
    problem = _held_crop_problem(held)
    if problem is not None:
        return 0, f"the KV cache of the last turn was not reused: {problem}; prefilling the {len(ids)}-token " \
                  "prompt afresh"
    return keep, None


# --------------------------------------------------------------------------------------------- the branch
def _check(engine, point: BranchPoint) -> None:
    facts = engine.facts
    rows = facts.vocab_rows
    for name, ids in (("token", (point.token,)), ("prompt", point.prompt_ids), ("prefix", point.tokens)):
        bad = next((i for i in ids if i >= rows), None)
        if bad is not None:
            what = "the forced token" if name == "token" else f"the branch's {name}"
            raise SettingsError(f"{what} id {bad} is not in this model's vocabulary (ids 0..{rows - 1})")
    n = len(point.prompt_ids) + point.at
    if facts.max_context and n >= facts.max_context:
        raise PromptError(f"the branch's prefix is {n} tokens: step {point.at + 1} lies past this model's context "
                          f"of {facts.max_context}")
    if point.phrase:
        bad = next((i for i in point.phrase if i >= rows), None)
        if bad is not None:
            raise SettingsError(f"the phrase's token id {bad} is not in this model's vocabulary (ids 0..{rows - 1})")
        check_phrase(facts, engine.options, len(point.prompt_ids), point.at, point.phrase)


def branch_events(engine, point: BranchPoint, run_id: int) -> Iterator[Event]:
    """The branch's events (the module docstring has them), for `Engine.branch`, which runs this under the
    engine's locks as run `run_id` (pause / stop act at step boundaries, as in a run). Uses and replaces the
    engine's held cache; reads the engine through its public interface only."""
    _check(engine, point)
    opts = engine.options
    prefix = point.prompt_ids + point.tokens
    held = engine.take_held_cache()
    reuse, why = reusable_positions(held, prefix)
    detok = IncrementalDetokenizer(engine.token_bytes)  # primed with the prefix: the branch's text goes on from it
    for token in point.tokens:
        detok.push(token)
    vocab = engine.token_bytes
    parent_piece = display_piece(vocab, point.parent_token) if point.parent_token is not None else None
    yield BranchEvent(at=point.at, id=point.token, piece=display_piece(vocab, point.token),
                      parent_id=point.parent_token, parent_piece=parent_piece, kv_reused_tokens=reuse,
                      prompt_ids=list(point.prompt_ids), tokens=list(point.tokens), prefix_text=detok.text,
                      parent=point.parent, phrase_ids=list(point.phrase) if point.phrase else None,
                      phrase_text=point.phrase_text, sample=point.sample)
    if why:
        yield Notice(why)
    go, paused_s = engine.timed_gate(run_id)
    if not go:  # stopped before anything ran: the held cache stays as it was
        engine.hold_cache(held)
        yield stopped_before_first_token(len(point.prompt_ids), paused_ms=paused_s * 1000.0)
        return
    # from here the cache is the branch's (a failed branch leaves none held)
    lens_states = None  # the logit lens, as in a run: each forward appends its hidden states here
    if opts.logit_lens:
        lens_why = lens_unavailable(engine.model, compiled=not engine.plan.step.lens)
        if lens_why:
            yield Notice(lens_why)
        else:
            lens_states = []
    # attention / sublayers (issue 39), as in a run: its forward goes through transformers' (a states_out list)
    inside, inside_why = Inside.for_options(lambda: engine.model, engine.options, not engine.plan.step.lens, None,
                                            said=False)
    if inside_why:
        yield Notice(inside_why)
    if reuse:
        cache = held.cache
        crop_cache(cache, reuse)
        use_threads(engine.device, engine.speed.decode_threads())
        with inside or nullcontext():
            logits, forward_ms = decode_one_token(prefix[-1], cache,
                                                  states_out=forward_states(lens_states, inside))
        yield PrefillEvent(tokens=1, ms=forward_ms, kv_tokens=cache.tokens(), kv_bytes=cache.nbytes(),
                           reused_tokens=reuse)
    else:
        del held  # the old cache goes before the new one is allocated
        cache, notice = engine.plan.new_cache(len(prefix), opts.max_new_tokens)
        if notice:
            yield Notice(notice)
        use_threads(engine.device, engine.speed.prefill_thread_count(len(prefix)))
        chunked = len(prefix) > opts.prefill_chunk
        logits, forward_ms = None, 0.0
        with inside or nullcontext():
            for done, logits, forward_ms in prefill_chunks(engine.device, list(prefix), cache, opts.prefill_chunk,
                                                           states_out=forward_states(lens_states, inside)):
                if chunked:
                    yield PrefillProgress(tokens_done=done, tokens=len(prefix), elapsed_ms=forward_ms)
                    if logits is None and engine.stopping(run_id):
                        yield stopped_before_first_token(len(point.prompt_ids), cache.tokens(), cache.nbytes(),
                                                         paused_s * 1000.0)
                        return
        use_threads(engine.device, engine.speed.decode_threads())
        yield PrefillEvent(tokens=len(prefix), ms=forward_ms, kv_tokens=cache.tokens(), kv_bytes=cache.nbytes())
    forced = point.forced_ids
    steps = engine.generate_from(run_id, list(point.prompt_ids), cache, logits, forward_ms, paused_s, lens_states,
                             prefix=point.tokens, detok=detok, choose=ForcePhrase(forced),
                             fed=1 if reuse else len(prefix), inside=inside, inside_said=inside_why is not None,
                             mirostat_mu=point.mirostat_mu)
    cut_steps = []  # a phrase's forced steps the sampler gave probability 0
    for event in steps:
        if isinstance(event, StepEvent) and event.index < point.at + len(forced):
            event = replace(event, forced=True)
            yield event
            if event.chosen_prob == 0.0:
                cut_steps.append(event)
            if event.index == point.at + len(forced) - 1 and cut_steps:
                yield _cut_notice(cut_steps)
            continue
        yield event


def _cut_notice(cut: list[StepEvent]) -> Notice:
    """What a forced step the sampler would never have taken is told: one Notice for the token (or the phrase)."""
    first = cut[0]
    why = "greedy takes only the top token" if first.greedy else "the sampler settings cut it"
    if len(cut) == 1:
        return Notice(f"step {first.index + 1}: the forced token {first.piece!r} has probability 0 after sampling "
                      f"({why}); its raw probability is {percent(first.chosen_raw_prob)}")
    steps = ", ".join(str(s.index + 1) for s in cut)
    return Notice(f"steps {steps}: {len(cut)} forced tokens of the phrase have probability 0 after sampling ({why}); "
                  "their raw probabilities are in the steps")
