"""One run (or branch) of a served model: the requests it makes one after another, each streamed token turned
into a StepEvent, and its end (core/server/engine.py's docstring says what a run is). It reads the engine through
its public interface, `Served` (core/server/served.py: the controls of core/controls.py, the connection, the
dialect, the vocabulary, the request body); a server fault is raised as a ServerError, which the engine interface turns into the run's error and done."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Iterator

from ..runs.branch_point import BranchPoint
from ..steps.detokenize import IncrementalDetokenizer
from ..steps.display import display_piece, display_text
from ..runs.events import BranchEvent, Candidate, DoneEvent, Event, Notice, PrefillEvent, StepEvent
from ..runs.turns import TurnEvent, TurnRequest, raw_text
from ..settings import SamplerSettings
from ..errors import ServerError
from .kv import KvPoller
from .probe import QUIET
from .prompt import build_prompt, raw_prompt
from .served import Served
from .vocab import read_tokens
from .wire import WireChunk, WireToken, read_chunk, read_native


class ServerRun:
    """One run's state: the prefix, the steps' bookkeeping, the requests."""

    def __init__(self, engine: Served, run_id: int) -> None:
        self.e = engine
        self.run_id = run_id
        self.prompt_ids: list[int] = []
        self.generated: list[int] = []
        self.text: list[str] = []  # the server's own text of each chunk: the one-shot oracle of the answer
        self.detok = IncrementalDetokenizer(engine.vocab)
        self.index = 0
        self.first = 0  # the index of the run's first step (a branch: its branch point)
        self.text_before = ""  # a branch's answer before the server's text: its prefix and the forced token's
        self.ttft_ms: float | None = None
        self.decode_ms = 0.0
        self.paused_s = 0.0
        self.kv = KvPoller(engine.conn, engine.dialect.kv_source, engine.dialect.kv_metric)
        self.said_merge = False
        self.follow_up = False  # a follow-up turn: its prefill's reuse is the server's to report (None: it did not)

    def events(self, prompt: str, system: str | None) -> Iterator[Event]:
        e = self.e
        notices, prompt_event = build_prompt(e.conn, e.dialect, e.model_id, prompt, system)
        yield from notices
        yield from self._answer(prompt_event)

    def _answer(self, prompt_event) -> Iterator[Event]:
        """The prompt event, then the answer's requests under the KV account, then the done event."""
        self.prompt_ids = list(prompt_event.ids)
        yield prompt_event
        with self.kv:
            reason = yield from self._requests()
        yield self._done(reason)

    def turn(self, request: TurnRequest) -> Iterator[Event]:
        """A turn of a conversation (core/runs/turns.py): the whole history sent, since a server keeps no state
        between requests (its prefix cache may reuse what it still holds: not known here, unless it reports its
        cached tokens, llama-server's `timings.cache_n`); or a raw run, its text tokenized by the server as is."""
        e = self.e
        self.follow_up = request.turn > 1
        yield TurnEvent(turn=request.turn, messages=list(request.messages), raw=request.raw, parent=request.parent)
        if request.raw:
            path, _ = e.request_body([], e.sampler, 1)
            yield Notice(f"raw: no chat template; the text is tokenized by the server as is and its ids go to its "
                         f"completions endpoint ({e.conn.address.url}{path})")
            prompt_event = raw_prompt(e.conn, e.dialect, e.model_id, raw_text(request.messages), request.user)
        else:
            notices, prompt_event = build_prompt(e.conn, e.dialect, e.model_id, request.user, request.system,
                                                 [m.template_dict() for m in request.messages])
            yield from notices
        yield from self._answer(prompt_event)

    def branch(self, point: BranchPoint) -> Iterator[Event]:
        e = self.e
        self.prompt_ids = list(point.prompt_ids)
        self.first = self.index = point.at
        for token in point.tokens:  # the prefix's text, as the parent showed it (bytes asked of the server)
            self.detok.push(token)
        prefix_text = self.detok.text
        self.generated = list(point.tokens)
        parent_piece = self._piece(point.parent_token) if point.parent_token is not None else None
        yield BranchEvent(at=point.at, id=point.token, piece=self._piece(point.token), parent_id=point.parent_token,
                          parent_piece=parent_piece, kv_reused_tokens=0, prompt_ids=list(point.prompt_ids),
                          tokens=list(point.tokens), prefix_text=prefix_text, parent=point.parent)
        settings, changed = e.take_settings()
        scored, ttft = self._score(self.prompt_ids + self.generated, settings)
        self.ttft_ms = ttft
        prefix = len(self.prompt_ids) + len(self.generated)
        yield PrefillEvent(tokens=prefix, ms=ttft, kv_tokens=prefix, kv_bytes=None)
        alts = scored.alternatives if scored is not None else []
        own = next((a for a in alts if a.id == point.token), None)
        forced = WireToken(point.token, None, own.prob if own is not None else None, alts,
                           scored.post_sampler if scored is not None else False)
        step = self._step(forced, False, settings, changed, ttft, None)
        yield replace(step, forced=True)
        self.text_before = prefix_text + step.text
        with self.kv:
            reason = self._limit_reason()
            if reason is None:
                reason = yield from self._requests(first_request=False)
        yield self._done(reason)

    def _score(self, prefix: list[int], settings: SamplerSettings) -> tuple[WireToken | None, float]:
        """The server's alternatives for the position after `prefix` (a branch's forced step) and the time they
        took: one token asked for and read, whatever the server picks (None: it streamed no entry, as for the
        first token of a split character)."""
        e = self.e
        path, body = e.request_body(prefix, settings, 1)
        read = read_native if e.dialect.llama_cpp else read_chunk
        where = f"{e.conn.address.url}{path}"
        sent = time.perf_counter()
        with e.conn.stream(path, body) as chunks:
            for obj in chunks:
                chunk = read(obj, where)
                if chunk.tokens:
                    chunks.token_arrived()
                    token = chunk.tokens[0]
                    for alt in token.alternatives:
                        e.vocab.learn(alt.id, alt.data, alt.text)
                    return token, (time.perf_counter() - sent) * 1000.0
        return None, (time.perf_counter() - sent) * 1000.0

    def _limit_reason(self) -> str | None:
        if len(self.generated) - self.first >= self.e.options.max_new_tokens:
            return "length"
        return None

    def _requests(self, first_request: bool = True):
        """The run's requests, one after another (a re-issue after a change, a pause, a step); returns the end
        reason."""
        e = self.e
        reason = None
        changed_next = False
        while reason is None:
            if not first_request:
                started = time.perf_counter()
                go = e.wait_at_gate(self.run_id)
                self.paused_s += time.perf_counter() - started
                if not go:
                    reason = "stopped"
                    break
            if e.stopping(self.run_id):
                reason = "stopped"
                break
            settings, changed = e.take_settings()
            changed_next = changed_next or changed
            remaining = e.options.max_new_tokens - (len(self.generated) - self.first)
            # A granted single step asks for one token; from llama-server, for up to the 4 a character can take
            # (it streams the tokens of a split character only once the character is whole) and reads one entry.
            single = e.paused
            ask = (min(4, remaining) if e.dialect.llama_cpp else 1) if single else remaining
            path, body = e.request_body(self.prompt_ids + self.generated, settings, ask)
            outcome = yield from self._request(path, body, settings, changed_next, first_request, single)
            first_request = False
            changed_next = False
            reason = outcome
        return reason

    def _request(self, path: str, body: dict, settings: SamplerSettings, changed: bool, first: bool,
                 single: bool):
        """One streamed request; yields its steps. Returns the run's end reason, or None to re-issue. `single`:
        one step was asked for (the stream is closed after the first entry)."""
        e = self.e
        read = read_native if e.dialect.llama_cpp else read_chunk
        where = f"{e.conn.address.url}{path}"
        sent = time.perf_counter()
        last = sent
        got_first = False
        finish: str | None = None
        predicted = 0
        streamed = 0
        with e.conn.stream(path, body) as chunks:
            for obj in chunks:
                chunk = read(obj, where)
                now = time.perf_counter()
                if chunk.tokens:
                    chunks.token_arrived()  # the deadline is between tokens (a server dripping bytes meets it)
                if chunk.text and not chunk.tokens and not chunk.had_logprobs:
                    raise ServerError(f"{e.conn.address.url}{path}: the server sent tokens without log-"
                                      "probabilities (it does not support `logprobs` here): tokentui needs them")
                tokens = self._expand(chunk, predicted)
                streamed += len(tokens)
                if chunk.final and chunk.predicted is not None and chunk.predicted > streamed:
                    # llama-server drops a character's tokens it still held when it stopped (at its length limit)
                    yield Notice(f"the server generated {chunk.predicted - streamed} more token(s) of an unfinished "
                                 "character and did not stream them (llama-server streams a split character only "
                                 "once it is whole): not shown")
                if chunk.predicted is not None:
                    predicted = chunk.predicted
                if chunk.text:
                    self.text.append(chunk.text)
                for k, (token, merged) in enumerate(tokens):
                    latency_ms = (now - last) * 1000.0 if k == 0 else 0.0
                    reissue = None
                    if not got_first:
                        got_first = True
                        if first and self.index == 0:
                            self.ttft_ms = latency_ms
                            yield PrefillEvent(tokens=len(self.prompt_ids), ms=latency_ms,
                                               kv_tokens=len(self.prompt_ids), kv_bytes=None,
                                               reused_tokens=chunk.cached if self.follow_up else 0)
                        else:
                            reissue = latency_ms
                    if self.index > self.first:
                        self.decode_ms += latency_ms
                    # the server's own text for a token whose bytes it does not give (vLLM names ids only)
                    fallback = chunk.text if len(tokens) == 1 else ""
                    yield self._step(token, merged, settings, changed, latency_ms, reissue, fallback)
                    changed = False
                    if self._limit_reason():
                        return "length"
                last = now
                if chunk.finish_reason is not None:
                    finish = chunk.finish_reason
                if e.stopping(self.run_id) or e.paused or e.settings_pending() or (single and streamed):
                    break  # leaving the `with` closes the stream: the server stops generating
        if e.conn.cancelled or e.stopping(self.run_id):
            return "stopped" if e.stopping(self.run_id) else None
        if e.paused or e.settings_pending() or (single and streamed):
            return None
        if finish in ("eos", "stop", "word") and not e.options.ignore_eos:
            return "eos"
        if finish in ("limit", "length"):
            if self.generated and e.facts.max_context and len(self.prompt_ids) + len(self.generated) >= \
                    e.facts.max_context:
                return "context"
            return "length"
        if finish is None:
            raise ServerError(f"{e.conn.address.url}{path}: the stream ended without a finish reason "
                              "(cut mid-answer)")
        return None if e.options.ignore_eos else "eos"

    def _expand(self, chunk: WireChunk, predicted_before: int) -> list[tuple[WireToken, bool]]:
        """The chunk's tokens, with the ones llama-server merged into one entry (the tokens of a character split
        over several) taken apart: (token, merged) pairs, merged True for the ones not streamed on their own."""
        tokens = chunk.tokens
        if not (chunk.predicted is not None and len(tokens) == 1 and chunk.predicted - predicted_before > 1):
            for t in tokens:
                self._learn_own(t)
            return [(t, False) for t in tokens]
        count = chunk.predicted - predicted_before
        entry = tokens[0]
        parts = self._split(entry, count)
        if parts is None:
            if not self.said_merge:
                self.said_merge = True
                # shown as one step: the server did not say which tokens made the character
            self._learn_own(entry)
            return [(entry, False)]
        out = [(WireToken(i, b, None, [], entry.post_sampler), True) for i, b in parts[:-1]]
        last_id, last_bytes = parts[-1]
        self.e.vocab.learn(last_id, last_bytes)
        for alt in entry.alternatives:
            if alt.id != last_id:
                self.e.vocab.learn(alt.id, alt.data, alt.text)
        return out + [(replace(entry, data=last_bytes), False)]

    def _learn_own(self, token: WireToken) -> None:
        learn_token(self.e.vocab, token)

    def _split(self, entry: WireToken, count: int) -> list[tuple[int, bytes]] | None:
        """The `count` tokens behind a merged entry, from the server's tokenization of their text: accepted only
        when it is `count` tokens ending with the entry's id and their bytes make the entry's bytes."""
        if entry.data is None or entry.id is None:
            return None
        try:
            text = entry.data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        answer = self.e.conn.post_json("/tokenize", {"content": text, "add_special": False, "parse_special": False,
                                                     "with_pieces": True}, quiet_statuses=QUIET)
        tokens = read_tokens(answer, f"{self.e.conn.address.url}/tokenize") if answer is not None else None
        if tokens is None or len(tokens) != count:
            return None
        parts = []
        for t in tokens:
            data = t.piece if isinstance(t.piece, bytes) else t.piece.encode("utf-8") if t.piece is not None else None
            if data is None:
                return None
            parts.append((t.id, data))
        if parts[-1][0] != entry.id or b"".join(d for _, d in parts) != entry.data:
            return None
        return parts

    def _step(self, token: WireToken, merged: bool, settings: SamplerSettings, changed: bool, latency_ms: float,
              reissue: float | None, fallback: str = "") -> StepEvent:
        e = self.e
        vocab = e.vocab
        token_id = token.id if token.id is not None else -1
        if token.id is None:
            raise ServerError(f"{e.conn.address.url}: the stream does not name its tokens' ids (vLLM: it needs "
                              "return_tokens_as_token_ids, which tokentui asks for)")
        check_in_vocabulary(e.conn.address.url, e.facts.vocab_rows, token)
        vocab.learn(token_id, token.data)
        det = self.detok.push(token_id)
        if vocab.bytes_unknown(token_id) and not det.special:
            det = replace(det, text=fallback)  # not byte-exact: the server's text, as it sent it
        self.generated.append(token_id)
        raw = probs_kind(e) == "raw"

        def pick(p):
            return as_raw_or_post(raw, p)

        candidates = []
        chosen_rank = None
        for rank, alt in enumerate(token.alternatives):
            if alt.id is None:
                continue
            r, p = pick(alt.prob)
            candidates.append(Candidate(id=alt.id, piece=self._piece(alt.id), raw_prob=r, prob=p,
                                        special=vocab.is_special(alt.id)))
            if alt.id == token_id and chosen_rank is None and raw:
                chosen_rank = rank  # the server's list is sorted by raw probability: the rank among all tokens
        chosen_raw, chosen_post = pick(token.prob) if token.prob is not None else (None, None)
        kv_tokens = len(self.prompt_ids) + self.index
        step = StepEvent(
            index=self.index, id=token_id, piece=self._piece(token_id), special=det.special, text=det.text,
            pending_hex=det.pending.hex(" "), pending_needed=det.pending_needed, completed_chars=list(det.completed),
            candidates=candidates, chosen_rank=chosen_rank, chosen_raw_prob=chosen_raw, chosen_prob=chosen_post,
            kept_count=None, kept_mass=None, entropy_bits=None, sampled_entropy_bits=None,
            greedy=settings.is_greedy, settings=settings, settings_changed=changed, latency_ms=latency_ms,
            forward_ms=None, kv_tokens=kv_tokens, kv_bytes=None, reissue_ttft_ms=reissue,
            server_kv_usage=self._kv_usage(), merged=merged)
        self.index += 1
        return step

    def _piece(self, token_id: int) -> str:
        return token_piece(self.e.vocab, token_id)

    def _kv_usage(self) -> float | None:
        return self.kv.latest

    def _done(self, reason: str) -> DoneEvent:
        e = self.e
        ending = self.detok.end()
        n = len(self.generated) - self.first
        text = self.text_before + "".join(self.text)
        vocab_rows = e.facts.vocab_rows
        return DoneEvent(
            reason=reason, tokens=n, runs=n, scores=n * vocab_rows if vocab_rows else None, ttft_ms=self.ttft_ms,
            decode_tok_s=(n - 1) / (self.decode_ms / 1000.0) if n > 1 and self.decode_ms > 0 else None,
            text=text, prompt_tokens=len(self.prompt_ids), flushed=ending.text,
            kv_tokens=len(self.prompt_ids) + max(0, len(self.generated) - 1), kv_bytes=None, paused_ms=self.paused_s * 1000.0,
            dropped_hex=ending.dropped_hex, dropped_needed=ending.dropped_needed)


