"""`ServerEngine`: a model served by another engine, watched with the local engine's interface and events.

One run is one or more streamed completions of the same prefix: the prompt's ids (rendered and tokenized by the
server, core/server/prompt.py) plus the tokens so far. The first request's time to its first token is the
PrefillEvent's; a temperature / top-p / top-k change, a pause, or a single step closes the stream (the server stops
when its client goes) and re-issues the request from the current prefix with the settings then in force; that
request's first step carries its time to first token (`reissue_ttft_ms`). Every time is measured here, between the
request's send and each token's arrival, with the network inside it. What the server does not report is None.

A fault (the server gone, a refused request, a stream cut short, a read timeout) is a ServerError: it ends the run
with an `error` event that says it in one line (kind "server") and a `done` with reason "error", as every engine's
failure does (core/interface.py), so the record keeps what came before and ends with `done`.

The API key never leaves in what a run yields: each run's, branch's and fan-out's events pass through the
connection's KeyMask (core/server/key_mask.py), which masks the key in the text the server generates, split over
tokens or not, before anything records, prints or draws it. Token ids pass as the server sent them.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from ..runs.branch_point import BranchPoint
from ..runs.events import Event, LoadProgress, Notice
from ..runs.explore_events import FanoutEvent
from ..runs.facts import ModelFacts
from ..interface import BaseEngine
from ..samplers import SERVER_KINDS, ignored_by, served_sampler
from ..settings import RunOptions, SamplerSettings
from ..errors import ServerError
from .http import DEFAULT_KEY_ENV, Connection, ServerAddress, api_key, key_for
from .probe import QUIET, Dialect, probe, served_model
from .completions import ServerRun
from .fanout import ServerFanout, refusal as fanout_refusal
from .vocab import ServerVocab, read_text, read_tokens


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How to reach the server (the `--server*` flags), checked as built."""

    url: str
    model: str | None = None
    key_env: str = DEFAULT_KEY_ENV
    probs: str = "auto"  # "auto" | "raw" | "post-sampler": what the server's per-token probabilities are
    # seconds the server may take to the first token, between two tokens, or for a whole JSON answer (inf: no limit)
    timeout: float = 60.0
    # whether the API key may go to `url`: only when the user named it on the command line (--server), never when
    # it came from a file (a record's server, which `tokentui branch` would otherwise send the key to)
    send_key: bool = True
    # --allow-plain-http-key: the key may go over plain http:// to another host (refused without it: http.key_for)
    allow_plain_http_key: bool = False

    def __post_init__(self) -> None:
        if self.probs not in ("auto", "raw", "post-sampler"):
            raise ServerError(f"--server-probs must be auto, raw or post-sampler, got {self.probs!r}")
        t = self.timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:  # NaN fails `> 0` too
            raise ServerError(f"--server-timeout must be a number of seconds > 0 (inf: no limit), got {t!r}")
        ServerAddress.parse(self.url)  # a bad URL is refused here, before anything connects
        self.key  # noqa: B018 - and a key that would cross plain http:// to another host, before anything connects

    @property
    def key(self) -> str | None:
        """The API key for this server: from the environment, only for a server named on the command line, and not
        over plain http:// to another host without --allow-plain-http-key (a ServerError: http.key_for)."""
        if not self.send_key:
            return None
        return key_for(ServerAddress.parse(self.url), api_key(self.key_env), self.key_env, self.allow_plain_http_key)


