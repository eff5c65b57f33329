"""A deterministic stand-in for `tokentui.core.model.engine.Engine`, for the dashboard's tests.

`ScriptedEngine` keeps the engine interface (core/interface.py: a BaseEngine, with the real controls of
core/controls.py — settings, pause, single step, stop, run ids) and plays the article's answer "Partly. Some weights are open. (开放)"
(tests/fake_script.py): fixed candidates, fixed timings, and 开 (e5 bc 80) split over two tokens so the
pending-bytes path is exercised.
The sampler is honoured: temperature / top-k / top-p reshape the post-sampler probabilities, greedy picks the top
candidate, a cut token is never chosen, and a change made with `set_sampler` shows up in the next step's
`settings` with `settings_changed=True`.

`branch(point)` follows core/model/branch.py's event order: BranchEvent (KV reused when the engine's latest run or branch
held the prefix, as the real engine's held cache), PrefillEvent, the forced step at `point.at` (that step's own
scripted candidates, `point.token` chosen, forced=True; a Notice when the sampler gives it probability 0), then the
script from `point.at + 1` on, and `done` whose text is the prefix's text + the branch's. A branch point with a
phrase forces each of its ids in turn (`phrase_pieces`: words, a known piece's id where the script has one).

`score(request)` plays core/model/scoring.py's events (the answer's words forced step by step over the script's
candidates, a `score_summary` from core/runs/scoring.py, `done` "scored"); `fanout(request)` plays
core/model/fanout.py's (`fanout`, `prefill`, N samples drawn from the script's distributions under the settings
with random.Random(seed + i), `done`).
"""

from __future__ import annotations

import math
import os
import random
import re
import time
from dataclasses import replace
from typing import Callable, Iterator

from tokentui.core.errors import ErrorKind, ModelLoadError, SettingsError, TokentuiError
from tokentui.core.interface import BaseEngine
from tokentui.core.runs.scoring import percent
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.runs.events import (
    BranchEvent,
    Candidate,
    DoneEvent,
    ErrorEvent,
    Event,
    LoadProgress,
    Notice,
    PrefillEvent,
    PromptEvent,
    PromptPiece,
    StepEvent,
)
from tokentui.core.runs.explore_events import (
    SampleEvent,
    ScoreEvent,
    FanoutEvent,
)
from tokentui.core.runs.facts import ModelFacts
from tokentui.core.runs.scoring import score_summary
from tokentui.core.settings import RunOptions, SamplerSettings

from fake_script import (ANSWER, ANSWER_TEXT, ARTICLE_PROMPT, EOS_ID, FACTS, KV_BYTES_PER_TOKEN, PIECES, SPECIAL_IDS,
                         ScriptStep, _entropy_bits, apply_sampler, piece_of, piece_text, tokenize)