# ---- what a run and a fan-out (core/server/fanout.py) read the same way ------------------------------------------
def learn_token(vocab, token: WireToken) -> None:
    """What a streamed token tells the vocabulary: its own bytes (its alternatives' entry for it, else its own),
    and each alternative's."""
    own = next((a for a in token.alternatives if a.id == token.id and a.id is not None), None)
    vocab.learn(token.id, own.data if own is not None else token.data, token.text)
    for alt in token.alternatives:
        vocab.learn(alt.id, alt.data, alt.text)


def check_in_vocabulary(url: str, rows: int | None, token: WireToken) -> None:
    """A ServerError when the token or an alternative names an id past the model's `rows` tokens (None: the server
    did not say how many it has, nothing to check against)."""
    if rows is None:
        return
    for named in (token.id, *(a.id for a in token.alternatives if a.id is not None)):
        if named is not None and named >= rows:
            raise ServerError(f"{url}: the stream names token id {named}, but the server's model has {rows} tokens "
                              f"(ids 0..{rows - 1})")


def probs_kind(engine: Served) -> str:
    """What the server's per-token numbers are: "raw", "post-sampler" or "unknown" (--server-probs, the probe)."""
    return engine.facts.server.probs if engine.facts.server else "unknown"


def as_raw_or_post(raw: bool, p: float | None) -> tuple[float | None, float | None]:
    """(raw, post-sampler) for the server's number `p`: under the name it has, the other None (not reported). A
    number not known to be either is kept as the post-sampler one, and the record's `server.probs` says "unknown"."""
    return (p if raw else None), (None if raw else p)


def token_piece(vocab, token_id: int) -> str:
    """A token's piece as shown: the server's own text for one whose bytes it did not give (its /detokenize), else
    its bytes; safe to print either way."""
    if vocab.bytes_unknown(token_id):
        return display_text(vocab.token_string(token_id) or f"token_id:{token_id}")
    return display_piece(vocab, token_id)
