"""The sublayer column beside the logit lens (issue 39): for the step in view, per decoder layer, what the attention
and the MLP sublayers added to the new token's residual stream (the norms of their contributions), the stream's norm
leaving the layer, and — where the panel is wide enough — the lens's top token after the attention sublayer beside
its top token after the MLP, so a learner sees which layer, and which half of it, changed the prediction.

The figures are the step's own (StepEvent.sublayers, core/runs/attention.py's SublayerRow; computed by
core/model/observe/sublayers.py and checked against forward hooks on the transformers model). Plain functions that
build the lens panel's lines (tui/panels/lens.py draws them)."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text

from tokentui.core.steps.display import display_text

from ..format import percent, whole_lines

NUM_W = 6  # a norm's column
BOTH_TOPS = 62  # panel width from which the top token after attention shows beside the one after the MLP
WITH_P = 48  # panel width from which the probability of the top token after the MLP shows


def norm_text(value: float) -> str:
    """A norm in at most NUM_W cells, three significant figures where they fit."""
    if value < 10:
        return f"{value:.2f}"
    if value < 1000:
        return f"{value:.1f}" if value < 100 else f"{value:.0f}"
    return f"{value:.0f}" if value < 1e6 else f"{value:.1e}"


def header(width: int) -> str:
    tops = "top after attn → after MLP" if width >= BOTH_TOPS else "top after MLP"
    p = f" {'p':>6}" if width >= WITH_P else ""
    return f"  L  {'‖x‖out':>{NUM_W}} {'+attn':>{NUM_W}} {'+mlp':>{NUM_W}}{p}  {tops}"


def piece_width(width: int) -> int:
    """The first top token's cells where both show (a longer one takes more, whole: the line goes on)."""
    fixed = 5 + 3 * (NUM_W + 1) + 7 + 1  # layer and mark, three norms, the probability
    return max(6, (width - fixed - 3) // 2)


def row(sub, lens_row, chosen_id: int, first: bool, width: int, styles: dict) -> list[Text]:
    """One layer's line: its number (◆ where the chosen token first tops the lens), the stream's norm leaving the
    layer and the norms of the two contributions, the probability of the top token after the MLP (from WITH_P
    cells), then the top token after the attention sublayer (wide panels; → where the MLP changed it) and after the
    MLP. Each token whole: where they do not fit after the numbers, they go on the next line, indented."""
    numbers = Text(no_wrap=True)
    numbers.append(f"{sub.layer:>3}{'◆' if first else ' '} ", styles["muted"])
    for n, value in enumerate((sub.resid_after, sub.attn_norm, sub.mlp_norm)):
        numbers.append((" " if n else "") + norm_text(value).rjust(NUM_W), styles["muted"])
    after = sub.after_mlp or lens_row
    if width >= WITH_P:
        numbers.append(f" {percent(after.prob) if after is not None else '—':>6}", styles["value"])
    tops = Text(no_wrap=True)
    if width >= BOTH_TOPS:
        attn = sub.after_attn
        name = display_text(attn.piece) if attn is not None else "—"
        tops.append(name + " " * max(0, piece_width(width) - cell_len(name)),
                    styles["chosen"] if attn is not None and attn.id == chosen_id else styles["value"])
        changed = attn is not None and after is not None and attn.id != after.id
        tops.append(" → " if changed else "   ", styles["muted"])
    tops.append(display_text(after.piece) if after is not None else "—",
                styles["chosen"] if after is not None and after.id == chosen_id else styles["value"])
    if numbers.cell_len + 2 + tops.cell_len <= width:
        numbers.append("  ")
        numbers.append_text(tops)
        return [numbers]
    indent = Text("     ")
    return [numbers] + [indent + part for part in whole_lines(tops, max(8, width - 5))]
