"""Steps 4-6 of generation, step after step until a run ends: the engine's loop (`Engine.generate_from`,
core/model/engine.py, runs it for a run, a branch, a scored text and a follow-up turn). Each iteration selects the
step's token with the settings in force (step 4), reports it as the detokenizer releases its text (step 6), waits at
the step gate (pause, single-step, stop) and feeds the token through the model (step 5). It is the engine's own
loop: it reads and writes the engine's run state (the held and the parked cache, the lens and capture choices)."""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Iterator

import torch

from ..errors import GenerationError
from ..runs.events import Candidate, DoneEvent, Event, Notice, StepEvent
from ..samplers import backend_gaps
from ..steps.decode import decode_one_token
from ..steps.detokenize import IncrementalDetokenizer, oneshot_text
from ..steps.display import display_piece
from ..steps.select import candidate_logits, select, unpack
from .branch import HeldCache
from .decode.adapter import synchronize
from .observe.inside import Inside, forward_states
from .observe.lens import logit_lens
from .observe.timing import StepClock
from .sampler_input import RunHistory

__all__ = ["generate_from"]


def generate_from(engine, run_id: int, ids: list[int], cache, logits, forward_ms: float, paused_s: float,
                  lens_states: list | None = None, *, prefix: tuple[int, ...] = (),
                  detok: IncrementalDetokenizer | None = None, choose=None,
                  lens_said: bool | None = None, fed: int | None = None, decode=None,
                  limit: int | None = None, inside: Inside | None = None,
              inside_said: bool = False, mirostat_mu: float | None = None) -> Iterator[Event]:
    """Steps 4-6, step after step until the run ends, from `logits` (the scores for step len(prefix), whose
    forward took `forward_ms`) and `cache` (the run's RunCache, core/model/decode/run_cache.py, holding `ids`,
    the prompt, then `prefix`). A run starts at step 0;
    a branch (core/model/branch.py) passes the tokens before its first step as `prefix`, `detok` primed with them
    and a `choose` that forces its first token. `done` counts the steps taken here; its text is prefix + those
    tokens, decoded in one shot. The finished run's cache is kept for branches (the engine's `_held`).

    The logit lens follows `engine.options.logit_lens` before each decode forward (`_lens_for`); `lens_states` is
    what the caller's forward filled (None: no lens). `lens_said`: the caller already said the lens is not
    available (None, from core/model/branch.py: taken as said when the lens is wanted now and the caller ran without
    it), so that Notice comes once per run. `fed`: the ids the forward that scored the first step read (default
    the prompt and `prefix`: a fresh prefill). Each step's time is split by a StepClock (core/model/observe/timing.py).

    `choose` may force tokens (core/model/forcing.py's ForcePhrase): while its `pending` ids remain, an end token
    does not end the run. `decode`: step 5 in place of decode_one_token, with its signature (a scored text's
    one forward, core/model/scoring.py; its `fed` attribute: the ids its latest call read). `limit`: the steps
    to take at most (default `options.max_new_tokens`). `inside`: the attention / sublayer capture the caller's
    forward ran under (core/model/observe/inside.py; None: none), chosen again before each decode forward as the
    lens is (`_inside_for`); `inside_said` as `lens_said`. A scored text's forward (`decode`) takes none.
    `mirostat_mu`: Mirostat 2.0's state at the first step (a branch's, core/samplers.py `mirostat_mu`); the
    stages that look back read the prompt and the tokens so far (core/model/sampler_input.py)."""
    facts, opts, tok = engine.facts, engine.options, engine.tokenizer
    if lens_said is None:
        lens_said = lens_states is None and opts.logit_lens
    ttft_ms = None  # the run's time to its first token: its first step's latency (prefill + selecting it)
    generator = torch.Generator(device=logits.device)
    seed_in_use: int | None = None
    if detok is None:
        detok = IncrementalDetokenizer(engine.token_bytes)
    choose = choose or select  # step 4's selection (looked up now, so a test can patch `select`)
    decode = decode or decode_one_token  # step 5 (looked up now, likewise)
    limit = opts.max_new_tokens if limit is None else limit
    first = len(prefix)
    # The ids so far, prompt then answer: the one list, owned by the history step 4 looks back at (each step's
    # token joins it in `history.push`); the answer is its part past the prompt.
    history = RunHistory(tok, engine.token_bytes, list(ids) + list(prefix), mirostat_mu)
    start = len(ids)
    reason = "length"
    clock = StepClock(engine.device, logits.device)
    step_start = clock.first(forward_ms, len(ids) + first if fed is None else fed, engine.options.time_stages)
    decode_started = None
    decode_paused_s = 0.0  # paused time inside the decode span, taken out of the decode speed
    compile_said = False  # a compiled decoder that stopped mid-run: said once
    # --compile's whole step (core/model/decode/compiled.py `step_select`): the forward of the last token and the next
    # selection in one compiled call, run once the next step's settings are known; `pending` is that token.
    # (not for a forced phrase's selection or a scored text's forward: they replace steps 4 and 5 themselves)
    whole = cache.step if (cache.step.top_n == opts.top_candidates and choose is select
                           and decode is decode_one_token) else None
    pending: int | None = None
    index = first
    while True:
        # Step 4 — selection, with the settings in force now.
        settings, changed = engine.take_settings()
        if settings.seed != seed_in_use:
            generator.manual_seed(settings.seed)
            seed_in_use = settings.seed
        if pending is not None and backend_gaps(settings, "fused"):  # a stage the whole step lacks: eager
            logits, forward_ms = decode(pending, cache, sync=clock.sync_forward)
            clock.forward_ends(forward_ms, 1)
            pending = None
        try:
            if pending is not None:  # step 5 and 4 together: forward of `pending`, then the selection
                packed = whole.step_select(cache, pending, settings, generator)
                if clock.sync_forward:
                    synchronize(engine.device)
                clock.forward_ends((time.perf_counter() - step_start) * 1000.0)
                sel = unpack(clock.to_host(packed), opts.top_candidates, settings.is_greedy)
                pending = None
                scored = None  # the whole step's logits stay inside it: its candidates' are not reported
            else:
                sel = choose(logits, settings, generator, opts.top_candidates, to_host=clock.to_host,
                             given=history.given(settings))
                scored = logits
        except GenerationError as err:
            raise GenerationError(f"step {index + 1}: {err}", index) from err  # numbered from 1; .step: the index
        history.push(sel)
        clock.selected()
        if whole is not None and whole.failure is not None and not compile_said:
            compile_said = True
            yield Notice(whole.failure)  # this step was eager, as the rest of the run will be
        vocab = engine.token_bytes
        lens = None  # the logit lens of the forward that scored this token (core/model/observe/lens.py)
        if lens_states:
            lens = logit_lens(engine.model, lens_states.pop(), lambda i: display_piece(vocab, i), logits)
            clock.lensed()
        attention = sublayers = None  # inside the blocks, of the same forward (issue 39)
        if inside is not None and inside.caught:
            attention, sublayers = inside.take(cache.tokens() - 1, lens, lambda i: display_piece(vocab, i))
            clock.lensed()
        # Step 6 — detokenize as the token arrives.
        det = detok.push(sel.token_id)
        piece = display_piece(vocab, sel.token_id)
        raw_logits = candidate_logits(scored, sel.top_ids) if scored is not None else [None] * len(sel.top_ids)
        candidates = [Candidate(id=i, piece=display_piece(vocab, i), raw_prob=r, prob=p,
                                special=vocab.is_special(i), logit=x)
                      for i, r, p, x in zip(sel.top_ids, sel.top_raw_probs, sel.top_sampled_probs, raw_logits)]
        kv_tokens, kv_bytes = cache.tokens(), cache.nbytes()  # building the event counts as detok
        now = time.perf_counter()
        timing = clock.finish(now)
        latency_ms = (now - step_start) * 1000.0
        if index == first:
            ttft_ms = latency_ms
        yield StepEvent(
            index=index, id=sel.token_id, piece=piece, special=det.special,
            text=det.text, pending_hex=det.pending.hex(" "), pending_needed=det.pending_needed,
            completed_chars=list(det.completed), candidates=candidates,
            chosen_rank=sel.chosen_rank, chosen_raw_prob=sel.chosen_raw_prob, chosen_prob=sel.chosen_prob,
            kept_count=sel.kept_count, kept_mass=sel.kept_mass, entropy_bits=sel.entropy_bits,
            sampled_entropy_bits=sel.sampled_entropy_bits, greedy=sel.greedy, settings=settings,
            settings_changed=changed, latency_ms=latency_ms, forward_ms=clock.forward_ms,
            kv_tokens=kv_tokens, kv_bytes=kv_bytes, lens=lens, temp_entropy_bits=sel.temp_entropy_bits,
            timing=timing, attention=attention, sublayers=sublayers, **sel.kept_by_stage,
        )
        index += 1
        if sel.token_id in engine.end_ids and not opts.ignore_eos and not getattr(choose, "pending", 0):
            reason = "eos"
            break
        if index - first >= limit:
            reason = "length"
            break
        # The next token would sit at position cache_tokens: it must be inside the context.
        if facts.max_context and cache.tokens() >= facts.max_context:
            reason = "context"
            break
        with engine._cond:  # while it waits at the gate, a preview may read its cache (`idle_cache`)
            engine._parked = (cache, history.ids)
        go, waited = engine.timed_gate(run_id)
        with engine._cond:  # (under the gate's lock: a preview holding it finishes before the next forward)
            engine._parked = None
        paused_s += waited
        if decode_started is not None:
            decode_paused_s += waited
        if not go:
            reason = "stopped"
            break
        lens_states, lens_why = engine._lens_for(lens_states, lens_said)  # the lens as the options say now
        if lens_why:
            lens_said = True
            yield Notice(lens_why)
        # Step 5 — decode: only the new token goes through the model.
        step_start = clock.forward_begins(engine.options.time_stages, waited)
        if decode_started is None:
            decode_started = step_start
        inside, inside_why = engine._inside_for(inside, inside_said) if decode is decode_one_token else (None, None)
        if inside_why:
            inside_said = True
            yield Notice(inside_why)
        if whole is not None and lens_states is None and inside is None:
            pending = sel.token_id  # fed by the next step's whole-step call, once its settings are known
            continue
        with inside or nullcontext():  # a capture's forward goes through transformers' (a states_out list)
            logits, forward_ms = decode(sel.token_id, cache, sync=clock.sync_forward,
                                        states_out=forward_states(lens_states, inside))
        clock.forward_ends(forward_ms, getattr(decode, "fed", 1))
        if cache.step.failure is not None and not compile_said:
            compile_said = True
            yield Notice(cache.step.failure)  # this step was eager, as the rest of the run will be
    end = time.perf_counter()
    generated = history.ids[start:]
    taken = len(generated) - first  # the steps selected here
    decoded = taken - 1
    decode_s = (end - decode_started - decode_paused_s) if decode_started is not None else 0.0
    # Bytes of a character that can no longer complete are reported as bytes, not released as U+FFFD; the
    # answer text leaves out what a one-shot decode makes of them (the oracle: one-shot == text + that).
    ending = detok.end()
    text = oneshot_text(tok, generated)
    if ending.dropped_text and text.endswith(ending.dropped_text):
        text = text[: -len(ending.dropped_text)]
    engine._held = HeldCache(cache, tuple(history.ids[:-1]))  # the last token was never fed
    yield DoneEvent(
        reason=reason, tokens=taken, runs=taken, scores=taken * facts.vocab_rows,
        ttft_ms=ttft_ms, decode_tok_s=(decoded / decode_s) if decoded > 0 and decode_s > 0 else None,
        text=text, prompt_tokens=len(ids), flushed=ending.text,
        kv_tokens=cache.tokens(), kv_bytes=cache.nbytes(), paused_ms=paused_s * 1000.0,
        dropped_hex=ending.dropped_hex, dropped_needed=ending.dropped_needed,
    )

