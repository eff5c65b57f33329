"""Fan-out on a served model: N continuations of M tokens from one step, asked of the server as ONE streamed
/v1/completions request with `n = N` (core/model/fanout.py is the local engine's; the events are the same):

    FanoutEvent, [Notice...], PrefillEvent, SampleEvent × N, DoneEvent

Which servers: vLLM and SGLang honour `n` on /v1/completions with per-token log-probabilities for every choice
(vLLM's SamplingParams.n, SGLang's CompletionRequest.n; each choice streamed with its `index`). llama-server does
not: its OpenAI-compatible endpoint refuses n > 1 ("Only one completion choice is allowed"), and its own
/completion has no `n`; a server tokentui could not identify (probe.py's "OpenAI-compatible") is not known to. The
engine kind is the probe's (core/server/probe.py: llama-server's /props, the `owned_by` of /v1/models); the
others keep the one-line refusal, `refusal(dialect)`.

The request is the run's (ServerEngine.request_body: the prefix as token ids, `max_tokens = M`, the sampler
settings, `logprobs`) with `n` and the request's seed. The server's seed is for the request: per-sample seeds
s + i cannot be asked of it (how it seeds each choice is its own), so a sample is not promised to be reproducible
on its own; every sample records the seed that was sent (s). What the server gives per token — the id, the number its logprobs mode gives (raw or post-sampler, as
--server-probs / the probe say: core/server/completions.py's rule), the alternatives — is read by core/server/wire.py's
checked readers; what it does not give is None (a sample's `logprob` when its post-sampler numbers are not known,
the KV figures, the step's candidates' other probability). Times are measured here: the PrefillEvent's is the time
to the first token of any choice.

A settings change does not touch the request (one fan-out, one set of settings, as locally); a stop or a pause
closes the stream (the server stops) and the samples end where they are, reason "stopped" (a served fan-out is one
request: it is not re-issued on resume). A malformed chunk, a choice the server never finished or never sent, is a
ServerError: the run's error event (kind server) and done.
"""

from __future__ import annotations

import math
import time
from typing import Iterator

from ..errors import ServerError
from ..runs.ending import stopped_before_first_token
from ..runs.events import Candidate, DoneEvent, Event, Notice, PrefillEvent
from ..runs.explore_events import FanoutEvent, SampleEvent
from ..runs.requests import FanoutRequest
from ..steps.detokenize import IncrementalDetokenizer
from ..steps.display import display_text
from .completions import as_raw_or_post, check_in_vocabulary, learn_token, probs_kind, token_piece
from .probe import Dialect
from .served import Served
from .wire import WireToken, read_choices

__all__ = ["FANOUT_ENGINES", "ServerFanout", "refusal"]

FANOUT_ENGINES = ("vLLM", "SGLang")  # servers that return n completions with per-token logprobs (the docstring)


def refusal(dialect: Dialect) -> str | None:
    """Why this server cannot fan out, one line (None: it can)."""
    if dialect.engine in FANOUT_ENGINES:
        return None
    if dialect.llama_cpp:
        return "llama-server does not return n completions: fan-out needs the local engine"
    return (f"this server ({display_text(dialect.engine)}) is not known to return n completions (vLLM and SGLang "
            "do): fan-out needs the local engine")


class _Sample:
    """One choice as it streams in."""

    __slots__ = ("ids", "raw", "probs", "texts", "finish")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.raw: list[float | None] = []
        self.probs: list[float | None] = []
        self.texts: list[str] = []  # the server's own text of each chunk (its detokenization)
        self.finish: str | None = None


