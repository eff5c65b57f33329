"""A streamed completion's chunks read into tokens: pure functions over the JSON the server sends.

Two shapes of per-token log-probabilities are read:
- the "content" list (llama-server on every endpoint; the chat shape of vLLM and SGLang): one entry per token with
  `token`, `logprob` (or `prob`: llama-server's post_sampling_probs), `bytes`, llama-server's `id`, and the
  alternatives in `top_logprobs` (`top_probs`);
- the classic completions shape (vLLM, SGLang): parallel lists `tokens`, `token_logprobs`, `top_logprobs` (a
  {token: logprob} dict per token).
A token named "token_id:N" (vLLM's return_tokens_as_token_ids) gives its id; "bytes:\\xe5\\xbc" (vLLM's form for
a token that is not whole UTF-8) gives its bytes. What a shape does not carry stays None.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

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
    usage: dict | None = None
    # llama-server's native /completion only: tokens generated so far in this request (it streams the tokens of
    # an unfinished character as one entry, so this can jump by more than one), and its final chunk's extras
    predicted: int | None = None
    final: dict | None = None


def _as_prob(value, post_sampler: bool) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    if post_sampler:
        return float(value)
    if value < -1e30:  # llama-server writes the lowest float for a zero probability (JSON has no -inf)
        return 0.0
    return math.exp(value)


def token_identity(token: object, explicit_id: object = None, raw_bytes: object = None) -> tuple[int | None, bytes | None, str]:
    """(id, bytes, text) of a token as a server names it."""
    text = token if isinstance(token, str) else ""
    token_id = explicit_id if isinstance(explicit_id, int) and not isinstance(explicit_id, bool) else None
    data = bytes(raw_bytes) if isinstance(raw_bytes, list) and all(isinstance(b, int) and 0 <= b < 256
                                                                   for b in raw_bytes) else None
    match = _TOKEN_ID.match(text)
    if match:
        token_id = int(match.group(1)) if token_id is None else token_id
        text = ""
    else:
        match = _BYTES.match(text)
        if match:
            data = bytes(int(h, 16) for h in match.group(1).split("\\x")[1:]) if data is None else data
            text = ""
        elif data is None and "\ufffd" not in text and text:
            data = text.encode("utf-8")  # a whole-UTF-8 token's text is its bytes
    return token_id, data, text


def _content_entry(entry: dict) -> WireToken:
    post = "prob" in entry and "logprob" not in entry
    token_id, data, text = token_identity(entry.get("token"), entry.get("id"), entry.get("bytes"))
    alts = []
    for alt in entry.get("top_probs" if post else "top_logprobs") or []:
        if not isinstance(alt, dict):
            continue
        a_id, a_data, a_text = token_identity(alt.get("token"), alt.get("id"), alt.get("bytes"))
        prob = _as_prob(alt.get("prob" if post else "logprob"), post)
        if prob is not None:
            alts.append(WireAlt(a_id, a_data, prob, a_text))
    return WireToken(token_id, data, _as_prob(entry.get("prob" if post else "logprob"), post), alts, post, text)


def _classic(logprobs: dict) -> list[WireToken]:
    tokens = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or []
    out = []
    for n, token in enumerate(tokens):
        token_id, data, text = token_identity(token)
        alts = []
        top = tops[n] if n < len(tops) and isinstance(tops[n], dict) else {}
        for name, value in top.items():
            a_id, a_data, a_text = token_identity(name)
            prob = _as_prob(value, False)
            if prob is not None:
                alts.append(WireAlt(a_id, a_data, prob, a_text))
        alts.sort(key=lambda a: -a.prob)
        out.append(WireToken(token_id, data, _as_prob(values[n] if n < len(values) else None, False), alts,
                             False, text))
    return out


def read_native(obj: dict) -> WireChunk:
    """One streamed object of llama-server's own /completion: `content`, `completion_probabilities` (the content
    shape), `tokens_predicted`; the last has `stop: true`, `stop_type` ("eos", "limit", "word"), `tokens_cached`
    and the server's `timings`."""
    probs = obj.get("completion_probabilities")
    tokens = [_content_entry(e) for e in probs if isinstance(e, dict)] if isinstance(probs, list) else []
    stop = obj.get("stop") is True
    predicted = obj.get("tokens_predicted")
    final = {k: obj[k] for k in ("tokens_cached", "timings", "truncated") if k in obj} if stop else None
    return WireChunk(tokens, obj.get("content") or "", str(obj.get("stop_type") or "stop") if stop else None,
                     isinstance(probs, list), None, predicted if isinstance(predicted, int) else None, final)


def read_chunk(obj: dict) -> WireChunk:
    """One streamed `data:` object of /v1/completions or /v1/chat/completions."""
    choices = obj.get("choices") or []
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    if not choices:
        return WireChunk([], "", None, False, usage)
    choice = choices[0] if isinstance(choices[0], dict) else {}
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta") or {}
        text = delta.get("content") if isinstance(delta, dict) else None
    logprobs = choice.get("logprobs")
    tokens: list[WireToken] = []
    if isinstance(logprobs, dict):
        content = logprobs.get("content")
        if isinstance(content, list):
            tokens = [_content_entry(e) for e in content if isinstance(e, dict)]
        elif "tokens" in logprobs:
            tokens = _classic(logprobs)
    return WireChunk(tokens, text or "", choice.get("finish_reason"), isinstance(logprobs, dict), usage)
