"""Step 4, selection: the current step's top-K candidates, raw and post-sampler probabilities, the cut, entropy."""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.text import Text

from tokentui.core.display import display_text

from ..format import percent
from .base import Panel

EIGHTHS = " ▏▎▍▌▋▊▉█"


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


class CandidatesPanel(Panel):
    TITLE = "4 selection · candidates"

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

    def build(self, state) -> Text:
        step = state.view_step  # the newest step, or the one the time-travel cursor holds
        muted = self.style_of("candidates--muted")
        if step is None:
            self.border_subtitle = ""
            return Text("the top candidates of each step appear here", style=muted)
        width = max(20, self.content_size.width or 40)
        height = self.content_size.height or 14
        # numbered from 1, like the tokens: step 90 is the 90th token (step 1 is scored by prefill)
        self.border_subtitle = (("step " if state.live else "viewing step ") + f"{step.index + 1}"
                                + (" · from prefill" if step.index == 0 else ""))
        cands = list(step.candidates)
        chosen_in_list = any(c.id == step.id for c in cands)
        summary = self._summary(step, width, chosen_in_list)
        cut = 0 < step.kept_count < len(cands)
        # rows that fit: height minus header, summary and the cut rule
        fit = max(1, height - 1 - len(summary) - (1 if cut else 0)) if self.content_size.height else len(cands)
        cands = cands[: min(len(cands), fit)]

        id_w = max([len("id")] + [len(str(c.id)) for c in cands])
        num_w = 6
        piece_w = max(5, min(16, max([cell_len(display_text(c.piece)) for c in cands] + [5])))
        fixed = 2 + piece_w + 1 + id_w + 1 + num_w + 1 + num_w + 1
        bar_w = max(0, width - fixed)
        if bar_w < 4:  # too narrow for a bar: shrink the piece column instead
            piece_w = max(5, piece_w - (4 - bar_w))
            bar_w = max(0, width - (2 + piece_w + 1 + id_w + 1 + num_w + 1 + num_w + 1))

        header = self.style_of("candidates--header")
        out = Text()
        out.append(
            "  " + set_cell_size("token", piece_w) + " " + "id".rjust(id_w) + " " + "raw".rjust(num_w) + " "
            + "p".rjust(num_w) + " " + ("sampled p" if bar_w >= 10 else "")[:bar_w],
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
            if cut and rank == step.kept_count:
                out.append("\n")
                label = f" cut: {step.kept_count} kept · {percent(step.kept_mass)} of raw p "
                out.append("┄┄" + label + "┄" * max(0, width - 2 - cell_len(label)), rule_style)
            out.append("\n")
            is_chosen = c.id == step.id
            kept = c.prob > 0
            line = Text()
            line.append("▶ " if is_chosen else "  ")
            line.append(set_cell_size(display_text(c.piece), piece_w), special_style if c.special else None)
            line.append(" " + str(c.id).rjust(id_w))
            line.append(" " + percent(c.raw_prob).rjust(num_w))
            line.append(" " + (percent(c.prob) if kept else "cut").rjust(num_w))
            line.append(" ")
            for chars, kind in bar(c.prob, c.raw_prob, bar_w):
                line.append(chars, styles[kind])
            if is_chosen:
                line.append(" " * max(0, width - line.cell_len))
                line.stylize_before(chosen_style)
            elif not kept:
                line.stylize_before(cut_style)
            out.append_text(line)
        for row in summary:
            out.append("\n")
            out.append_text(row)
        return out

    def _summary(self, step, width: int, chosen_in_list: bool) -> list[Text]:
        muted = self.style_of("candidates--muted")
        value = self.style_of("candidates--value")
        s = step.settings  # the SamplerSettings this step used
        rows: list[Text] = []
        first = Text()
        if step.greedy:
            first.append("greedy", value)
            first.append(" · always the top token", muted)
        else:
            top_p = s.top_p
            parts = [f"top-k {s.top_k}" if s.top_k else "top-k off",
                     "top-p off" if top_p >= 1.0 else f"top-p {top_p:.2f}"]
            first.append(" · ".join(parts), value)
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
        second.append(" after sampler", muted)
        rows.append(second)
        if not chosen_in_list:
            third = Text()
            third.append(f"chose {display_text(step.piece)} (rank {step.chosen_rank + 1}, "
                         f"raw {percent(step.chosen_raw_prob)})", value)
            rows.append(third)
        for row in rows:
            row.truncate(width, overflow="ellipsis")
        return rows