class ServerFanout:
    """One fan-out on a served engine, read through its public interface, `Served` (core/server/served.py: controls,
    connection, vocabulary)."""

    def __init__(self, engine: Served, run_id: int) -> None:
        self.e = engine
        self.run_id = run_id

    def events(self, request: FanoutRequest) -> Iterator[Event]:
        e = self.e
        self._check(request)
        settings, _ = e.take_settings()  # those in force as it starts
        n, m = request.n, request.m
        prefix = list(request.prompt_ids) + list(request.tokens)
        detok = IncrementalDetokenizer(e.vocab)
        for token in request.tokens:  # the prefix's text, as a branch's (bytes asked of the server)
            detok.push(token)
        start = dict(at=request.at, n=n, m=m, seed=request.seed, prompt_ids=list(request.prompt_ids),
                     tokens=list(request.tokens), prefix_text=detok.text, kv_reused_tokens=0, settings=settings,
                     parent=request.parent, parent_id=request.parent_token)
        go, paused_s = e.timed_gate(self.run_id)
        if not go:
            yield FanoutEvent(candidates=[], **start)
            yield stopped_before_first_token(len(request.prompt_ids), paused_ms=paused_s * 1000.0)
            return
        path, body = e.request_body(prefix, settings, m)
        body["n"] = n
        body["seed"] = request.seed  # the request's: the server does not take one per sample
        where = f"{e.conn.address.url}{path}"
        raw = probs_kind(e) == "raw"
        samples = [_Sample() for _ in range(n)]
        sent = time.perf_counter()
        first_ms: float | None = None
        last = sent
        with e.fanning_out(), e.conn.stream(path, body) as chunks:
            for obj in chunks:
                choices = read_choices(obj, n, where)
                now = time.perf_counter()
                for index, chunk in choices:
                    sample = samples[index]
                    if chunk.text and not chunk.tokens and not chunk.had_logprobs:
                        raise ServerError(f"{where}: the server sent tokens without log-probabilities (it does not "
                                          "support `logprobs` here): tokentui needs them")
                    if chunk.tokens:
                        chunks.token_arrived()
                        last = now
                    for token in chunk.tokens:
                        if first_ms is None:
                            first_ms = (now - sent) * 1000.0
                            yield from self._started(start, token, raw, settings, n, len(prefix), first_ms)
                        self._take(sample, token, raw, where)
                    if len(sample.ids) > m:
                        raise ServerError(f"{where}: choice {index} has {len(sample.ids)} tokens, more than the "
                                          f"{m} asked for")
                    if chunk.text:
                        sample.texts.append(chunk.text)
                    if chunk.finish_reason is not None:
                        sample.finish = chunk.finish_reason
                if e.stopping(self.run_id) or e.paused:
                    break  # leaving the `with` closes the stream: the server stops generating
        stopped = e.conn.cancelled or e.stopping(self.run_id) or e.paused
        if first_ms is None:
            if stopped:
                yield FanoutEvent(candidates=[], **start)
                yield stopped_before_first_token(len(request.prompt_ids), paused_ms=paused_s * 1000.0)
                return
            raise ServerError(f"{where}: the server sent no token for any of the {n} completions asked for")
        if stopped and e.paused and not e.stopping(self.run_id):
            yield Notice("paused: a served fan-out is one request, so its samples end where the server was (it is "
                         "not re-issued on resume)")
        reasons = [self._reason(s, k, n, stopped, len(prefix), where) for k, s in enumerate(samples)]
        for k, (sample, reason) in enumerate(zip(samples, reasons)):
            known = sample.probs and all(p is not None for p in sample.probs)
            logprob = sum(math.log(p) if p > 0 else -math.inf for p in sample.probs) if known else None
            yield SampleEvent(n=k, seed=request.seed, ids=sample.ids,
                              pieces=[token_piece(e.vocab, t) for t in sample.ids], text="".join(sample.texts),
                              raw_probs=sample.raw, probs=sample.probs, logprob=logprob, reason=reason)
        drawn = sum(len(s.ids) for s in samples)
        decoded = drawn - min(drawn, n)
        decode_s = last - sent - first_ms / 1000.0
        end = "stopped" if stopped else "eos" if all(r == "eos" for r in reasons) else "length"
        longest = max(len(s.ids) for s in samples)
        yield DoneEvent(reason=end, tokens=drawn, runs=1, scores=None, ttft_ms=first_ms,
                        decode_tok_s=decoded / decode_s if decoded and decode_s > 0 else None, text="",
                        prompt_tokens=len(request.prompt_ids), kv_tokens=len(prefix) + max(0, longest - 1),
                        kv_bytes=None, paused_ms=paused_s * 1000.0)

    def _check(self, request: FanoutRequest) -> None:
        request.check_vocabulary(self.e.facts.vocab_rows)
        request.check_context(self.e.facts.max_context)

    def _started(self, start: dict, first: WireToken, raw: bool, settings, n: int, prefix: int, ms: float
                 ) -> Iterator[Event]:
        """The fan-out event, once the first token has come: the step's candidates are the server's alternatives
        for it (every choice starts from the same prefix), under the name the server's numbers have."""
        e = self.e
        check_in_vocabulary(e.conn.address.url, e.facts.vocab_rows, first)
        learn_token(e.vocab, first)
        candidates = []
        for alt in first.alternatives:
            if alt.id is None:
                continue
            r, p = as_raw_or_post(raw, alt.prob)
            candidates.append(Candidate(id=alt.id, piece=token_piece(e.vocab, alt.id), raw_prob=r, prob=p,
                                        special=e.vocab.is_special(alt.id)))
        yield FanoutEvent(candidates=candidates, **start)
        yield Notice(f"the server draws the {n} samples from one request seeded {start['seed']}: it takes no seed "
                     f"per sample, so sample i is not promised to come again from seed {start['seed']} + i")
        if settings.is_greedy and n > 1:
            yield Notice(f"greedy decoding: all {n} samples are the same (raise the temperature to fan out)")
        yield PrefillEvent(tokens=prefix, ms=ms, kv_tokens=prefix, kv_bytes=None)

    def _take(self, sample: _Sample, token: WireToken, raw: bool, where: str) -> None:
        e = self.e
        if token.id is None:
            raise ServerError(f"{where}: the stream does not name its tokens' ids (vLLM: it needs "
                              "return_tokens_as_token_ids, which tokentui asks for)")
        check_in_vocabulary(e.conn.address.url, e.facts.vocab_rows, token)
        learn_token(e.vocab, token)
        r, p = as_raw_or_post(raw, token.prob)
        sample.ids.append(token.id)
        sample.raw.append(r)
        sample.probs.append(p)

    def _reason(self, sample: _Sample, index: int, n: int, stopped: bool, prefix: int, where: str) -> str:
        e = self.e
        if sample.finish in ("stop", "eos") and not e.options.ignore_eos:
            return "eos"
        if sample.finish == "length":
            limit = e.facts.max_context
            return "context" if limit and prefix + len(sample.ids) >= limit else "length"
        if stopped:
            return "stopped"
        if sample.finish is None:
            raise ServerError(f"{where}: completion {index} of the {n} asked for ended without a finish reason "
                              "(cut mid-answer, or the server does not honour n)")
        return "length" if e.options.ignore_eos else "eos"
