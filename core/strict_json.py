"""JSON from outside (a server's answer, a record's line) parsed strictly, so what comes out is a value the rest of
tokentui can keep, write back and print:

- NaN, Infinity and -Infinity are refused: they are not JSON (Python's json module accepts them by default), and a
  record holding them would be written with them again;
- a value nested past Python's recursion limit is refused with a ValueError, not a RecursionError;
- a lone UTF-16 surrogate (`"\\ud800"`, which JSON allows and UTF-8 cannot encode) becomes U+FFFD, so the text can be
  written to a record or a terminal later.
"""

from __future__ import annotations

import json
import re

__all__ = ["loads"]

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # a \uD800..\uDFFF escape: a pair, or a lone surrogate


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes | str):
    """The JSON value in `data`; ValueError (one line, e.g. "NaN is not JSON", "it is nested too deeply") when
    there is none."""
    try:
        value = json.loads(data, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("it is nested too deeply") from None
    raw = data if isinstance(data, bytes) else data.encode("utf-8", errors="surrogatepass")
    if _SURROGATE_ESCAPE.search(raw):
        value = _whole(value)
    return value


def _whole(value):
    """`value` with every lone surrogate in its strings (keys included) replaced by U+FFFD. Depth-bounded: json has
    already parsed it without reaching the recursion limit."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", errors="surrogatepass").decode("utf-8", errors="replace")
    if isinstance(value, list):
        return [_whole(v) for v in value]
    if isinstance(value, dict):
        return {_whole(k): _whole(v) for k, v in value.items()}
    return value