class ScriptedEngine(BaseEngine):
    """Plays `ANSWER` step by step; see the module docstring.

    delay: seconds between steps (so pilot tests can press keys mid-run).
    fail_at: yield an ErrorEvent instead of step `fail_at`. raise_at: raise RuntimeError there instead.
    chat_template=False: raw prompt, with a Notice first.
    pause_before: step counts (`steps_taken`, over all runs) before which the engine pauses itself, once each (so a
    test can act mid-run at a known step).
    """

    def __init__(self, *, delay: float = 0.0, options: RunOptions | None = None,
                 sampler: SamplerSettings | None = None, facts: ModelFacts = FACTS, fail_at: int | None = None,
                 raise_at: int | None = None, chat_template: bool = True,
                 default_system: str | None = None, keep_end_tokens: bool = False,
                 pause_before: set[int] | None = None):
        super().__init__(sampler)  # the real controls: settings, pause / step, stop, run ids
        self.facts = facts if chat_template else replace(facts, chat_template=False)
        self.options = options or RunOptions()
        self.delay = delay
        self.fail_at = fail_at
        self.raise_at = raise_at
        self.chat_template = chat_template
        self.default_system = default_system  # what the template would put in an empty system message
        self.keep_end_tokens = keep_end_tokens  # with ignore_eos, play the end token too (as the real engine does)
        self.pause_before = set(pause_before or ())
        self.runs: list[tuple[str, str | None]] = []
        self.branches: list[BranchPoint] = []  # every branch asked for, in order
        self.events: list[Event] = []  # every event of every run
        self.steps: list[StepEvent] = []  # every step of every run
        self.active = 0  # runs in progress (must never exceed 1)
        self.max_active = 0
        self.stop_calls = 0
        self.steps_taken = 0  # steps (over all runs) that have read their settings
        self.updates: list[tuple[int, SamplerSettings]] = []  # (steps taken when set, the settings): steps[n] next
        self.held_ids: tuple[int, ...] = ()  # what the real engine's held KV cache would hold (prompt + fed tokens)

    # ---- the controls: core/controls.py's, counted -----------------------------------------------------------
    def set_sampler(self, settings: SamplerSettings) -> SamplerSettings:
        new = super().set_sampler(settings)
        self.updates.append((self.steps_taken, new))
        return new

    def stop(self, run_id: int | None = None) -> None:
        self.stop_calls += 1
        super().stop(run_id)

    def _gate(self, run_id: int) -> bool:
        """Wait at a step boundary while paused; False when the run must stop."""
        if self.steps_taken in self.pause_before:
            self.pause_before.discard(self.steps_taken)
            self.pause()
        return self.wait_at_gate(run_id)

    def _sleep(self, run_id: int) -> None:
        if self.delay:
            self.sleep_at_gate(self.delay, run_id)

    phrase_refusal = score_refusal = fanout_refusal = None  # it plays all three (the module docstring)

    def phrase_pieces(self, text: str) -> list[PromptPiece]:
        """The script's own tokens where the text has them (longest first; 开 is its two byte tokens), any other
        character a token of its own."""
        pieces, at = [], 0
        while at < len(text):
            match = next((t for t in _VOCAB if text.startswith(t, at)), None)
            if match is None:
                char = text[at]
                pieces.append(PromptPiece(1000 + ord(char) % 9000, char.replace(" ", "␣"), False))
                at += 1
                continue
            pieces.extend(PromptPiece(i, piece_of(i), False) for i in _VOCAB[match])
            at += len(match)
        return pieces

    # ---- the run ---------------------------------------------------------------------------------------------
    def _run(self, prompt: str, system: str | None, run_id: int) -> Iterator[Event]:
        self.runs.append((prompt, system))
        yield from self._tracked(lambda: self._play_run(prompt, system, run_id))

    def _branch(self, point: BranchPoint, run_id: int) -> Iterator[Event]:
        """core/model/branch.py's events for `point` (see the module docstring); the settings, pause, step and stop act
        as in `run`."""
        self.branches.append(point)
        yield from self._tracked(lambda: self._play_branch(point, run_id))

    def _score(self, request, run_id: int) -> Iterator[Event]:
        yield from self._tracked(lambda: self._play_score(request, run_id))

    def _fanout(self, request, run_id: int) -> Iterator[Event]:
        yield from self._tracked(lambda: self._play_fanout(request, run_id))

    def _play_score(self, request, run_id: int) -> Iterator[Event]:
        text, pieces, templated = tokenize(request.prompt, request.system)
        ids = [p.id for p in pieces]
        yield PromptEvent(text=text, ids=ids, pieces=pieces, templated=templated, user_prompt=request.prompt,
                          system_prompt=request.system, default_system_prompt=self.default_system)
        answer = self.phrase_pieces(request.answer)
        forced = tuple(p.id for p in answer)
        yield ScoreEvent(answer=request.answer, ids=list(forced), pieces=answer)
        n_prompt = len(ids)
        yield PrefillEvent(tokens=n_prompt, ms=42.0, kv_tokens=n_prompt, kv_bytes=n_prompt * KV_BYTES_PER_TOKEN)
        script = self._script(len(forced))[:len(forced)]
        steps: list[StepEvent] = []
        played = yield from self._collect(self._play(script, 0, n_prompt, run_id, force=forced), steps)
        if played is None:
            return
        reason, chosen, texts, _, first_ms = played
        yield score_summary(steps, forward_ms=12.0)
        kv = n_prompt + max(0, len(chosen) - 1)
        yield DoneEvent(reason="scored" if reason != "stopped" else reason, tokens=len(chosen), runs=2,
                        scores=len(chosen) * self.facts.vocab_rows, ttft_ms=first_ms, decode_tok_s=None,
                        text="".join(texts), prompt_tokens=n_prompt, kv_tokens=kv, kv_bytes=kv * KV_BYTES_PER_TOKEN)

    @staticmethod
    def _collect(events, into: list):
        result = yield from _gather(events, into)
        return result

    def _play_fanout(self, request, run_id: int) -> Iterator[Event]:
        s, at, n_prompt = self.sampler, request.at, len(request.prompt_ids)
        script = self._script(at + request.m + 1)
        first = self._step(at, script[at], s, False, n_prompt)
        prefix_text = "".join(piece_text(piece_of(t), t in SPECIAL_IDS) for t in request.tokens)
        yield FanoutEvent(at=at, n=request.n, m=request.m, seed=request.seed, prompt_ids=list(request.prompt_ids),
                          tokens=list(request.tokens), prefix_text=prefix_text, kv_reused_tokens=0, settings=s,
                          candidates=first.candidates, parent=request.parent, parent_id=request.parent_token)
        kv = n_prompt + at
        yield PrefillEvent(tokens=kv, ms=42.0, kv_tokens=kv, kv_bytes=kv * KV_BYTES_PER_TOKEN)
        if not self._gate(run_id):
            yield DoneEvent(reason="stopped", tokens=0, runs=0, scores=0, ttft_ms=None, decode_tok_s=None, text="",
                            prompt_tokens=n_prompt)
            return
        for i in range(request.n):
            rng = random.Random(request.seed_of(i))
            ids, pieces, texts, raws, probs = [], [], [], [], []
            for k in range(request.m):
                step = self._step(at + k, script[at + k], s, False, n_prompt)
                weights = [c.prob for c in step.candidates]
                pick = max(range(len(weights)), key=weights.__getitem__) if s.is_greedy else \
                    rng.choices(range(len(weights)), weights)[0]
                c = step.candidates[pick]
                ids.append(c.id)
                pieces.append(c.piece)
                texts.append(piece_text(c.piece, c.special))
                raws.append(c.raw_prob)
                probs.append(c.prob)
                if c.id == EOS_ID and not self.options.ignore_eos:
                    break
            yield SampleEvent(n=i, seed=request.seed_of(i), ids=ids, pieces=pieces, text="".join(texts),
                              raw_probs=raws, probs=probs, logprob=sum(math.log(p) for p in probs),
                              reason="eos" if ids[-1] == EOS_ID and not self.options.ignore_eos else "length")
        drawn = request.n * request.m
        yield DoneEvent(reason="length", tokens=drawn, runs=request.m, scores=None, ttft_ms=None, decode_tok_s=None,
                        text="", prompt_tokens=n_prompt)

    def _tracked(self, start: Callable[[], Iterator[Event]]) -> Iterator[Event]:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            for event in start():
                self.events.append(event)
                if isinstance(event, StepEvent):
                    self.steps.append(event)
                yield event
        finally:
            self.active -= 1

    def _play_run(self, prompt: str, system: str | None, run_id: int) -> Iterator[Event]:
        if not prompt.strip():
            yield ErrorEvent("The prompt is empty: type a question", -1, ErrorKind.PROMPT)
            return
        if self.chat_template:
            text, pieces, templated = tokenize(prompt, system)
        else:
            yield Notice("This model has no chat template: the raw prompt is used as typed")
            text = prompt
            pieces = [PromptPiece(100 + n, w.replace(" ", "␣"), False)
                      for n, w in enumerate(re.findall(r" ?\S+", prompt))]
            templated = False
        ids = [p.id for p in pieces]
        yield PromptEvent(text=text, ids=ids, pieces=pieces, templated=templated, user_prompt=prompt,
                          system_prompt=system, default_system_prompt=self.default_system)
        n_prompt = len(ids)
        self.held_ids = ()  # a new run: the last one's KV cache goes
        yield PrefillEvent(tokens=n_prompt, ms=42.0, kv_tokens=n_prompt, kv_bytes=n_prompt * KV_BYTES_PER_TOKEN)
        opts = self.options
        script = list(ANSWER)
        if opts.ignore_eos:
            script = self._script(opts.max_new_tokens)
        played = yield from self._play(script, 0, n_prompt, run_id)
        if played is None:
            return
        reason, chosen, texts, decode_ms, first_ms = played
        tokens = len(chosen)  # steps taken (a stopped run did not take the next one)
        kv_tokens = n_prompt + max(0, tokens - 1)
        if tokens:
            self.held_ids = tuple(ids) + tuple(chosen[:-1])  # the last token was never fed
        decode_tok_s = (tokens - 1) / (decode_ms / 1000) if tokens > 1 and decode_ms else 0.0
        yield DoneEvent(reason=reason, tokens=tokens, runs=tokens, scores=tokens * self.facts.vocab_rows if self.facts.vocab_rows else None,
                        ttft_ms=first_ms, decode_tok_s=decode_tok_s, text="".join(texts), prompt_tokens=n_prompt,
                        kv_tokens=kv_tokens, kv_bytes=kv_tokens * KV_BYTES_PER_TOKEN)

    def _script(self, length: int) -> list[ScriptStep]:
        """The scripted steps for `length` positions, the answer over and over (ignore_eos: its end token left out
        unless keep_end_tokens)."""
        body = list(ANSWER) if self.keep_end_tokens or not self.options.ignore_eos else \
            [s for s in ANSWER if s.id != EOS_ID]
        script: list[ScriptStep] = []
        while len(script) < length:
            script.extend(body)
        return script

    def _play(self, script: list[ScriptStep], first: int, n_prompt: int, run_id: int,
              force: int | tuple[int, ...] | None = None, gate_first: bool = True):
        """Steps `first`, `first` + 1, ... of `script` as StepEvents, honouring the settings in force, pause, stop,
        max_new_tokens (counted from `first`) and the end token; `force`: the first step's token (a branch), or the
        tokens of the first steps (a phrase, a scored text).
        Returns (reason, the ids chosen, their texts, the decode steps' latency, the first step's latency) — None
        when it ended with an error event."""
        opts = self.options
        forced = (force,) if isinstance(force, int) else tuple(force or ())
        decode_ms = 0.0
        first_ms = None
        texts: list[str] = []
        chosen: list[int] = []
        reason = "length" if opts.ignore_eos else "eos"  # when the script runs out
        for k, scripted in enumerate(script[first:]):
            index = first + k
            if k >= opts.max_new_tokens:
                reason = "length"
                break
            if k:
                self._sleep(run_id)
            if (k or gate_first) and not self._gate(run_id):
                reason = "stopped"
                break
            if self.fail_at == index:
                yield ErrorEvent(f"NaN in the logits at step {index + 1}: the run stopped", index, ErrorKind.GENERATION)
                return None
            if self.raise_at == index:
                raise RuntimeError(f"scripted crash at step {index + 1}")
            settings, changed = self.take_settings()
            self.steps_taken += 1
            step = self._step(index, scripted, settings, changed, n_prompt, forced[k] if k < len(forced) else None)
            if k:
                decode_ms += step.latency_ms
            else:
                first_ms = step.latency_ms
            texts.append(step.text)
            chosen.append(step.id)
            yield step
            if step.forced and step.chosen_prob == 0.0:  # as core/model/branch.py says it
                cut = "greedy takes only the top token" if step.greedy else "the sampler settings cut it"
                yield Notice(f"step {index + 1}: the forced token {step.piece!r} has probability 0 after "
                             f"sampling ({cut}); its raw probability is {percent(step.chosen_raw_prob)}")
            if step.id == EOS_ID and not opts.ignore_eos and k + 1 >= len(forced):
                reason = "eos"
                break
        return reason, chosen, texts, decode_ms, first_ms

    def _play_branch(self, point: BranchPoint, run_id: int) -> Iterator[Event]:
        facts, opts = self.facts, self.options
        bad = next((i for i in (point.token, *point.prompt_ids, *point.tokens) if facts.vocab_rows and i >= facts.vocab_rows), None)
        if bad is not None:  # the real engine's check, before anything else (its error's kind)
            raise SettingsError(f"token id {bad} is not in this model's vocabulary (ids 0..{facts.vocab_rows - 1})")
        at, n_prompt = point.at, len(point.prompt_ids)
        script = self._script(at + opts.max_new_tokens + 1)
        prefix = point.prompt_ids + point.tokens
        keep = len(prefix) - 1  # the real engine's reuse rule (core/model/branch.py reusable_positions)
        held = self.held_ids
        reuse = keep if keep >= 1 and len(held) >= keep and held[:keep] == prefix[:keep] else 0
        prefix_text = "".join(s.text if s.id == token else piece_text(piece_of(token), token in SPECIAL_IDS)
                              for s, token in zip(script, point.tokens))
        yield BranchEvent(at=at, id=point.token, piece=piece_of(point.token), parent_id=point.parent_token,
                          parent_piece=None if point.parent_token is None else piece_of(point.parent_token),
                          kv_reused_tokens=reuse, prompt_ids=list(point.prompt_ids), tokens=list(point.tokens),
                          prefix_text=prefix_text, parent=point.parent,
                          phrase_ids=list(point.phrase) if point.phrase else None, phrase_text=point.phrase_text,
                          sample=point.sample)
        if not self._gate(run_id):  # stopped before anything ran: the held ids stay
            yield DoneEvent(reason="stopped", tokens=0, runs=0, scores=0, ttft_ms=None, decode_tok_s=None, text="",
                            prompt_tokens=n_prompt)
            return
        self.held_ids = ()
        kv, prefill_ms = n_prompt + at, 12.0 if reuse else 42.0
        yield PrefillEvent(tokens=1 if reuse else kv, ms=prefill_ms, kv_tokens=kv, kv_bytes=kv * KV_BYTES_PER_TOKEN,
                           reused_tokens=reuse)
        played = yield from self._play(script, at, n_prompt, run_id, force=point.forced_ids, gate_first=False)
        if played is None:
            return
        reason, chosen, texts, decode_ms, first_ms = played
        taken = len(chosen)
        kv_tokens = kv + max(0, taken - 1)
        self.held_ids = tuple(prefix) + tuple(chosen[:-1])
        yield DoneEvent(reason=reason, tokens=taken, runs=taken, scores=taken * facts.vocab_rows if facts.vocab_rows else None,
                        ttft_ms=first_ms,
                        decode_tok_s=(taken - 1) / (decode_ms / 1000) if taken > 1 and decode_ms else None,
                        text=prefix_text + "".join(texts), prompt_tokens=n_prompt, kv_tokens=kv_tokens,
                        kv_bytes=kv_tokens * KV_BYTES_PER_TOKEN)

    def _step(self, index: int, scripted: ScriptStep, s: SamplerSettings, changed: bool, n_prompt: int,
              force: int | None = None) -> StepEvent:
        """One step's event; `force`: the token taken whatever the sampler says (a branch's first step)."""
        raw = [c[2] for c in scripted.candidates]
        total = sum(raw)
        probs = apply_sampler(raw, s)
        cands = [Candidate(c[0], c[1], c[2] / total, p, special=c[0] in SPECIAL_IDS)
                 for c, p in zip(scripted.candidates, probs)]
        if force is not None:
            chosen_rank = next((i for i, c in enumerate(cands) if c.id == force), len(cands))
            chosen = cands[chosen_rank] if chosen_rank < len(cands) else \
                Candidate(force, piece_of(force), 0.0, 0.0, special=force in SPECIAL_IDS)  # below the list
        else:
            chosen_rank = next(i for i, c in enumerate(cands) if c.id == scripted.id)
            if s.is_greedy or cands[chosen_rank].prob == 0:
                chosen_rank = 0  # greedy, or the scripted token was cut: take the top one
            chosen = cands[chosen_rank]
        if chosen.id == scripted.id:
            text, pending_hex, pending_needed, completed = (scripted.text, scripted.pending_hex,
                                                            scripted.pending_needed, list(scripted.completed))
            special = scripted.special
        else:
            special = chosen.special
            text = piece_text(chosen.piece, special)
            pending_hex, pending_needed, completed = "", 0, []
        kept = [c for c in cands if c.prob > 0]
        latency = 45.0 if index == 0 else 20.0 + (index % 4) * 1.5
        kv_tokens = n_prompt + index
        return StepEvent(
            index=index, id=chosen.id, piece=chosen.piece, special=special, text=text,
            pending_hex=pending_hex, pending_needed=pending_needed, completed_chars=completed,
            candidates=cands, chosen_rank=chosen_rank, chosen_raw_prob=chosen.raw_prob, chosen_prob=chosen.prob,
            kept_count=len(kept), kept_mass=sum(c.raw_prob for c in kept),
            entropy_bits=_entropy_bits(c.raw_prob for c in cands),
            sampled_entropy_bits=_entropy_bits(c.prob for c in cands),
            greedy=s.is_greedy, settings=s, settings_changed=changed,
            latency_ms=latency, forward_ms=latency - 0.5,
            kv_tokens=kv_tokens, kv_bytes=kv_tokens * KV_BYTES_PER_TOKEN, forced=force is not None,
        )


