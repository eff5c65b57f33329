"""Step 4, selection: the current step's top-K candidates, raw and post-sampler probabilities, the cut, entropy."""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.text import Text

from tokentui.core.steps.display import display_text

from ..format import percent
from ..served import DASH, LEGEND, chosen_value, prob_label, prob_missing, server_of, unknown_kind, value_of, wrap
from .base import Panel

EIGHTHS = " ▏▎▍▌▋▊▉█"
# a served token the server did not stream on its own (StepEvent.merged)
MERGED = ("no candidates: the server streamed this token merged with the next, as one character's bytes, and "
          "reported no probabilities for it")


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
        server = server_of(state.facts)
        if server is not None:  # a served model: one probability per candidate, labelled by what the server gives
            return self._served(step, server, cands, chosen_in_list, width, height)
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

    def _settings_line(self, step) -> Text:
        """The sampler this step used, in a few words: greedy, or its top-k and top-p."""
        muted = self.style_of("candidates--muted")
        value = self.style_of("candidates--value")
        s = step.settings  # the SamplerSettings this step used
        line = Text()
        if step.greedy:
            line.append("greedy", value)
            line.append(" · always the top token", muted)
        else:
            parts = [f"top-k {s.top_k}" if s.top_k else "top-k off",
                     "top-p off" if s.top_p >= 1.0 else f"top-p {s.top_p:.2f}"]
            line.append(" · ".join(parts), value)
        return line

    def _summary(self, step, width: int, chosen_in_list: bool) -> list[Text]:
        muted = self.style_of("candidates--muted")
        value = self.style_of("candidates--value")
        rows: list[Text] = []
        first = self._settings_line(step)
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

    # ---- a served model ------------------------------------------------------------------------------------
    def _served(self, step, server, cands, chosen_in_list: bool, width: int, height: int) -> Text:
        """The server's top candidates with the one probability it gives (`ServerFacts.probs`: raw, post-sampler,
        or not said), labelled so, and "—" for what it does not report (kept tokens, entropy, the other
        probability; the chosen token's rank when it is not among the candidates)."""
        muted = self.style_of("candidates--muted")
        summary = self._served_summary(step, server, width, chosen_in_list, len(cands))
        fit = max(1, height - 1 - len(summary)) if self.content_size.height else len(cands)
        cands = cands[: min(len(cands), fit)]
        label = prob_label(server)
        id_w = max([len("id")] + [len(str(c.id)) for c in cands])
        num_w = max(6, len(label))
        piece_w = max(5, min(16, max([cell_len(display_text(c.piece)) for c in cands] + [5])))
        bar_w = max(0, width - (2 + piece_w + 1 + id_w + 1 + num_w + 1))
        if bar_w < 4:
            piece_w = max(5, piece_w - (4 - bar_w))
            bar_w = max(0, width - (2 + piece_w + 1 + id_w + 1 + num_w + 1))
        out = Text()
        out.append("  " + set_cell_size("token", piece_w) + " " + "id".rjust(id_w) + " " + label.rjust(num_w),
                   self.style_of("candidates--header"))
        bar_style = self.style_of("candidates--bar")
        chosen_style = self.style_of("candidates--chosen")
        cut_style = self.style_of("candidates--cut")
        special_style = self.style_of("candidates--special")
        post = server.probs == "post-sampler"
        for c in cands:
            out.append("\n")
            is_chosen = c.id == step.id
            p = value_of(c)
            cut = post and p == 0  # a post-sampler probability of 0: the server's sampler cut it
            line = Text()
            line.append("▶ " if is_chosen else "  ")
            line.append(set_cell_size(display_text(c.piece), piece_w), special_style if c.special else None)
            line.append(" " + str(c.id).rjust(id_w))
            line.append(" " + (DASH if p is None else "cut" if cut else percent(p)).rjust(num_w))
            if p is not None and bar_w:
                line.append(" ")
                for chars, kind in bar(p, 0.0, bar_w):
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
        if not cands:
            out = Text(MERGED if step.merged else "the server reported no candidates for this step", style=muted)
        return out

    def _served_summary(self, step, server, width: int, chosen_in_list: bool, count: int) -> list[Text]:
        muted = self.style_of("candidates--muted")
        value = self.style_of("candidates--value")
        rows: list[Text] = []
        first = self._settings_line(step)
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
        if not chosen_in_list:  # the token taken is not among the candidates shown
            p = chosen_value(step)
            where = (f"rank {step.chosen_rank + 1}" if step.chosen_rank is not None
                     else f"not in the server's top {server.top_logprobs or count}")
            head = f"chose {display_text(step.piece)}: {where}"
            tail = f"{prob_label(server)} {percent(p) if p is not None else DASH}"
            if cell_len(head) + 2 + len(tail) <= width:
                rows.append(Text(f"{head}, {tail}", style=value))
            else:
                rows += [Text(head, style=value), Text("  its " + tail, style=value)]
        rows.append(Text(LEGEND, style=muted))
        for row in rows:
            row.truncate(width, overflow="ellipsis")
        return rows
