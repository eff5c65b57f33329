"""Reading what a server sends into checked Python values: the field readers every message parser of core/server/
uses (wire.py's chunks, probe.py's listings, prompt.py's and vocab's tokenizations, kv.py's slots).

A server's answer is outside input: each value is checked where it is read, and a wrong one is a ServerError, one
line naming the message, the field and what came (escaped and cut), never an AttributeError deep in a run. A field
that is absent or null is "not reported" (None) unless the message cannot do without it; fields a reader does not
name are ignored (servers add fields).
"""

from __future__ import annotations

import json
import math

from ..errors import ServerError
from .http import shown

MAX_TOKEN_ID = 2**31 - 1  # no vocabulary comes near (the largest have ~260,000 entries); ids past it are garbage
_PROB_SLACK = 1e-4  # a probability a float's rounding put just past 1 (or a logprob just past 0) is read as 1


def preview(value) -> str:
    """A short, printable form of a value for an error line (a container by its kind, not its contents)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    try:
        return shown(json.dumps(value, ensure_ascii=False), limit=40)
    except (TypeError, ValueError):
        return shown(repr(value), limit=40)


def wrong(where: str, what: str, value) -> ServerError:
    return ServerError(f"{where}: {what}, got {preview(value)}")


def obj(value, where: str) -> dict:
    """`value` as a JSON object."""
    if not isinstance(value, dict):
        raise wrong(where, "should be a JSON object", value)
    return value


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def opt_int(data: dict, key: str, where: str, *, low: int = 0, high: int | None = None) -> int | None:
    """`data[key]` as an integer in low..high; None when absent or null."""
    value = data.get(key)
    if value is None:
        return None
    if not is_int(value) or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in {low}..{high}"
        raise wrong(where, f"{key} should be an integer {span}", value)
    return value


def _opt(data: dict, key: str, where: str, kind: type, what: str):
    """`data[key]` when it is a `kind` (bool is not an int here); None when absent or null."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, kind):
        raise wrong(where, f"{key} should be {what}", value)
    return value


def opt_str(data: dict, key: str, where: str) -> str | None:
    return _opt(data, key, where, str, "text")


def opt_bool(data: dict, key: str, where: str) -> bool | None:
    return _opt(data, key, where, bool, "true or false")


def opt_list(data: dict, key: str, where: str) -> list | None:
    return _opt(data, key, where, list, "a list")


def opt_obj(data: dict, key: str, where: str) -> dict | None:
    return _opt(data, key, where, dict, "an object")


def token_id(value, where: str) -> int:
    """A token id: an integer in 0..MAX_TOKEN_ID."""
    if not is_int(value) or not 0 <= value <= MAX_TOKEN_ID:
        raise wrong(where, f"a token id should be an integer in 0..{MAX_TOKEN_ID}", value)
    return value


def token_ids(value, where: str) -> list[int]:
    if not isinstance(value, list):
        raise wrong(where, "should be a list of token ids", value)
    return [token_id(v, f"{where}[{n}]") for n, v in enumerate(value)]


def byte_list(value, where: str) -> bytes | None:
    """A token's bytes as a list of 0..255 integers; None when absent or null."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(is_int(b) and 0 <= b < 256 for b in value):
        raise wrong(where, "bytes should be a list of integers in 0..255", value)
    return bytes(value)


def probability(value, where: str) -> float:
    """A probability in 0..1 (a rounding's overshoot read as 1)."""
    if not is_number(value) or not -_PROB_SLACK <= value <= 1 + _PROB_SLACK:
        raise wrong(where, "a probability should be a number in 0..1", value)
    return min(1.0, max(0.0, float(value)))


def logprob(value, where: str) -> float:
    """A log-probability (<= 0) as the probability it stands for. llama-server writes the lowest float for a zero
    probability (JSON has no -inf), vLLM -9999: both read as 0."""
    if not is_number(value) or value > _PROB_SLACK:
        raise wrong(where, "a log-probability should be a number <= 0", value)
    if value < -1e30:
        return 0.0
    return min(1.0, math.exp(value))


__all__ = ["MAX_TOKEN_ID", "byte_list", "is_int", "is_number", "logprob", "obj", "opt_bool", "opt_int", "opt_list",
           "opt_obj", "opt_str", "preview", "probability", "token_id", "token_ids", "wrong"]