class ServerEngine(BaseEngine):
    """The engine interface (core/interface.py) over a served model."""

    def __init__(self, conn: Connection, facts: ModelFacts, dialect: Dialect, sampler: SamplerSettings | None = None,
                 options: RunOptions | None = None) -> None:
        super().__init__(sampler)  # the controls: settings, pause / step, stop (core/controls.py)
        self.conn = conn
        self.facts = facts
        self.dialect = dialect
        self.options = options or RunOptions()
        self.vocab = ServerVocab(self._lookup)
        self._model_lock = threading.Lock()
        self._warning = conn.address.plain_http_warning(conn.sends_key)  # said at the first run's start
        # as the server names it (the facts show it with the key masked)
        self.model_id = dialect.model or (facts.server.model if facts.server is not None else facts.name)
        self._one_request = False  # a fan-out's request is streaming: a settings change leaves it be

    @staticmethod
    def check(server: ServerOptions) -> None:
        """Raise the one-line ServerError `connect` would for an unreachable server, a refused key or an unknown
        --server-model, quickly and without the rest of the probe (the dashboard asks before it opens)."""
        conn = Connection(ServerAddress.parse(server.url), server.key, read_timeout=server.timeout)
        try:
            served_model(conn, server.model)
        finally:
            conn.close()

    @classmethod
    def connect(cls, server: ServerOptions, sampler: SamplerSettings | None = None,
                options: RunOptions | None = None,
                progress: Callable[[LoadProgress], None] = lambda p: None) -> "ServerEngine":
        address = ServerAddress.parse(server.url)
        started = time.perf_counter()
        progress(LoadProgress(f"asking {address.url} what it serves", None))
        options = options or RunOptions()
        conn = Connection(address, server.key, read_timeout=server.timeout)
        try:
            facts, dialect = probe(conn, server.model, server.probs, options.top_candidates, started)
        except BaseException:
            conn.close()
            raise
        return cls(conn, facts, dialect, sampler, options)

    # ------------------------------------------------------------------------------------------- controls
    # core/controls.py's, and each closes the stream in progress: the server stops when its client goes, and the
    # run re-issues its request from the prefix (new settings, a resume, a single step) or ends (stop)
    def set_sampler(self, settings: SamplerSettings) -> SamplerSettings:
        """New settings; the stream in progress is closed and re-issued from the prefix with them."""
        before = self.sampler
        new = super().set_sampler(settings)
        if new != before and not self._one_request:  # a fan-out keeps the settings it started with
            self.conn.cancel()
        return new

    def pause(self) -> None:
        """Stop reading: the stream is closed (the server stops), and the next step is asked for on resume or a
        single step."""
        super().pause()
        self.conn.cancel()

    def stop(self, run_id: int | None = None) -> None:
        super().stop(run_id)
        self.conn.cancel()

    def close(self) -> None:
        super().close()
        self.conn.close()

    # ------------------------------------------------------------------------------------------- the run
    def _run(self, prompt: str, system: str | None, run_id: int) -> Iterator[Event]:
        """Events as the local engine's: [Notice], PromptEvent, PrefillEvent, StepEvent..., DoneEvent; a server
        fault raises ServerError (the interface's error and done events)."""
        with self._model_lock:
            if self._warning:
                yield Notice(self._warning)
                self._warning = None
            ignored = ignored_by(self.sampler, self.server_kind)
            if ignored:  # the chain's stages this server has no request field for
                yield Notice(f"{self.dialect.engine or 'this server'} has no {', '.join(ignored)}: it samples "
                             f"without {'it' if len(ignored) == 1 else 'them'}")
            yield from self.conn.key_mask().events(ServerRun(self, run_id).events(prompt, system))

    turn_refusal = None  # a follow-up sends the whole conversation; a raw run, its text's ids

    def _turn(self, request, run_id: int) -> Iterator[Event]:
        """A turn of a conversation, or a raw run (core/server/completions.py `ServerRun.turn`): the local engine's
        events; what the server's cache reused is None (not known) unless it reports it."""
        with self._model_lock:
            if self._warning:
                yield Notice(self._warning)
                self._warning = None
            yield from self.conn.key_mask().events(ServerRun(self, run_id).turn(request))

    def _branch(self, point: BranchPoint, run_id: int) -> Iterator[Event]:
        """A branch of an earlier run of this server (core/model/branch.py's events: BranchEvent, PrefillEvent, the forced
        StepEvent at `point.at`, steps, done): the prefix is sent as ids with the forced token after it, so the
        server's prefix cache, not tokentui, decides what is reused (kv_reused_tokens 0: not known here)."""
        with self._model_lock:
            yield from self.conn.key_mask().events(ServerRun(self, run_id).branch(point))

    @property
    def server_kind(self) -> str:
        """The server kind core/samplers.py names request fields by: llama.cpp, vLLM, SGLang, else OpenAI."""
        return self.dialect.engine if self.dialect.engine in SERVER_KINDS else "OpenAI"

    @property
    def fanout_refusal(self) -> str | None:
        return fanout_refusal(self.dialect)

    def _fanout(self, request, run_id: int) -> Iterator[Event]:
        """A fan-out as one request for `n` completions (core/server/fanout.py; the local engine's events)."""
        with self._model_lock:
            for event in self.conn.key_mask().events(ServerFanout(self, run_id).events(request)):
                yield event
                if self._warning and isinstance(event, FanoutEvent):  # said after it: the fan-out event comes first
                    yield Notice(self._warning)
                    self._warning = None

    @contextmanager
    def fanning_out(self):
        """While a fan-out's one request streams: a settings change does not close it (they apply to the next
        run, as for the local engine's fan-out); a pause or a stop still does."""
        self._one_request = True
        try:
            yield
        finally:
            self._one_request = False

    def _lookup(self, token_id: int) -> tuple[bytes | None, str, bool]:
        """A token the stream did not spell out, asked of the server: (its bytes when whole UTF-8, the text the
        server renders, special: its text tokenized as plain text is not that one token)."""
        body = {"tokens": [token_id]} if self.dialect.llama_cpp else {"model": self.model_id, "tokens": [token_id]}
        url = self.conn.address.url
        try:  # a lookup the server cannot answer now leaves the token's bytes unknown; a malformed answer is an error
            answer = self.conn.post_json("/detokenize", body, quiet_statuses=QUIET)
        except ServerError:
            answer = None
        text = (read_text(answer, ("content", "prompt"), f"{url}/detokenize") if answer is not None else None) or ""
        if not text or "\ufffd" in text:
            return None, text, False
        if self.dialect.llama_cpp:
            again = {"content": text, "add_special": False, "parse_special": False}
        else:
            again = {"model": self.model_id, "prompt": text, "add_special_tokens": False}
        try:
            answer = self.conn.post_json("/tokenize", again, quiet_statuses=QUIET)
        except ServerError:
            answer = None
        tokens = read_tokens(answer, f"{url}/tokenize") if answer is not None else None
        special = tokens is not None and [t.id for t in tokens] != [token_id]
        return (None if special else text.encode("utf-8")), text, special

    def request_body(self, prefix: list[int], settings: SamplerSettings, max_tokens: int) -> tuple[str, dict]:
        """The streamed request for `max_tokens` more tokens after `prefix`, with `settings`: the sampler chain's
        fields under this server's names (core/samplers.py `served_sampler`: llama-server gets every stage's
        settings and the chain's order as its `samplers`, so nothing else runs; vLLM and SGLang the settings they
        have of the stages that are on, applied in their own fixed order)."""
        sampler, order = served_sampler(settings, self.server_kind)
        top = self.facts.server.top_logprobs if self.facts.server else self.options.top_candidates
        if self.dialect.llama_cpp:
            return "/completion", {
                "prompt": prefix, "n_predict": max_tokens, "stream": True, "n_probs": top,
                "post_sampling_probs": self.facts.server.probs == "post-sampler", "cache_prompt": True,
                "return_tokens": True, **sampler,
                # each chunk with the server's timings: the first token's says what its prompt cache reused (cache_n)
                "timings_per_token": True,
                "samplers": order, "ignore_eos": self.options.ignore_eos,
            }
        body = {"model": self.model_id, "prompt": prefix, "max_tokens": max_tokens, "stream": True,
                "logprobs": top, **sampler, "stream_options": {"include_usage": True}}
        if self.dialect.engine in ("vLLM", "SGLang"):
            body["ignore_eos"] = self.options.ignore_eos
            body["skip_special_tokens"] = False
        if self.dialect.engine == "vLLM":
            body["return_tokens_as_token_ids"] = True
        return "/v1/completions", body
