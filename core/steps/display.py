"""How a token is drawn: its text or bytes on one line, with invisible characters made visible.

`display_text` is the one whitespace / control-character mapping (spaces as `␣`, newlines as `↵`, ...), used by
the engine and the dashboard's panels; `display_bytes` adds `<0xNN>` for bytes that are not a character on their
own; `display_piece` is step 2's display form of a token id (special tokens as their literal text).

`printable_line` and `printable_text` are the safe-to-print forms of any string a server or a file supplied (an
error message, a notice, the answer's text): every control character a terminal would act on (an escape sequence
that sets the window title or clears the screen, a bell, a backspace) shown as `<0xNN>`, the same notation as a
piece's; a line keeps nothing that moves the cursor, the answer keeps its newlines and tabs.

Never imports textual: the engine, `--headless --json` and the benchmarks use it too.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import fields, is_dataclass, replace
from typing import Any

from .token_bytes import token_bytes

__all__ = ["display_text", "display_bytes", "display_piece", "invisible", "printable_copy", "printable_line",
           "printable_text"]

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
        elif c < " " or "\x7f" <= c <= "\x9f":  # C0, DEL and C1 (U+009B is a CSI to some terminals)
            out.append(f"<0x{ord(c):02X}>")
        else:
            out.append(c)
    return "".join(out) or "∅"


# Every control character (Unicode's Cc: C0, DEL, C1) as `<0xNN>`: str.translate, one C-level pass (the answer's text
# goes through it once per token in headless mode).
_CONTROLS = {c: f"<0x{c:02X}>" for c in (*range(0x20), *range(0x7F, 0xA0))}
_TEXT_CONTROLS = {c: v for c, v in _CONTROLS.items() if c not in (0x0A, 0x09)}  # the answer keeps \n and \t


def printable_line(text: str) -> str:
    """`text` (from a server, a record, an exception) safe to print as one line: every control character, newlines
    included, shown as `<0xNN>`. Idempotent: its output has no control character left."""
    return text.translate(_CONTROLS)


def printable_text(text: str) -> str:
    """The answer's text safe to print on a terminal: newlines and tabs kept (a carriage return only as part of
    "\r\n"), every other control character shown as `<0xNN>`."""
    if "\r\n" in text:
        return "\r\n".join(part.translate(_TEXT_CONTROLS) for part in text.split("\r\n"))
    return text.translate(_TEXT_CONTROLS)


_NEEDS_ESCAPE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # what printable_text changes (a lone \r too)


def printable_copy(value):
    """`value` (an event, any dataclass, a list, a string) with every string in it made printable_text, for a
    screen that draws it as it is (the dashboard draws text segments raw: an escape sequence in a record's answer
    would reach the terminal). The same object when nothing needed it, so the usual event costs one scan of its
    strings. The record keeps the original: only what is drawn is escaped."""
    return map_strings(value, lambda text: printable_text(text) if _NEEDS_ESCAPE.search(text) else text)


def map_strings(value, change):
    """`value` (an event, any dataclass, a list, a string) with `change` applied to every string in it; the same
    object when `change` returned each string as it was (so an event nothing changed is not copied)."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, list):
        items = [map_strings(v, change) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else items
    names = _FIELDS.get(type(value))
    if names is None:
        if not is_dataclass(value) or isinstance(value, type):
            return value
        names = _FIELDS[type(value)] = tuple(f.name for f in fields(value) if f.init)
    changes = {}
    for name in names:
        old = getattr(value, name)
        if old is None or old.__class__ in _PLAIN:
            continue
        new = map_strings(old, change)
        if new is not old:
            changes[name] = new
    return replace(value, **changes) if changes else value


_FIELDS: dict[type, tuple[str, ...]] = {}  # a dataclass's init fields, looked up once per class
_PLAIN = (int, float, bool)  # values with no string in them


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
    if tb.is_special(token_id):  # its text as the tokenizer (or a server) names it, safe to print
        return printable_line(tb.token_string(token_id) or "")
    return display_bytes(tb[token_id])