def _vocabulary() -> dict[str, tuple[int, ...]]:
    """Text -> the script's ids for it: the answer's own tokens first (byte tokens joined to the character they
    complete), then every other piece of the script, longest first."""
    own: dict[str, tuple[int, ...]] = {}
    held: list[int] = []
    for step in ANSWER:
        held.append(step.id)
        if step.text:
            own[step.text] = tuple(held)
            held = []
    others = {piece_text(piece, False): (i,) for i, piece in PIECES.items()
              if i not in SPECIAL_IDS and not piece.startswith("<")}
    ordered = sorted(own.items(), key=lambda kv: -len(kv[0])) + sorted(others.items(), key=lambda kv: -len(kv[0]))
    vocab: dict[str, tuple[int, ...]] = {}
    for text, ids in ordered:
        vocab.setdefault(text, ids)
    return vocab


_VOCAB = _vocabulary()


def _gather(events, into: list):
    """Pass `events` on, keeping their steps in `into`; returns what the generator returned."""
    while True:
        try:
            event = next(events)
        except StopIteration as end:
            return end.value
        if isinstance(event, StepEvent):
            into.append(event)
        yield event


def make_loader(engine: ScriptedEngine | None = None, *, error: Exception | None = None,
                stages: int = 3, delay: float = 0.0, fail_times: int | None = None
                ) -> Callable[[Callable[[LoadProgress], None]], ScriptedEngine]:
    """A loader for DashboardConfig.load: reports `stages` progress steps, then returns `engine` or raises.

    fail_times: raise `error` only on the first N calls (to test retry).
    """
    engine = engine or ScriptedEngine()
    calls = {"n": 0}

    def load(progress: Callable[[LoadProgress], None]) -> ScriptedEngine:
        calls["n"] += 1
        for n in range(stages):
            progress(LoadProgress("converting GGUF", (n + 1) / stages))
            if delay:
                time.sleep(delay / max(1, stages))
        if error is not None and (fail_times is None or calls["n"] <= fail_times):
            raise error
        return engine

    load.calls = calls  # type: ignore[attr-defined]
    load.engine = engine  # type: ignore[attr-defined]
    return load


