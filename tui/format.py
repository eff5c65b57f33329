"""Small formatting helpers shared by the panels (plain Python, no Textual)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from rich.cells import cell_len, set_cell_size
from rich.text import Text

from tokentui.core.runs import scoring
from tokentui.core.steps.display import display_text


def human_count(n: int | float) -> str:
    """135_000_000 -> '135M', 596_049_920 -> '596M', 1_540_000_000 -> '1.54B', 999 -> '999'."""
    n = float(n)
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            v = n / div
            if v >= 100:
                return f"{v:.0f}{unit}"
            if v >= 10:
                return f"{v:.1f}".rstrip("0").rstrip(".") + unit
            return f"{v:.2f}".rstrip("0").rstrip(".") + unit
    return f"{n:.0f}"


def human_bytes(n: int | float) -> str:
    """Binary units: 114688 -> '112 KiB', 1.5 MiB, 3.2 GiB."""
    n = float(n)
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if n >= 100 else f"{n:.1f} {unit}"
    return f"{n:.1f} TiB"  # pragma: no cover


def ms(value: float | None) -> str:
    """Milliseconds with sensible precision: 0.42 ms, 8.3 ms, 42 ms, 1,234 ms."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if value < 1:
        return f"{value:.2f} ms"
    if value < 10:
        return f"{value:.1f} ms"
    return f"{value:,.0f} ms"


def percent(p: float, digits: int = 1) -> str:
    """A probability as every panel writes it: core/runs/scoring.py's one rule, with 1 decimal by default
    (41.9%; one too small for it: 4e-03%, never 0.0%)."""
    return scoring.percent(p, digits)


def short_path(path: os.PathLike | str | None, width: int = 60) -> str:
    """`~` for the home directory and an ellipsis in the middle when longer than `width`."""
    if path is None:
        return ""
    text = str(path)
    home = str(Path.home())
    if home and home != "/" and text.startswith(home + os.sep):
        text = "~" + text[len(home):]
    if len(text) > width > 8:
        keep = width - 1
        text = text[: keep // 3] + "…" + text[-(keep - keep // 3):]
    return text


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, math.ceil(0.95 * len(ordered)) - 1)
    return ordered[k]


def plural(n: int, word: str) -> str:
    """`1 token`, `2 tokens`."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def token_count(state, short: bool = False) -> str:
    """A run's tokens in words, one definition everywhere: its own (a branch's: from its branch point on) and, for
    a branch, its total from the prompt (`short`: "10 own · 14 in all", where room is scarce)."""
    own, total = state.own_tokens, state.total_tokens
    if own == total:
        return plural(total, "token")
    if short:
        return f"{own:,} own · {total:,} in all"
    return f"{plural(own, 'token')} of its own · {total:,} in all"


def fit_cells(text: str, width: int) -> str:
    """`text` in exactly `width` terminal cells: padded with spaces, or cut with "…" as its last cell, so a cut
    token name never passes for a real one ("␣accountabili…", not "␣accountabili")."""
    if width <= 0:
        return ""
    if cell_len(text) <= width:
        return set_cell_size(text, width)
    return set_cell_size(set_cell_size(text, width - 1) + "…", width)


def fitting(alternatives, room: int) -> str:
    """The first of `alternatives` (longest first) that fits in `room` cells whole, "" when none does: a shorter
    wording chosen by the width, never a cut one."""
    return next((text for text in alternatives if cell_len(text) <= room), "")


def shorter_form(text: str, room: int) -> str:
    """`text` where it fits `room` cells; else its longest head that ends at a clause's end (before "; ", ", ",
    ": ", " · " or " (", outside brackets) and fits — "5 kept, 68.8% of the raw mass; entropy 1.15 bits" → "5 kept,
    68.8% of the raw mass" — else "": a note is shortened by whole clauses, never cut mid-word with "…"."""
    if cell_len(text) <= room:
        return text
    depth, ends = 0, []
    for i, ch in enumerate(text):
        if ch in "([":
            if ch == "(" and depth == 0 and text[i - 1:i] == " ":
                ends.append(i - 1)
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        elif depth == 0 and ch in ";,:" and text[i + 1:i + 2] == " ":
            ends.append(i)
        elif depth == 0 and ch == "·" and text[i - 1:i + 2] == " · ":
            ends.append(i - 1)
    return next((text[:end] for end in reversed(ends) if cell_len(text[:end]) <= room), "")


def whole_lines(text: Text, width: int) -> list[Text]:
    """`text` (one line) as lines at most `width` cells wide, broken between words (styles kept): a line too long
    for its panel goes on, never cut with "…". width <= 0: as it is."""
    if width <= 0 or text.cell_len <= width:
        return [text]
    from rich.console import Console  # rich's own word wrap, which keeps the spans' styles

    return list(text.wrap(Console(width=width, color_system=None), width))


def fit_piece(piece: str, width: int) -> str:
    """A token's piece drawn as every panel draws it (core/steps/display.py: `␣` for a space, other invisible
    characters named), in exactly `width` cells."""
    return fit_cells(display_text(piece), width)


def whole_parts(parts: list[tuple[str, str]], width: int, sep: str = " · ", indent: str = "  ") -> Text:
    """(text, style) parts joined by `sep` into lines at most `width` cells wide, each part kept whole on a line (a
    part wider than a line goes on one of its own, where the view may cut it): a line breaks only between parts,
    the separator at the break dropped, the next line indented — never "(esc⏎ closes)" or "· done ·⏎ KV reused".
    width <= 0: one line."""
    out = Text()
    used = 0
    for n, (text, style) in enumerate(parts):
        if n:
            if width > 0 and used + cell_len(sep) + cell_len(text) > width:
                out.append("\n" + indent)
                used = cell_len(indent)
            else:
                out.append(sep, style="dim")
                used += cell_len(sep)
        out.append(text, style=style)
        used += cell_len(text)
    return out


def side_by_side(left: list[Text], right: list[Text], left_w: int, gutter: str, gutter_style) -> list[Text]:
    """Two columns of lines as one: each left line padded to `left_w` cells, then `gutter` (in `gutter_style`) and
    the right line where there is one; the longer column sets the height (the one-pass panel, the attention view)."""
    out = []
    for n in range(max(len(left), len(right))):
        line = Text(no_wrap=True)
        if n < len(left):
            line.append_text(left[n])
            line.append(" " * max(0, left_w - left[n].cell_len))
        else:
            line.append(" " * left_w)
        if n < len(right):
            line.append(gutter, gutter_style)
            line.append_text(right[n])
        out.append(line)
    return out
