"""Fan-out: "what else does the distribution hold from here?" — N continuations of M tokens each, drawn from one
step under the sampler settings in force, in one batched decode that shares the prefix's KV cache.

    FanoutEvent, [Notice], [PrefillProgress...], PrefillEvent, [FanoutProgress...], SampleEvent × N, DoneEvent

The prefix (prompt + the run's tokens before the step) is in the KV cache once: the engine's held cache cut back
to it (core/model/branch.py's reuse rule: one decode recomputes the step's scores), or a fresh prefill. That cache
is then copied to batch N (`expand_cache`: each full-attention layer's keys and values repeated into a buffer of
its own, other layers by transformers' `batch_repeat_interleave` on a copy, a recurrent layer's states repeated
along their batch dimension) — one copy, not N prefills — and every
step after the first feeds the N rows' newest tokens as one [N, 1] forward (all rows the same length: no padding,
no mask).

Each sample draws with a torch.Generator of its own, seeded `seed + i`, through core/steps/select.py's `select`
with the engine's settings and its top-candidates count — exactly the calls a single-sequence run from that step
with that seed makes — so sample i is reproducible on its own. Its `raw_probs` are each drawn token's raw
probability, `probs` its post-sampler probability, `logprob` the sum of the latter's logs. A row that draws an end
token stops there (unless the run options ignore end tokens); its row is still fed, and its output ignored, until
every row is done.

A FanoutProgress (the steps so far, the samples ended, the tokens drawn) follows a decode step at most once a
second, so a long fan-out shows how far it has gone (`tokentui fanout` on a terminal).

Pause and stop act between steps, as in a run; a fan-out stopped part-way reports each sample's tokens so far.
Afterwards the engine holds the prefix's own cache (batch 1, the prefix fed), so a sample adopted as a branch
reuses it.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Iterator

import torch

from ..errors import SettingsError
from ..runs.ending import stopped_before_first_token
from ..runs.events import Candidate, DoneEvent, Event, FanoutProgress, Notice, PrefillEvent, PrefillProgress
from ..runs.explore_events import FanoutEvent, SampleEvent
from ..runs.requests import FanoutRequest
from ..steps.decode import decode_one_token
from ..steps.detokenize import IncrementalDetokenizer
from ..steps.display import display_piece
from ..steps.prefill import prefill_chunks
from ..steps.select import select
from .decode.adapter import config_cache, first_capacity, forward_batch_logits, input_device, new_cache
from .decode.buffers import PlainCache
from .decode.run_cache import RunCache
from .decode.steps import TorchForward
from .branch import HeldCache, crop_cache, reusable_positions
from .speed import use_threads
from .sampler_input import RunHistory

__all__ = ["expand_cache", "fanout_events"]

PROGRESS_EVERY_S = 1.0  # a FanoutProgress at most this often: a person's progress line, a line a second in --json


def expand_cache(config, cache, n: int, capacity: int):
    """A copy of `cache` (a batch-1 RunCache of a model of `config`) at batch `n`, room for `capacity` positions per
    row in its full-attention layers; `cache` itself is left as it was. SettingsError (one line) for a layer kind
    that cannot be batched. A PlainCache (a GGUF later start's) is copied as one (its forward takes it over:
    RunCache.for_forward)."""
    if isinstance(cache.kv, PlainCache):
        return RunCache(cache.kv.expanded(n, capacity), cache.step, fed=cache.fed)
    from transformers.cache_utils import DynamicLayer

    from .decode.hf_layers import GrowableLayer

    out = config_cache(config, capacity)
    layers = []
    for source, fresh in zip(cache.kv.layers, out.layers):
        keys = getattr(source, "keys", None)
        if isinstance(fresh, GrowableLayer) and type(source) in (GrowableLayer, DynamicLayer):
            if isinstance(keys, torch.Tensor) and keys.dim() == 4 and keys.shape[-2] > 0:
                fresh.update(keys.expand(n, -1, -1, -1), source.values.expand(n, -1, -1, -1))  # copied into its buffer
            layers.append(fresh)
            continue
        layers.append(_repeated(source, n))
    out.layers = layers
    return RunCache(out, cache.step, fed=cache.fed)


def _repeated(source, n: int):
    """A copy of one (non-growable) cache layer at batch `n`: its keys and values by transformers' own
    `batch_repeat_interleave` (sliding windows, chunked attention, MLA's latent), a recurrent layer's conv and
    recurrent states (which that method does not know) repeated along their batch dimension here."""
    from transformers.cache_utils import DynamicLayer

    layer = copy.deepcopy(source)
    handled = False
    if isinstance(layer, DynamicLayer):
        layer.batch_repeat_interleave(n)
        handled = True
    for name in ("conv_states", "recurrent_states"):
        states = getattr(layer, name, None)
        if isinstance(states, dict):
            handled = True
            for key, tensor in states.items():
                if isinstance(tensor, torch.Tensor):
                    states[key] = tensor.repeat_interleave(n, dim=0)  # [batch, ...] -> [n * batch, ...]
    if not handled:
        raise SettingsError(f"fan-out cannot batch this model's {type(source).__name__} cache layers (a kind "
                            "tokentui does not know how to copy per sample)")
    return layer


def _check(engine, request: FanoutRequest) -> None:
    request.check_vocabulary(engine.facts.vocab_rows)
    request.check_context(engine.facts.max_context)


def _reuse(held, prefix: tuple[int, ...]) -> tuple[int, str | None]:
    """core/model/branch.py's reuse rule (positions of the held cache to keep, a Notice text), never a static
    (--compile) cache, which the rows could not be copied from."""
    reuse, why = reusable_positions(held, prefix)
    if reuse and held.cache.static:
        return 0, None
    return reuse, why


def _prefix_cache(engine, request: FanoutRequest, run_id: int, paused_s: float, held, reuse: int):
    """The prefix in a batch-1 KV cache and step `at`'s scores: yields its PrefillEvent (and progress) and returns
    (cache, logits, ms), or None when stopped during the prefill (its `done` yielded)."""
    model, opts = engine.model, engine.options
    prefix = list(request.prompt_ids) + list(request.tokens)
    if reuse:
        cache = held.cache
        crop_cache(cache, reuse)
        use_threads(engine.device, engine.speed.decode_threads())
        logits, ms = decode_one_token(prefix[-1], cache)
        yield PrefillEvent(tokens=1, ms=ms, kv_tokens=cache.tokens(), kv_bytes=cache.nbytes(),
                           reused_tokens=reuse)
        return cache, logits, ms
    del held
    # transformers' forward on a growable cache, whatever the plan's step: its layers are what `expand_cache` copies
    cache = RunCache(new_cache(model, first_capacity(len(prefix), 0, engine.facts.max_context)),
                     TorchForward(model, engine.facts.max_context))
    use_threads(engine.device, engine.speed.prefill_thread_count(len(prefix)))
    chunked = len(prefix) > opts.prefill_chunk
    logits, ms = None, 0.0
    for done, logits, ms in prefill_chunks(engine.device, prefix, cache, opts.prefill_chunk):
        if chunked:
            yield PrefillProgress(tokens_done=done, tokens=len(prefix), elapsed_ms=ms)
            if logits is None and engine.stopping(run_id):
                yield stopped_before_first_token(len(request.prompt_ids), cache.tokens(), cache.nbytes(),
                                                 paused_s * 1000.0)
                return None
    use_threads(engine.device, engine.speed.decode_threads())
    yield PrefillEvent(tokens=len(prefix), ms=ms, kv_tokens=cache.tokens(), kv_bytes=cache.nbytes())
    return cache, logits, ms


def _primed(vocab, tokens) -> IncrementalDetokenizer:
    """A detokenizer that has read the prefix's tokens (a sample's text goes on from them)."""
    detok = IncrementalDetokenizer(vocab)
    for token in tokens:
        detok.push(token)
    return detok


class _Row:
    """One sample as it is drawn."""

    __slots__ = ("generator", "ids", "raw", "probs", "detok", "texts", "reason")

    def __init__(self, device, seed: int, detok: IncrementalDetokenizer) -> None:
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.ids: list[int] = []
        self.raw: list[float] = []
        self.probs: list[float] = []
        self.detok = detok
        self.texts: list[str] = []
        self.reason: str | None = None  # None while it goes on


def fanout_events(engine, request: FanoutRequest, run_id: int) -> Iterator[Event]:
    """The fan-out's events (the module docstring), for `Engine.fanout`, which runs this under the engine's locks
    as run `run_id`; reads the engine through its public interface."""
    _check(engine, request)
    model, opts, vocab = engine.model, engine.options, engine.token_bytes
    settings, _ = engine.take_settings()  # one fan-out, one set of settings: those in force as it starts
    n, m = request.n, request.m
    prefix_detok = _primed(vocab, request.tokens)
    held = engine.take_held_cache()
    reuse, why = _reuse(held, tuple(request.prompt_ids) + tuple(request.tokens))
    start_event = dict(at=request.at, n=n, m=m, seed=request.seed, prompt_ids=list(request.prompt_ids),
                       tokens=list(request.tokens), prefix_text=prefix_detok.text, kv_reused_tokens=reuse,
                       settings=settings, parent=request.parent, parent_id=request.parent_token)
    go, paused_s = engine.timed_gate(run_id)
    if not go:
        engine.hold_cache(held)
        yield FanoutEvent(candidates=[], **start_event)
        yield stopped_before_first_token(len(request.prompt_ids), paused_ms=paused_s * 1000.0)
        return
    started = time.perf_counter()
    # the step's scores first: the fan-out event carries that step's distribution under these settings
    prefilled = []
    prefix_steps = _prefix_cache(engine, request, run_id, paused_s, held, reuse)
    del held
    while True:
        try:
            prefilled.append(next(prefix_steps))
        except StopIteration as end:
            result = end.value
            break
    if result is None:  # stopped in the prefill
        yield FanoutEvent(candidates=[], **start_event)
        yield from prefilled
        return
    base, logits, _ = result
    looked_back = RunHistory(engine.tokenizer, vocab, list(request.prompt_ids) + list(request.tokens))
    top = select(logits, settings, None if settings.is_greedy else torch.Generator(device=logits.device),
                 opts.top_candidates, given=looked_back.given(settings))
    candidates = [Candidate(id=i, piece=display_piece(vocab, i), raw_prob=r, prob=p, special=vocab.is_special(i))
                  for i, r, p in zip(top.top_ids, top.top_raw_probs, top.top_sampled_probs)]
    yield FanoutEvent(candidates=candidates, **start_event)
    if why:
        yield Notice(why)
    if settings.is_greedy and n > 1:
        yield Notice(f"greedy decoding: all {n} samples are the same (raise the temperature to fan out)")
    yield from prefilled
    prefix = tuple(request.prompt_ids) + tuple(request.tokens)
    engine.hold_cache(HeldCache(base, prefix))  # kept as it is: the rows decode in a copy
    batch = expand_cache(engine.config, base, n, len(prefix) + m) if m > 1 else None
    rows = [_Row(logits.device, request.seed_of(i), _primed(vocab, request.tokens)) for i in range(n)]
    # each sample looks back at the prompt, the tokens before the step and its own (core/model/sampler_input.py)
    histories = [RunHistory(engine.tokenizer, vocab, list(prefix)) for _ in range(n)]
    first_ms = None
    decode_s = 0.0
    forwards = 1
    reason = "length"
    device = input_device(model)
    reported = time.perf_counter()  # the last FanoutProgress (PROGRESS_EVERY_S apart), or the decode's start
    for t in range(m):
        if t:
            go, waited = engine.timed_gate(run_id)
            paused_s += waited
            if not go:
                reason = "stopped"
                break
            fed = torch.tensor([[row.ids[-1]] for row in rows], dtype=torch.long, device=device)  # [N, 1]
            begun = time.perf_counter()
            step_logits = forward_batch_logits(model, fed, batch.for_forward(model))  # [N, V]
            batch.fed += 1
            decode_s += time.perf_counter() - begun
            forwards += 1
        else:
            step_logits = logits[None].expand(n, -1)  # [N, V]: every row starts from the step's own scores
        begun = time.perf_counter()
        for i, row in enumerate(rows):
            if row.reason is not None:
                continue
            sel = select(step_logits[i], settings, row.generator, opts.top_candidates,
                         given=histories[i].given(settings))
            histories[i].push(sel)
            row.ids.append(sel.token_id)
            row.raw.append(sel.chosen_raw_prob)
            row.probs.append(sel.chosen_prob)
            row.texts.append(row.detok.push(sel.token_id).text)
            if sel.token_id in engine.end_ids and not opts.ignore_eos:
                row.reason = "eos"
        if t:
            decode_s += time.perf_counter() - begun
        else:
            first_ms = (time.perf_counter() - started) * 1000.0
        if all(row.reason is not None for row in rows):
            break
        if time.perf_counter() - reported >= PROGRESS_EVERY_S:
            reported = time.perf_counter()
            yield FanoutProgress(steps_done=t + 1, steps=m, samples_ended=sum(row.reason is not None for row in rows),
                                 tokens=sum(len(row.ids) for row in rows), elapsed_ms=(reported - started) * 1000.0)
    if reason != "stopped" and all(row.reason == "eos" for row in rows):
        reason = "eos"
    for row in rows:
        if row.reason is None:
            row.reason = reason
    for i, row in enumerate(rows):
        ending = row.detok.end()
        logprob = sum(math.log(p) if p > 0 else -math.inf for p in row.probs)
        yield SampleEvent(n=i, seed=request.seed_of(i), ids=row.ids, pieces=[display_piece(vocab, t) for t in row.ids],
                          text="".join(row.texts) + ending.text, raw_probs=row.raw, probs=row.probs, logprob=logprob,
                          reason=row.reason)
    drawn = sum(len(row.ids) for row in rows)
    decoded = drawn - min(drawn, n)
    final = batch if batch is not None else base
    yield DoneEvent(reason=reason, tokens=drawn, runs=forwards,
                    scores=(1 + (forwards - 1) * n) * engine.facts.vocab_rows if engine.facts.vocab_rows else None,
                    ttft_ms=first_ms, decode_tok_s=decoded / decode_s if decoded and decode_s > 0 else None, text="",
                    prompt_tokens=len(request.prompt_ids), kv_tokens=final.tokens(),
                    kv_bytes=final.nbytes(), paused_ms=paused_s * 1000.0)
