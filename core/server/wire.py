"""A streamed completion's chunks read into tokens: pure functions over the JSON the server sends.

Two shapes of per-token log-probabilities are read:
- the "content" list (llama-server on every endpoint; the chat shape of vLLM and SGLang): one entry per token with
  `token`, `logprob` (or `prob`: llama-server's post_sampling_probs), `bytes`, llama-server's `id`, and the
  alternatives in `top_logprobs` (`top_probs`);
- the classic completions shape (vLLM, SGLang): parallel lists `tokens`, `token_logprobs`, `top_logprobs` (a
  {token: logprob} dict per token).
A token named "token_id:N" (vLLM's return_tokens_as_token_ids) gives its id; "bytes:\\xe5\\xbc" (vLLM's form for
a token that is not whole UTF-8) gives its bytes. What a shape does not carry stays None.

Every value is checked as it is read (core/server/shape.py): a chunk that is not an object, a text that is not a
string, an id outside 0..2^31-1, a log-probability above 0 or a probability outside 0..1, NaN: a ServerError naming
the field, so the run ends with one line and every record written from a server is one tokentui reads back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import ServerError
from .http import shown
from .shape import (MAX_TOKEN_ID, byte_list, logprob, obj, opt_bool, opt_int, opt_list, opt_obj, opt_str,
                    probability, token_id, wrong)

_TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")
_BYTES = re.compile(r"^bytes:((?:\\x[0-9a-fA-F]{2})+)$")


@dataclass(frozen=True, slots=True)
class WireAlt:
    """One alternative the server reported for a position: id (None: not named), its bytes (None: not given), its
    probability (exp of the logprob, or the server's own `prob`)."""

    id: int | None
    data: bytes | None
    prob: float
    text: str = ""


@dataclass(frozen=True, slots=True)
class WireToken:
    """One generated token as the server reported it; `post_sampler` is True when the numbers are the server's
    post-sampling probabilities (llama-server's `prob` / `top_probs` keys), False for log-probabilities."""

    id: int | None
    data: bytes | None
    prob: float | None
    alternatives: list[WireAlt] = field(default_factory=list)
    post_sampler: bool = False
    text: str = ""


@dataclass(frozen=True, slots=True)
class WireChunk:
    tokens: list[WireToken]
    text: str  # the text this chunk added (the server's own detokenization)
    finish_reason: str | None
    had_logprobs: bool  # the chunk carried a logprobs object (False: the server sent none)
    # llama-server's native /completion only: tokens generated so far in this request (it streams the tokens of
    # an unfinished character as one entry, so this can jump by more than one), and whether this is its final chunk
    predicted: int | None = None
    final: bool = False
    # llama-server's native /completion: prompt tokens it took from its own cache for this request (its
    # `timings.cache_n`, or `tokens_cached` where that is all it says); None: not reported
    cached: int | None = None


def _value(value, post_sampler: bool, where: str) -> float | None:
    """A probability as the server wrote it (its post-sampling `prob`, or a `logprob`); None when not given."""
    if value is None:
        return None
    return probability(value, where) if post_sampler else logprob(value, where)


def token_identity(token: object, explicit_id: object = None, raw_bytes: object = None, where: str = "a token"
                   ) -> tuple[int | None, bytes | None, str]:
    """(id, bytes, text) of a token as a server names it; a ServerError for a value of the wrong shape."""
    if token is not None and not isinstance(token, str):
        raise wrong(where, "a token should be text", token)
    text = token or ""
    tid = None if explicit_id is None else token_id(explicit_id, f"{where}: id")
    data = byte_list(raw_bytes, f"{where}: bytes")
    match = _TOKEN_ID.match(text)
    if match:
        if tid is None:
            digits = match.group(1)  # a thousand-digit number is not parsed: no id has more than 10 digits
            if len(digits) > 11 or not 0 <= int(digits) <= MAX_TOKEN_ID:
                raise wrong(where, f"a token id should be an integer in 0..{MAX_TOKEN_ID}", text)
            tid = int(digits)
        text = ""
    else:
        match = _BYTES.match(text)
        if match:
            data = bytes(int(h, 16) for h in match.group(1).split("\\x")[1:]) if data is None else data
            text = ""
        elif data is None and "\ufffd" not in text and text:
            data = text.encode("utf-8")  # a whole-UTF-8 token's text is its bytes (strict_json left no lone surrogate)
    return tid, data, text


def _content_entry(entry, where: str) -> WireToken:
    entry = obj(entry, where)
    post = "prob" in entry and "logprob" not in entry
    token_id_, data, text = token_identity(entry.get("token"), entry.get("id"), entry.get("bytes"), where)
    alts = []
    key = "top_probs" if post else "top_logprobs"
    for n, alt in enumerate(opt_list(entry, key, where) or []):
        at = f"{where}.{key}[{n}]"
        alt = obj(alt, at)
        a_id, a_data, a_text = token_identity(alt.get("token"), alt.get("id"), alt.get("bytes"), at)
        prob = _value(alt.get("prob" if post else "logprob"), post, at)
        if prob is not None:
            alts.append(WireAlt(a_id, a_data, prob, a_text))
    prob = _value(entry.get("prob" if post else "logprob"), post, where)
    return WireToken(token_id_, data, prob, alts, post, text)


def _classic(logprobs: dict, where: str) -> list[WireToken]:
    tokens = opt_list(logprobs, "tokens", where) or []
    values = opt_list(logprobs, "token_logprobs", where) or []
    tops = opt_list(logprobs, "top_logprobs", where) or []
    out = []
    for n, token in enumerate(tokens):
        at = f"{where}.tokens[{n}]"
        token_id_, data, text = token_identity(token, where=at)
        alts = []
        top = tops[n] if n < len(tops) else None
        if top is not None and not isinstance(top, dict):
            raise wrong(f"{where}.top_logprobs[{n}]", "should be an object of token: logprob", top)
        for name, value in (top or {}).items():
            a_id, a_data, a_text = token_identity(name, where=f"{where}.top_logprobs[{n}]")
            prob = _value(value, False, f"{where}.top_logprobs[{n}][{shown(name, limit=40)!r}]")
            if prob is not None:
                alts.append(WireAlt(a_id, a_data, prob, a_text))
        alts.sort(key=lambda a: -a.prob)
        value = values[n] if n < len(values) else None
        out.append(WireToken(token_id_, data, _value(value, False, f"{where}.token_logprobs[{n}]"), alts, False,
                             text))
    return out


def read_native(data, where: str = "the stream") -> WireChunk:
    """One streamed value of llama-server's own /completion: `content`, `completion_probabilities` (the content
    shape), `tokens_predicted`; the last has `stop: true`, `stop_type` ("eos", "limit", "word") and the server's
    `timings`."""
    data = obj(data, where)
    probs = opt_list(data, "completion_probabilities", where)
    tokens = [_content_entry(e, f"{where}: completion_probabilities[{n}]") for n, e in enumerate(probs or [])]
    stop = opt_bool(data, "stop", where) is True
    predicted = opt_int(data, "tokens_predicted", where)
    stop_type = opt_str(data, "stop_type", where)
    timings = opt_obj(data, "timings", where)
    cached = opt_int(timings, "cache_n", f"{where}: timings") if timings is not None else None
    return WireChunk(tokens, opt_str(data, "content", where) or "", (stop_type or "stop") if stop else None,
                     probs is not None, predicted, stop, cached)


def read_chunk(data, where: str = "the stream") -> WireChunk:
    """One streamed `data:` value of /v1/completions or /v1/chat/completions."""
    data = obj(data, where)
    opt_obj(data, "usage", where)  # not used, but a usage that is not an object is not this API's chunk
    choices = opt_list(data, "choices", where)
    if not choices:
        return WireChunk([], "", None, False)
    return _choice(choices[0], f"{where}: choices[0]")


def read_choices(data, n: int, where: str = "the stream") -> list[tuple[int, WireChunk]]:
    """One streamed `data:` value of /v1/completions asked for `n` completions (a fan-out): each choice it carries
    as (its `index`, 0..n-1, its tokens). A server interleaves the choices' chunks, so the index is required when
    n > 1 (a choice without one cannot be placed)."""
    data = obj(data, where)
    opt_obj(data, "usage", where)
    out = []
    for k, choice in enumerate(opt_list(data, "choices", where) or []):
        at = f"{where}: choices[{k}]"
        index = opt_int(obj(choice, at), "index", at, high=n - 1)
        if index is None:
            if n > 1:
                raise wrong(at, f"index should name one of the {n} completions asked for", None)
            index = 0
        out.append((index, _choice(choice, at)))
    return out


def _choice(choice, at: str) -> WireChunk:
    """One choice of a /v1/completions or /v1/chat/completions chunk."""
    choice = obj(choice, at)
    text = opt_str(choice, "text", at)
    if text is None:
        delta = opt_obj(choice, "delta", at)
        text = opt_str(delta, "content", f"{at}.delta") if delta is not None else None
    logprobs = opt_obj(choice, "logprobs", at)
    tokens: list[WireToken] = []
    if logprobs is not None:
        content = opt_list(logprobs, "content", f"{at}.logprobs")
        if content is not None:
            tokens = [_content_entry(e, f"{at}.logprobs.content[{n}]") for n, e in enumerate(content)]
        elif "tokens" in logprobs:
            tokens = _classic(logprobs, f"{at}.logprobs")
    return WireChunk(tokens, text or "", opt_str(choice, "finish_reason", at), logprobs is not None)


__all__ = ["ServerError", "WireAlt", "WireChunk", "WireToken", "read_choices", "read_chunk", "read_native",
           "token_identity"]
