"""The candidates panel's table for a served model (core/server/): the server's top candidates with the one
probability it gives, labelled by what it gives, and "—" for what it does not report. Plain text, drawn with the
panel's styles (tui/panels/candidates.py's CandidatesPanel, which calls it for a served model's step)."""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.text import Text

from tokentui.core.steps.display import display_text

from ..format import fit_piece, percent, whole_lines
from ..served import DASH, LEGEND, chosen_value, prob_label, prob_missing, unknown_kind, value_of, wrap
from .candidate_rows import NUM_W, bar, chosen_name, column_widths, id_width, rows_that_fit, settings_line

# a served token the server did not stream on its own (StepEvent.merged)
MERGED = ("no candidates: the server streamed this token merged with the next, as one character's bytes, and "
          "reported no probabilities for it")


def served_table(panel, state, step, server, cands, chosen, width: int, height: int | None) -> Text:
    """The server's top candidates with the one probability it gives (`ServerFacts.probs`: raw, post-sampler,
    or not said), labelled so, and "—" for what it does not report (kept tokens, entropy, the other
    probability; the chosen token's rank when it is not among the candidates)."""
    muted = panel.style_of("candidates--muted")
    label = prob_label(server)
    id_w = id_width(state.facts, cands)
    num_w = max(NUM_W, len(label))
    piece_w, bar_w = column_widths(width, id_w, 1 + num_w + 1)
    name_cell, above = chosen_name(step.piece, piece_w, bar_w, width)
    without = len(_summary(panel, step, server, width, False, cands))
    room = None if height is None else height - 1 - without
    chose_lines = len(_summary(panel, step, server, width, True, cands)) - without
    rows, _rule, chose = rows_that_fit(len(cands), room, chosen, None, chose_lines, 1 + len(above))
    summary = _summary(panel, step, server, width, chose, cands)
    cands = cands[:rows]
    out = Text()
    out.append("  " + set_cell_size("token", piece_w) + " " + "id".rjust(id_w) + " " + label.rjust(num_w),
               panel.style_of("candidates--header"))
    bar_style = panel.style_of("candidates--bar")
    chosen_style = panel.style_of("candidates--chosen")
    cut_style = panel.style_of("candidates--cut")
    special_style = panel.style_of("candidates--special")
    post = server.probs == "post-sampler"
    for c in cands:
        out.append("\n")
        is_chosen = c.id == step.id
        p = value_of(c)
        cut = post and p == 0  # a post-sampler probability of 0: the server's sampler cut it
        if is_chosen and above:  # its name on lines of its own, whole
            for part in above:
                out.append(set_cell_size(part, width) + "\n", chosen_style)
        line = Text()
        line.append("▶ " if is_chosen and not above else "  ")
        name = name_cell if is_chosen else fit_piece(c.piece, piece_w)
        line.append(name, special_style if c.special else None)
        line.append(" " + str(c.id).rjust(id_w))
        line.append(" " + (DASH if p is None else "cut" if cut else percent(p)).rjust(num_w))
        room_w = bar_w - (cell_len(name) - piece_w)
        if p is not None and room_w > 0:
            line.append(" ")
            for chars, kind in bar(p, 0.0, room_w):
                line.append(chars, bar_style)
        if is_chosen:
            line.append(" " * max(0, width - line.cell_len))
            line.stylize_before(chosen_style)
        elif cut:
            line.stylize_before(cut_style)
        out.append_text(line)
    for row in summary:
        out.append("\n")
        out.append_text(row)
    if not step.candidates:
        out = Text(MERGED if step.merged else "the server reported no candidates for this step", style=muted)
    return out


def _summary(panel, step, server, width: int, chose: bool, cands) -> list[Text]:
    """The rows under a served model's candidates: its sampler, the entropy, what the server does not report, the
    token taken where its row is not shown (`chose`) and the legend."""
    muted = panel.style_of("candidates--muted")
    value = panel.style_of("candidates--value")
    rows: list[Text] = []
    first = settings_line(step, muted, value)
    if not step.greedy:
        first.append(" → kept ", muted)
        first.append(f"{step.kept_count:,}" if step.kept_count is not None else DASH, value)
    rows.append(first)
    second = Text()
    second.append("entropy ", muted)
    second.append(f"{max(0.0, step.entropy_bits):.2f} bits" if step.entropy_bits is not None else DASH, value)
    missing = prob_missing(server)
    if missing is not None:
        second.append(f" · {missing} ", muted)
        second.append(DASH, value)
    rows.append(second)
    if server.probs == "unknown":
        rows += [Text(line, style=muted) for line in wrap(unknown_kind(), width)]
    if chose and step.candidates:  # the token taken is not among the candidates shown
        p = chosen_value(step)
        in_list = any(c.id == step.id for c in cands)
        where = (f"rank {step.chosen_rank + 1}" if step.chosen_rank is not None
                 else f"rank {[c.id for c in cands].index(step.id) + 1}" if in_list
                 else f"not in the server's top {server.top_logprobs or len(cands)}")
        head = f"chose {display_text(step.piece)}: {where}"
        tail = f"{prob_label(server)} {percent(p) if p is not None else DASH}"
        if cell_len(head) + 2 + len(tail) <= width:
            rows.append(Text(f"{head}, {tail}", style=value))
        else:
            rows += [Text(head, style=value), Text("  its " + tail, style=value)]
    rows.append(Text(LEGEND, style=muted))
    return [row for part in rows for row in whole_lines(part, width)]
