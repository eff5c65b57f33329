"""Step 4, selection: the current step's top-K candidates, raw and post-sampler probabilities, the stage that cut
each, the sampler chain as rows (tui/panels/chain.py), entropy — or, while the step stands still under settings
that are not its own, the preview of that step under them (tui/preview.py). The table's geometry and cells are
tui/panels/candidate_rows.py's; a served model's table, tui/panels/candidates_served.py's."""

from __future__ import annotations

from rich.cells import cell_len, chop_cells, set_cell_size
from rich.text import Text

from tokentui.core.steps.display import display_text

from ..format import fit_piece, fitting, percent, whole_lines
from ..served import server_of
from .base import Panel
from .candidate_rows import NUM_W, bar, chosen_name, column_widths, id_width, logit_text, rows_that_fit, settings_line
from .candidates_served import served_table
from .chain import Shown, cut_by_text, table

BAR_LABEL = "sampled p"
FULL_CHAIN_ROWS = 6  # the chain goes as rows where at least this many candidate rows still fit; else its short form
PREVIEW_NOTE = ("preview under the settings asked for · enter: branch here with them", "preview · enter: branch here",
                "preview · enter branches", "preview")


class CandidatesPanel(Panel):
    TITLE = "4 selection · candidates"
    raw_logits = False  # the raw column as logits (`L`, tui/attention_view.py's Inside), else as probabilities

    COMPONENT_CLASSES = {
        "candidates--header",
        "candidates--chosen",
        "candidates--cut",
        "candidates--bar",
        "candidates--bar-raw",
        "candidates--special",
        "candidates--rule",
        "candidates--muted",
        "candidates--value",
    }

    DEFAULT_CSS = """
    CandidatesPanel {
        & > .candidates--header { color: $text-muted; text-style: bold; }
        & > .candidates--chosen { background: $chosen-row; color: $foreground; text-style: bold; }
        & > .candidates--cut { color: $text-muted; }
        & > .candidates--bar { color: $bar; }
        & > .candidates--bar-raw { color: $bar-raw; }
        & > .candidates--special { color: $special-token; }
        & > .candidates--rule { color: $warning; }
        & > .candidates--muted { color: $text-muted; }
        & > .candidates--value { color: $accent; text-style: bold; }
    }
    """

    def __init__(self, *args, previews=None, **kwargs) -> None:
        """`previews`: the dashboard's StepPreviews (tui/preview.py), read at each paint (None: none)."""
        super().__init__(*args, **kwargs)
        self._previews = previews

    def build(self, state) -> Text:
        raw_step = state.view_step  # the newest step, or the one the time-travel cursor holds
        muted = self.style_of("candidates--muted")
        if raw_step is None:
            self.border_subtitle = ""
            return Text("the top candidates of each step appear here", style=muted)
        width = max(20, self.content_size.width or 40)
        height = self.content_size.height or None  # None: not laid out yet (every row)
        server = server_of(state.facts)
        report = self._previews.for_step(raw_step) if self._previews is not None and server is None else None
        step = Shown.of(raw_step, report)
        # numbered from 1, like the tokens: step 90 is the 90th token (step 1 is scored by prefill)
        self.border_subtitle = (("preview of step " if step.previewed else "step " if state.live else "viewing step ")
                                + f"{raw_step.index + 1}" + (" · from prefill" if raw_step.index == 0 else ""))
        cands = list(step.candidates)
        chosen = next((n for n, c in enumerate(cands) if c.id == step.id), None)
        if server is not None:  # a served model: one probability per candidate, labelled by what the server gives
            return served_table(self, state, raw_step, server, cands, chosen, width, height)
        kept = step.kept_count if 0 < step.kept_count < len(cands) else None
        id_w = id_width(state.facts, cands)
        piece_w, bar_w = column_widths(width, id_w, 1 + NUM_W + 1 + NUM_W + 1)
        name_cell, above = chosen_name(step.piece, piece_w, bar_w, width)
        # the chain as rows where enough candidates still fit, else its short form; under the rows, the kept set's
        # size and mass only where no cut rule (which says them) is drawn among the candidates
        note, ruled = self._line(), kept is not None
        full = True
        if height is not None:
            full = height - 1 - len(self._summary(step, width, False, True, note, ruled)) >= min(len(cands),
                                                                                                  FULL_CHAIN_ROWS)
        without = len(self._summary(step, width, False, full, note, ruled))
        room = None if height is None else height - 1 - without
        rows, rule, chose = rows_that_fit(len(cands), room, chosen, kept,
                                          len(self._summary(step, width, True, full, note, ruled)) - without,
                                          1 + len(above))
        summary = self._summary(step, width, chose, full, note, ruled)
        cands = cands[:rows]
        header = self.style_of("candidates--header")
        out = Text()
        out.append(
            "  " + set_cell_size("token", piece_w) + " " + "id".rjust(id_w) + " "
            + ("logit" if self.raw_logits else "raw").rjust(NUM_W) + " "
            + "p".rjust(NUM_W) + " " + (BAR_LABEL if bar_w >= len(BAR_LABEL) else ""),
            header,
        )
        styles = {
            "bar": self.style_of("candidates--bar"),
            "raw": self.style_of("candidates--bar-raw"),
        }
        chosen_style = self.style_of("candidates--chosen")
        cut_style = self.style_of("candidates--cut")
        special_style = self.style_of("candidates--special")
        rule_style = self.style_of("candidates--rule")
        for rank, c in enumerate(cands):
            if rule and rank == step.kept_count:
                out.append("\n")
                label = f" cut: {step.kept_count} kept · {percent(step.kept_mass)} of raw p "
                out.append("┄┄" + label + "┄" * max(0, width - 2 - cell_len(label)), rule_style)
            out.append("\n")
            is_chosen = c.id == step.id
            kept_row = c.prob > 0
            if is_chosen and above:  # its name on lines of its own, whole
                for part in above:
                    out.append(set_cell_size(part, width), chosen_style)
                    out.append("\n")
            line = Text()
            line.append("▶ " if is_chosen and not above else "  ")
            name = name_cell if is_chosen else fit_piece(c.piece, piece_w)
            line.append(name, special_style if c.special else None)
            line.append(" " + str(c.id).rjust(id_w))
            line.append(" " + (logit_text(c.logit) if self.raw_logits else percent(c.raw_prob)).rjust(NUM_W))
            room_w = bar_w - (cell_len(name) - piece_w)
            # the stage that cut it from the p column on, over the bar ("cut by min-p"), where it is known and fits
            by = cut_by_text(getattr(c, "cut_by", None), NUM_W + 1 + room_w - len(" cut")) if not kept_row else ""
            if by:
                line.append(" " + f"cut {by}".ljust(NUM_W), rule_style)
            else:
                line.append(" " + (percent(c.prob) if kept_row else "cut").rjust(NUM_W))
                line.append(" ")
                for chars, kind in bar(c.prob, c.raw_prob, room_w):
                    line.append(chars, styles[kind])
            if is_chosen:
                line.append(" " * max(0, width - line.cell_len))
                line.stylize_before(chosen_style)
            elif not kept_row:
                line.stylize_before(cut_style)
            out.append_text(line)
        for row in summary:
            out.append("\n")
            out.append_text(row)
        return out

    def _chose_line(self, step, probability: str, width: int = 0) -> list[Text]:
        """The token taken, where its row is not on screen: its rank among every token by raw score and its
        probabilities (`probability`: the rest of the parenthesis, e.g. "raw 1.2%, p 3.4%"). Where the line is
        wider than `width`, the words go first ("rank 98," → "#98"); then the name goes on a line of its own
        (folded at the width where even that is too narrow) and the numbers on the next: neither is ever cut."""
        style = self.style_of("candidates--value")
        piece = display_text(step.piece)
        rank = f"rank {step.chosen_rank + 1}, " if step.chosen_rank is not None else ""
        verb = "would take" if getattr(step, "previewed", False) else "chose"
        line = f"{verb} {piece} ({rank}{probability})"
        if width <= 0 or cell_len(line) <= width:
            return [Text(line, style=style)]
        tail = (f"#{step.chosen_rank + 1} " if step.chosen_rank is not None else "") + probability.replace(", ", " ")
        if cell_len(f"{verb} {piece} {tail}") <= width:
            return [Text(f"{verb} {piece} {tail}", style=style)]
        return [Text(part, style=style) for part in chop_cells(f"{verb} {piece}", max(4, width))] + \
            [Text(f"  {tail}", style=style)]

    def _line(self) -> str | None:
        """Why the step in view has no preview under the settings asked for, where that matters (tui/preview.py)."""
        return self._previews.line if self._previews is not None else None

    def _summary(self, step, width: int, chose: bool, full: bool = False, line: str | None = None,
                 ruled: bool = False) -> list[Text]:
        """The rows under the candidates: a preview's note (or why there is none), the chain (as rows where `full`,
        else in a line), the kept set (as rows: only where the candidates' cut rule does not say it, `ruled`), the
        entropy, and the token taken where its row is not shown (`chose`)."""
        muted = self.style_of("candidates--muted")
        value = self.style_of("candidates--value")
        rows: list[Text] = []
        if step.previewed:
            rows.append(Text(fitting(PREVIEW_NOTE, width), style=self.style_of("candidates--rule")))
        elif line:
            rows.append(Text(line, style=muted))
        styles = {"header": self.style_of("candidates--header"), "label": muted, "value": value, "muted": muted}
        chain = table(step.chain, width, styles) if full and not step.greedy else []
        if chain:  # the chain as rows, then the kept set: its size and raw mass
            rows += chain
        if chain and not ruled:
            kept = Text()
            kept.append("kept ", muted)
            kept.append(f"{step.kept_count:,}", value)
            kept.append(" · ", muted)
            kept.append(percent(step.kept_mass), value)
            kept.append(fitting((" of raw p (before temperature)", " of raw p (before T)", " of raw p", ""),
                                width - kept.cell_len), muted)
            rows.append(kept)
        elif not chain:
            first = settings_line(step, muted, value)
            if not step.greedy:
                first.append(f" → kept {step.kept_count:,}", muted)
                rows.append(first)
                # kept_mass is measured on the raw scores (softmax at temperature 1), before temperature reshapes them
                mass = Text()
                mass.append("kept mass ", muted)
                mass.append(percent(step.kept_mass), value)
                mass.append(" of raw p (before temperature)" if width >= 46 else " (raw p, before T)", muted)
                first = mass
            rows.append(first)
        second = Text()
        second.append("entropy ", muted)
        second.append(f"{max(0.0, step.entropy_bits):.2f} bits", value)
        second.append(" → ", muted)
        second.append(f"{max(0.0, step.sampled_entropy_bits):.2f}", value)
        # the words after the numbers, as many as fit (issue 40: "→ 1.15 after samp…" at 120×30)
        second.append(fitting((" after sampler", " sampled", ""), width - second.cell_len), muted)
        rows.append(second)
        if chose:
            rows += self._chose_line(step, f"raw {percent(step.chosen_raw_prob)}, p {percent(step.chosen_prob)}",
                                     width)
        return [row for part in rows for row in whole_lines(part, width)]