__all__ = [  # with the script's names (tests/fake_script.py), re-exported
    "ANSWER",
    "ANSWER_TEXT",
    "ARTICLE_PROMPT",
    "EOS_ID",
    "FACTS",
    "KV_BYTES_PER_TOKEN",
    "ModelLoadError",
    "PIECES",
    "SPECIAL_IDS",
    "ScriptStep",
    "ScriptedEngine",
    "TokentuiError",
    "apply_sampler",
    "make_loader",
    "piece_of",
    "screen_text",
    "slow_engine",
    "tokenize",
    "wait_for",
]


# ---- pilot helpers -------------------------------------------------------------------------------------------

# A wait ends as soon as its predicate holds, so a longer limit costs a passing test nothing; on a loaded machine
# (CI, or other jobs on 2 cores) the app and the scripted engine run several times slower than the limits were
# written for. Each limit below is therefore stretched by this factor before a wait gives up.
WAIT_SCALE = float(os.environ.get("TOKENTUI_TEST_WAIT_SCALE", "6"))


async def wait_for(pilot, predicate: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    """Let the app run until `predicate()` is true; fail with `what` after `timeout` seconds (× WAIT_SCALE)."""
    limit = timeout * WAIT_SCALE
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit:.0f}s waiting for {what or predicate}")
        await pilot.pause(0.01)


def slow_engine(delay: float = 0.1, steps: int = 400, **kwargs) -> ScriptedEngine:
    """A run that lasts (steps × delay) seconds, so keys can be pressed while it generates."""
    return ScriptedEngine(delay=delay, options=RunOptions(max_new_tokens=steps, ignore_eos=True), **kwargs)


def screen_text(app) -> str:
    """What the terminal shows now, as plain text (the screen plus any modal on top)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def record_scripted(directory, engine: "ScriptedEngine | None" = None):
    """A record as the dashboard and --record-dir write it (RunRecorder, the model's facts first) of one scripted
    run: (its path, the run's events)."""
    from tokentui.core.runs.record_writer import RunRecorder

    engine = engine or ScriptedEngine()
    recorder = RunRecorder(directory)
    path = recorder.open_run()
    recorder.write(engine.facts)
    events = []
    for event in engine.run("Is OpenAI open?"):
        recorder.write(event)
        events.append(event)
    recorder.close()
    return path, events
