"""Scoring a text: "how likely was the answer I got elsewhere?" — the prompt is prefilled as for a run, then the
answer is teacher-forced as a whole in one forward, and each of its tokens becomes a step with its candidates, its
rank and its probability, as if it had been generated.

    PromptEvent, ScoreEvent, [PrefillProgress...], PrefillEvent, StepEvent(forced)..., ScoreSummary, DoneEvent

How. The prefill's last scores are step 0's (the answer's first token); one forward over the answer's tokens but
the last gives every later step's scores at once (core/model/decode/adapter.py `forward_all_logits`; with the logit lens,
every position's block outputs too; a Mamba-1 model's answer goes in one token a pass, as its later prefill chunks
do). The steps are then the engine's own loop (core/model/step_loop.py
`generate_from`), with core/model/forcing.py's ForcePhrase choosing the answer's tokens and `AnswerForward` standing
in for step 5's decode: its first call is the one forward, each later call hands out the next position's scores.
So a scored step is built exactly as a generated one (selection under the settings in force, detokenizing, the KV
figures, the timing split) and the numbers equal those of a run that generated the same tokens.

Timing, as it happened: step 0's forward is the prefill; step 1's the answer's one forward (its `timing.h2d_bytes`
the A - 1 ids it read); later steps had no forward of their own (forward 0 ms; the same h2d figure: the pass that
scored them). The KV cache holds the prompt and the answer but its last token after that forward, as each step
after the first reports. The `done`'s reason is "scored"; `runs` counts the two forwards, `scores` the positions
scored × the vocabulary; no decode speed (nothing was decoded). The cache stays with the engine, so a branch of the
scored text reuses it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Iterator

import torch

from ..errors import PromptError, SettingsError
from ..runs.ending import stopped_before_first_token
from ..runs.events import DoneEvent, Event, Notice, PrefillEvent, PrefillProgress, PromptEvent, PromptPiece, StepEvent
from ..runs.explore_events import ScoreEvent
from ..runs.requests import ScoreRequest
from ..runs.scoring import score_summary
from ..steps.detokenize import oneshot_text
from ..steps.display import display_piece
from ..steps.prefill import continues_chunks, prefill_chunks
from ..steps.template import apply_template
from ..steps.tokenization import tokenize
from .decode.adapter import forward_all_logits, input_device, synchronize
from .forcing import ForcePhrase, phrase_ids
from .decode.steps import TorchForward
from .observe.lens import forward_all_states, lens_unavailable
from .speed import use_threads

__all__ = ["AnswerForward", "score_events"]


class AnswerForward:
    """Step 5 for a scored text (the module docstring): called as core/steps/decode.py's `decode_one_token`. The
    first call runs one forward over `ids` (the answer but its last token) and returns the scores after ids[0];
    call i returns those after ids[i]. `fed`: the ids that forward read. `ms`: its time (None before it ran)."""

    def __init__(self, model, ids: list[int], with_states: bool) -> None:
        self.model = model
        self.ids = list(ids)
        self.with_states = with_states
        self.fed = len(self.ids)
        self.ms: float | None = None
        self._logits: torch.Tensor | None = None  # [A - 1, V]
        self._states: torch.Tensor | None = None  # [A - 1, L, H]
        self._next = 0

    def __call__(self, token_id: int, cache, states_out: list | None = None, sync: bool = True
                 ) -> tuple[torch.Tensor, float]:
        model = self.model
        i = self._next
        if i >= len(self.ids) or token_id != self.ids[i]:
            raise RuntimeError(f"a scored text's step {i + 1} was given token {token_id}, not the answer's")
        self._next += 1
        forward_ms = 0.0
        if self._logits is None:
            start = time.perf_counter()
            x = torch.tensor([self.ids], dtype=torch.long, device=input_device(model))  # [1, A - 1]
            # a Mamba-1 mixer's multi-token scan starts from zeros, not from the prompt's state (core/steps/
            # prefill.py continues_chunks): there the answer goes in one token a pass, each reading the state
            parts = [x] if continues_chunks(model) else list(x.split(1, dim=1))  # [1, A - 1] or A - 1 of [1, 1]
            if self.with_states:
                done = [forward_all_states(model, part, cache.for_forward(model)) for part in parts]
                self._logits = torch.cat([logits for logits, _ in done])  # [A - 1, V]
                self._states = torch.cat([states for _, states in done])  # [A - 1, L, H]
            else:
                self._logits = torch.cat([forward_all_logits(model, part, cache.for_forward(model))
                                          for part in parts])  # [A - 1, V]
            cache.fed += len(self.ids)
            if sync:
                synchronize(self._logits.device)
            forward_ms = self.ms = (time.perf_counter() - start) * 1000.0
        if states_out is not None and self._states is not None:
            states_out.append(self._states[i])  # [L, H]: the lens of the step these scores are for
        return self._logits[i], forward_ms


def _answer_ids(engine, request: ScoreRequest) -> list[int]:
    ids = list(request.answer_ids) if request.answer_ids is not None else phrase_ids(engine.tokenizer, request.answer)
    if not ids:
        raise PromptError("the answer to score has no tokens: pass a non-empty --answer")
    rows = engine.facts.vocab_rows
    bad = next((i for i in ids if rows and i >= rows), None)
    if bad is not None:
        raise SettingsError(f"the answer's token id {bad} is not in this model's vocabulary (ids 0..{rows - 1})")
    return ids


def score_events(engine, request: ScoreRequest, run_id: int) -> Iterator[Event]:
    """The scored text's events (the module docstring), for `Engine.score`, which runs this under the engine's
    locks as run `run_id`; reads the engine through its public interface."""
    facts, opts, tok, model = engine.facts, engine.options, engine.tokenizer, engine.model
    engine.release_cache()  # a new run: the last one's KV cache goes
    templated = apply_template(tok, request.prompt, request.system)
    if not templated.templated:
        yield Notice("this model has no chat template: the raw prompt is used as is")
    ids, pieces = tokenize(tok, templated, engine.token_bytes)
    answer = _answer_ids(engine, request)
    needed = len(ids) + len(answer)
    if facts.max_context and needed > facts.max_context:
        over = needed - facts.max_context
        raise PromptError(f"the prompt and the answer are {needed} tokens, {over} over this model's context of "
                          f"{facts.max_context}; shorten them by at least {over} tokens")
    yield PromptEvent(text=templated.text, ids=ids, pieces=pieces, templated=templated.templated,
                      user_prompt=request.prompt, system_prompt=request.system,
                      default_system_prompt=engine.default_system_prompt)
    vocab = engine.token_bytes
    text = request.answer if request.answer_ids is None else oneshot_text(tok, answer)
    yield ScoreEvent(answer=text, ids=answer, pieces=[PromptPiece(i, display_piece(vocab, i), vocab.is_special(i))
                                                      for i in answer])
    go, paused_s = engine.timed_gate(run_id)
    if not go:
        yield stopped_before_first_token(len(ids), paused_ms=paused_s * 1000.0)
        return
    lens_states = None
    if opts.logit_lens:
        why = lens_unavailable(model, compiled=False)  # the scoring forward is eager, also under --compile
        if why:
            yield Notice(why)
        else:
            lens_states = []
    # transformers' forward, whatever the plan's step: the answer goes in as one forward of all its positions
    cache, _ = TorchForward(model, facts.max_context).new_cache(len(ids), len(answer))
    use_threads(engine.device, engine.speed.prefill_thread_count(len(ids)))
    chunked = len(ids) > opts.prefill_chunk
    logits, forward_ms = None, 0.0
    for done, logits, forward_ms in prefill_chunks(engine.device, ids, cache, opts.prefill_chunk, states_out=lens_states):
        if chunked:
            yield PrefillProgress(tokens_done=done, tokens=len(ids), elapsed_ms=forward_ms)
            if logits is None and engine.stopping(run_id):
                yield stopped_before_first_token(len(ids), cache.tokens(), cache.nbytes(), paused_s * 1000.0)
                return
    yield PrefillEvent(tokens=len(ids), ms=forward_ms, kv_tokens=cache.tokens(), kv_bytes=cache.nbytes())
    forward = AnswerForward(model, answer[:-1], with_states=lens_states is not None)
    steps = []  # the scored steps' own figures, for the summary
    for event in engine.generate_from(run_id, ids, cache, logits, forward_ms, paused_s, lens_states,
                                      choose=ForcePhrase(answer), decode=forward, limit=len(answer),
                                      lens_said=lens_states is None and opts.logit_lens):
        if isinstance(event, StepEvent):
            event = replace(event, forced=True)
            steps.append(replace(event, candidates=[], completed_chars=[], lens=None, timing=None))
        elif isinstance(event, DoneEvent):
            if steps:
                yield score_summary(steps, forward.ms)
            runs = 1 + (forward.ms is not None)
            event = replace(event, reason="scored" if event.reason in ("length", "eos") else event.reason,
                            runs=runs, scores=event.tokens * facts.vocab_rows if facts.vocab_rows else None,
                            decode_tok_s=None)
        yield event
