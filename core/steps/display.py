"""How a token is drawn: its text or bytes on one line, with invisible characters made visible.

`display_text` is the one whitespace / control-character mapping (spaces as `␣`, newlines as `↵`, ...), used by
the engine and the dashboard's panels; `display_bytes` adds `<0xNN>` for bytes that are not a character on their
own; `display_piece` is step 2's display form of a token id (special tokens as their literal text).

Never imports textual: the engine, `--headless --json` and the benchmarks use it too.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from .token_bytes import token_bytes

__all__ = ["display_text", "display_bytes", "display_piece", "invisible"]

# What the dashboard draws instead of invisible characters. Every space is shown, not only a leading one: a
# token like "  " (two spaces, common in code) would otherwise look empty.
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
# Other characters a terminal draws as nothing (or as a blank that looks like a space): named where a name is well
# known, else escaped as <U+XXXX> (`invisible`). A no-break space (U+00A0) drew as a blank in the lens.
_NAMED = {"\u00a0": "<NBSP>", "\u00ad": "<SHY>", "\u200b": "<ZWSP>", "\u200c": "<ZWNJ>", "\u200d": "<ZWJ>",
          "\u200e": "<LRM>", "\u200f": "<RLM>", "\u2060": "<WJ>", "\ufeff": "<BOM>"}
_INVISIBLE_KINDS = ("Zs", "Zl", "Zp", "Cf", "Co", "Cn", "Cs")  # spaces, separators, format, private, unassigned


def invisible(c: str) -> str | None:
    """The visible form of a character a terminal would not show (None: it shows, or `display_text` maps it)."""
    named = _NAMED.get(c)
    if named is not None:
        return named
    if c != " " and unicodedata.category(c) in _INVISIBLE_KINDS:
        return f"<U+{ord(c):04X}>"
    return None


def display_text(text: str) -> str:
    """The one display mapping of a token's text, on one line: every space `␣`, newline `↵`, tab `⇥`, carriage
    return `␍`, other control characters (which would move the terminal's cursor) `<0xNN>`, other characters a
    terminal draws as nothing or as a blank (a no-break space, a zero-width joiner) named (`<NBSP>`) or escaped
    (`<U+3000>`), and nothing at all `∅` (never a blank cell). Used by `display_piece` here and by the dashboard's
    panels; a text already in display form comes back unchanged.
    """
    out = []
    for c in text:
        v = _VISIBLE.get(c) or (invisible(c) if c >= "\x80" else None)
        if v is not None:
            out.append(v)
        elif c < " " or c == "\x7f":
            out.append(f"<0x{ord(c):02X}>")
        else:
            out.append(c)
    return "".join(out) or "∅"


def display_bytes(data: bytes) -> str:
    """Bytes as the dashboard shows them: characters where the bytes form whole UTF-8 characters, each
    remaining byte as `<0xNN>` (half of 开 shows as `<0xE5><0xBC>`).

    Uses the codec's `surrogateescape` handler to find the bytes that are not characters on their own: each
    such byte comes back as one lone surrogate U+DC80..U+DCFF.
    """
    text = data.decode("utf-8", errors="surrogateescape")
    out = []
    for c in text:
        if "\udc80" <= c <= "\udcff":
            out.append(f"<0x{ord(c) - 0xDC00:02X}>")
        else:
            out.append(display_text(c))
    return "".join(out)


def display_piece(tokenizer: Any, token_id: int) -> str:
    """The piece for `token_id` as the dashboard shows it (prompt table, candidates, chosen token).

    `␣Open` for " Open", `↵` for a newline, `<0xE5><0xBC>` for the first two bytes of 开, and a special token
    as its literal text (`<|im_end|>`). `tokenizer` may be a tokenizer or its `TokenBytes`.
    """
    tb = token_bytes(tokenizer)
    token_id = int(token_id)
    if tb.is_special(token_id):
        return tb.token_string(token_id) or ""
    return display_bytes(tb[token_id])

