"""The candidate table's geometry and cells (plain text, no widget: tui/panels/candidates.py draws the table): how
many rows fit with the chosen token always on screen, the columns' widths, the chosen token's name, the id column,
the probability bar, a raw logit's cell and the sampler's line under the table."""

from __future__ import annotations

from rich.cells import cell_len, chop_cells, set_cell_size
from rich.text import Text

from tokentui.core.samplers import stage_summary

from tokentui.core.steps.display import display_text

EIGHTHS = " ▏▎▍▌▋▊▉█"
NUM_W = 6  # a probability column: "100.0%"
PIECE_W = (8, 16)  # the token column's narrowest and widest
MIN_BAR = 6  # cells the bar keeps before the token column gives up its width



def rows_that_fit(count: int, room: int | None, chosen: int | None, kept: int | None, chose_lines: int = 1,
                  row_lines: int = 1) -> tuple[int, bool, bool]:
    """How many of `count` candidate rows to draw in `room` lines (None: as many as there are), so that the chosen
    token is always on screen: its row (`row_lines` long: a name too long for its row goes on lines above it), or —
    where its row does not fit, or it is not among the candidates — a "chose" line (`chose_lines` long) under them.
    `chosen`: its position in the list (None: not in it); `kept`: the rows the sampler kept (the cut rule goes after
    them; None: nothing cut). Returns (rows, the cut rule drawn, a "chose" line needed)."""
    room = count + 1 + max(chose_lines, row_lines) if room is None else room
    for rows in range(min(count, room), -1, -1):
        rule = kept is not None and 0 < kept < rows
        chose = chosen is None or chosen >= rows
        if rows + rule + chose * chose_lines + (not chose) * (row_lines - 1) <= room:
            return rows, rule, chose
    return 0, False, True


def column_widths(width: int, id_w: int, numbers: int) -> tuple[int, int]:
    """(token column, bar) widths for a panel `width` cells wide: fixed by the width alone, not by the pieces of
    the step shown, so the columns and the header stay put from step to step. `numbers`: the cells of the number
    columns and the spaces between."""
    rest = 2 + 1 + id_w + numbers  # the ▶ mark, the space after the token, the id, the numbers
    piece_w = max(PIECE_W[0], min(PIECE_W[1], width - rest - MIN_BAR))
    return piece_w, max(0, width - rest - piece_w)


def chosen_name(piece: str, piece_w: int, bar_w: int, width: int) -> tuple[str, list[str]]:
    """The chosen token's name, always whole (issue 40): on its row where the token column and the bar hold it (the
    bar gives way first, the numbers moving right with it) — (the row's name cell, []) — else on lines of its own
    above the row, folded at the panel's width, the row's name cell left blank — ("", those lines)."""
    name = display_text(piece)
    if cell_len(name) <= piece_w + bar_w:
        return (name if cell_len(name) > piece_w else set_cell_size(name, piece_w)), []
    return " " * piece_w, chop_cells("▶ " + name, max(4, width))


def id_width(facts, cands) -> int:
    """The id column: as wide as the model's largest id (the same at every step), or the widest id shown."""
    rows = getattr(facts, "vocab_rows", None) or 0
    return max([len("id"), len(str(max(0, rows - 1)))] + [len(str(c.id)) for c in cands])


def bar(p: float, raw: float, width: int) -> list[tuple[str, str]]:
    """A bar `width` cells long: the post-sampler probability solid, the raw probability beyond it shaded."""
    if width <= 0:
        return []
    p = min(max(p, 0.0), 1.0)
    raw = min(max(raw, 0.0), 1.0)
    eighths = round(p * width * 8)
    full, part = divmod(eighths, 8)
    out = [("█" * full, "bar")]
    used = full
    if part and used < width:
        out.append((EIGHTHS[part], "bar"))
        used += 1
    raw_cells = round(raw * width)
    if raw_cells > used:
        out.append(("░" * (raw_cells - used), "raw"))
        used = raw_cells
    return out


def logit_text(logit: float | None) -> str:
    """A raw logit in NUM_W cells (`L` shows the raw column as logits): two decimals, one from ±100 on; "—" where
    the step does not carry it (a served model, the compiled whole step, an older record)."""
    if logit is None:
        return "—"
    return f"{logit:.2f}" if abs(logit) < 99.995 else f"{logit:.1f}" if abs(logit) < 9999.95 else f"{logit:.0e}"


def settings_line(step, muted, value) -> Text:
    """The sampler this step used, in a few words: greedy, or its cutting stages (core/samplers.py); `muted` and
    `value`: the panel's styles for words and values."""
    s = step.settings  # the SamplerSettings this step used
    line = Text()
    if step.greedy:
        line.append("greedy", value)
        line.append(" · always the top token", muted)
    else:
        line.append(" · ".join(stage_summary(s)), value)
    return line
