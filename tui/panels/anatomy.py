"""One pass, taken apart (`a`; issue 16): the step in view as the pipeline of one pass — each stage with the shape
of the tensor it produces (core/model/observe/anatomy.py `one_pass`, from the model's config and the step), where it runs (host
or device, in the theme's two colours: `$stage-host`, `$stage-device`), the time of its part this step (forward,
select, copy, detok: `StepEvent.timing`), and how the sampler reshaped the distribution (entropy raw → after
temperature → after top-k / top-p, what each kept, the kept mass). The last line adds the parts up against the
step's latency, says how long the step waited for the dashboard (not part of it), and what crossed host ↔ device.

Two ways to lay the stages out, by the panel's width: in two columns with a time column (its own row at ≥160×48,
tui/sizes.py), or, narrow (in the lens's place on a smaller terminal), grouped under one line per part with its
time, a part folding into that line when the stages do not fit. Lines that do not fit go, least useful first; then
the last stages ("… N more").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rich.cells import cell_len, set_cell_size
from rich.text import Text

from ..format import shorter_form, side_by_side, whole_lines, whole_parts
from ..placement import ROW_ID
from ..served import NOT_AVAILABLE, server_of
from .anatomy_text import (PART_FIELD, crossed, device_label, distribution_line, entropy_path, fmt_ms,
                           head_words, shown_name, stage_shapes, timing_sum, waited, wrap)
from .base import Panel
from .truths_text import truth_clauses

ROW_LINES = 10  # the one-pass row's height in app.tcss (borders included)
TWO_COLUMNS = 132  # content width from which the stages flow into two columns (else: grouped under their parts)
GUTTER = " │ "
NO_TIMING = "no timing for this step (recorded before tokentui measured it)"
WAITING = "each stage of one pass for the step in view: its tensor's shape, where it runs, its time"
SERVED = f"one pass: {NOT_AVAILABLE} (the server does not expose its passes, their shapes or their times)"

# how much a line is worth keeping when the panel is short: the lowest go first (the bottom-most of them first)
KEEP, NOTE, EXTRA = 3, 2, 1


@dataclass
class Line:
    text: Text
    worth: int = KEEP
    footer: bool = False


class AnatomyPanel(Panel):
    TITLE = "one pass"

    COMPONENT_CLASSES = {"anatomy--host", "anatomy--device", "anatomy--name", "anatomy--shape", "anatomy--time",
                         "anatomy--note", "anatomy--muted", "anatomy--sum", "anatomy--rule"}

    DEFAULT_CSS = """
    AnatomyPanel {
        height: 1fr;
        & > .anatomy--host { color: $stage-host; text-style: bold; }
        & > .anatomy--device { color: $stage-device; text-style: bold; }
        & > .anatomy--name { color: $foreground; }
        & > .anatomy--shape { color: $accent; }
        & > .anatomy--time { color: $foreground; text-style: bold; }
        & > .anatomy--note { color: $text-muted; }
        & > .anatomy--muted { color: $text-muted; }
        & > .anatomy--sum { color: $foreground; }
        & > .anatomy--rule { color: $text-muted; }
    }
    """

    def build(self, state) -> Text:
        muted = self.style_of("anatomy--muted")
        facts = state.facts
        step = state.view_step
        if facts is None:
            self.border_subtitle = ""
            return Text("loading…", style=muted)
        if server_of(facts) is not None:  # a served model: its passes happen inside the server, out of sight
            self._room_for(0)
            self.border_subtitle = ""
            if self.border_title != self.TITLE:
                self.__dict__.pop("_title_markup", None)
                self.border_title = self.TITLE
            width = max(20, self.content_size.width or 60)
            return Text("\n".join(wrap(SERVED, width)), style=muted)
        self._title(facts)
        if step is None:
            self.border_subtitle = head_words(facts.tied_lm_head)
            return Text(WAITING, style=muted)
        from tokentui.core.model.observe.anatomy import one_pass  # torch-free; imported when first drawn

        self.border_subtitle = (("step " if state.live else "viewing step ") + f"{step.index + 1}"
                                + (" · prefill" if step.index == 0 else "") + " · "
                                + head_words(facts.tied_lm_head))
        width = max(20, self.content_size.width or 60)
        height = max(1, self.content_size.height or 16)
        stages = one_pass(facts, step.kv_tokens, step, step.settings)
        if not isinstance(stages, str):
            stages = [replace(st, name=shown_name(st)) for st in stages]
        device = device_label(facts.device)
        truths = self._truths(facts, step, width)  # the embedding table, RoPE, the norms' epsilon
        self._room_for(len(truths))
        if isinstance(stages, str):  # an architecture it cannot take apart: say so, then what is still known
            lines = [Line(Text(t, style=muted)) for t in wrap(stages, width)]
            lines += [Line(Text(t, style=self.style_of("anatomy--note")), NOTE)
                      for t in wrap(distribution_line(step), width)]
        elif width >= TWO_COLUMNS:
            lines = self._columns(stages, step, device, width)
        else:
            footer = sum(line.worth >= KEEP for line in self._footer(step, width))
            lines = self._grouped(stages, step, device, width, height - footer - len(truths))
        lines += truths
        lines += self._footer(step, width)
        return self._fit(lines, height, width)

    def _truths(self, facts, step, width: int) -> list[Line]:
        """The small truths (tui/panels/truths_text.py) as whole clauses on as few lines as the width allows."""
        clauses = truth_clauses(facts, step, short=False)
        if clauses and cell_len(" · ".join(clauses)) > width:
            clauses = truth_clauses(facts, step, short=True)
        if not clauses:
            return []
        style = self.style_of("anatomy--note")
        text = whole_parts([(c, style) for c in clauses], width, indent="")
        return [Line(line) for part in text.split("\n") for line in whole_lines(part, width)]  # never cut

    def _room_for(self, extra: int) -> None:
        """In its own row (≥160×48: app.tcss gives it ROW_LINES), the panel grows by the truths' lines."""
        if self.id != ROW_ID:
            return
        wanted = ROW_LINES + extra if extra else None
        if self.__dict__.get("_grown") != wanted:
            self.__dict__["_grown"] = wanted
            self.styles.height = wanted

    def _title(self, facts) -> None:
        device = device_label(facts.device)
        where = "no GPU: the model runs on the CPU too" if device == "CPU" else facts.device
        host, dev = "[$stage-host]host[/]", f"[$stage-device]{device}[/]"
        forms = (f"one pass · {host} = Python on the CPU · {dev} = the device ({where})",
                 f"one pass · {host} = Python on the CPU · {dev} = the device",
                 f"one pass · {host} = Python · {dev} = the device", f"one pass · {host} = Python · {dev} = device",
                 f"one pass · {host} · {dev}")
        room = (self.outer_size.width or 200) - 8  # what Textual keeps of the border beside a title
        title = next((form for form in forms if len(Text.from_markup(form.replace("$", "")).plain) <= room),
                     forms[-1])  # the longest wording that fits, never one cut with "…" (issue 40)
        if self.__dict__.get("_title_markup") != title:
            self.__dict__["_title_markup"] = title
            self.border_title = title

    # ---- layouts -----------------------------------------------------------------------------------------------
    def _row(self, stage, device: str, name_w: int, shape_w: int, width: int, time: str = "", mark: str = "",
             time_w: int = 0) -> Text:
        line = Text(no_wrap=True, overflow="ellipsis")
        host = stage.where == "host"
        line.append(set_cell_size("host" if host else device, 4) + " ",
                    self.style_of("anatomy--host" if host else "anatomy--device"))
        line.append(set_cell_size(stage.name, name_w) + " ", self.style_of("anatomy--name"))
        line.append(set_cell_size(stage_shapes(stage), shape_w), self.style_of("anatomy--shape"))
        if time_w:
            line.append(f" {mark} ", self.style_of("anatomy--rule"))
            line.append(set_cell_size(time, time_w), self.style_of("anatomy--time"))
        note = shorter_form(stage.note, width - line.cell_len - 1)  # whole clauses only (issue 40)
        if note and cell_len(note) >= 8:
            line.append(" " + note, self.style_of("anatomy--note"))
        line.truncate(width, overflow="ellipsis")
        return line

    def _columns(self, stages, step, device: str, width: int) -> list[Line]:
        """The stages in two columns (split at a part boundary near the middle: the forward pass on the left, the
        head's selection and the way back to the host on the right); the left as narrow as its rows without their
        notes allow, so the right keeps room for the sampler's."""
        split = split_at(stages)
        left, right = stages[:split], stages[split:]
        timing = step.timing
        left_w = self._fixed_width(left, timing)
        right_w = width - len(GUTTER) - left_w
        if right_w < self._fixed_width(right, timing):  # both too wide: halves
            left_w = (width - len(GUTTER)) // 2
            right_w = width - len(GUTTER) - left_w
        a = self._rows(left, stages, step, device, left_w)
        b = self._rows(right, stages, step, device, right_w, offset=split)
        path = entropy_path(step)
        spare = len(b) < len(a) and cell_len(path) <= right_w  # the entropy's path under the sampler's stages
        if spare:
            b.append(Text(path, style=self.style_of("anatomy--note")))
        lines = [Line(line) for line in side_by_side(a, b, left_w, GUTTER, self.style_of("anatomy--rule"))]
        if not spare:
            lines.append(Line(Text(shorter_form(distribution_line(step), width),
                                   style=self.style_of("anatomy--note")), NOTE))
        return lines

    def _fixed_width(self, stages, timing) -> int:
        name_w = max(cell_len(s.name) for s in stages)
        shape_w = max(cell_len(stage_shapes(s)) for s in stages)
        time_w = max((cell_len(t) for t in part_times(stages, timing)), default=0) if timing is not None else 0
        return 5 + name_w + 1 + shape_w + (3 + time_w if time_w else 0)

    def _rows(self, some, stages, step, device: str, width: int, offset: int = 0) -> list[Text]:
        """One line per stage of `some` (= stages[offset:offset + len(some)]): where, name, shape, a bracket down
        each part's rows with the part's time on its first, the stage's note in what is left."""
        timing = step.timing
        times = part_times(stages, timing)[offset:offset + len(some)]
        marks = part_marks(stages)[offset:offset + len(some)]
        name_w = max(cell_len(s.name) for s in some)
        shape_w = max(cell_len(stage_shapes(s)) for s in some)
        time_w = max((cell_len(t) for t in times), default=0) if timing is not None else 0
        fixed = 5 + name_w + 1 + shape_w + (3 + time_w if time_w else 0)
        if fixed > width:  # the name gives way first
            name_w = max(8, name_w - (fixed - width))
        return [self._row(s, device, name_w, shape_w, width, times[i], marks[i], time_w)
                for i, s in enumerate(some)]

    def _grouped(self, stages, step, device: str, width: int, room: int) -> list[Line]:
        """Narrow: a line per part with its time (`── forward 19.5 ms`), the stages under it (where, name, shape),
        the sampler stages' notes indented under them. When the stages do not fit `room` lines, parts fold into
        their one line (`── forward 19.5 ms · 6 stages → [1, 151936]`), the longest first."""
        timing = step.timing
        shape_w = max(cell_len(stage_shapes(s)) for s in stages)
        name_w = max(8, min(max(cell_len(s.name) for s in stages), width - 5 - 1 - shape_w))
        blocks: list[tuple[str | None, list]] = []  # runs of one part, in order
        for stage in stages:
            if blocks and blocks[-1][0] == stage.part:
                blocks[-1][1].append(stage)
            else:
                blocks.append((stage.part, [stage]))
        def count(notes: bool) -> int:  # part lines, stage rows (and the sampler's notes) of the parts
            return sum(1 + (0 if n in folded else len(run) + notes * sum(bool(st.note) for st in run
                                                                             if part == "select"))
                       for n, (part, run) in enumerate(blocks) if part is not None)

        folded: set[int] = set()
        # first the one-stage parts, if that makes room for the sampler's notes too; then the longest part but the
        # sampler's; then any
        for notes, fits in ((True, lambda part, run: len(run) == 1), (False, lambda part, run: part != "select"),
                            (False, lambda part, run: True)):
            while count(notes) > room:
                foldable = [n for n, (part, run) in enumerate(blocks)
                            if part is not None and n not in folded and fits(part, run)]
                if not foldable:
                    break
                folded.add(max(foldable, key=lambda n: (len(blocks[n][1]), -n)))
            if count(notes) <= room:
                break
        lines: list[Line] = []
        for n, (part, run) in enumerate(blocks):
            if part is not None:
                head = Text(no_wrap=True, overflow="ellipsis")
                head.append("── ", self.style_of("anatomy--rule"))
                label = part
                if timing is not None and part in PART_FIELD:
                    label += f" {fmt_ms(getattr(timing, PART_FIELD[part]))} ms"
                head.append(label, self.style_of("anatomy--time"))
                if n in folded:
                    what = f" · {len(run)} stages → " if len(run) > 1 else f" · {run[0].name} "
                    head.append(what, self.style_of("anatomy--note"))
                    head.append(stage_shapes(run[-1]), self.style_of("anatomy--shape"))
                head.append(" " + "─" * max(0, width - head.cell_len - 1), self.style_of("anatomy--rule"))
                lines.append(Line(head))
            if n in folded:
                continue
            for stage in run:
                row = Text(no_wrap=True, overflow="ellipsis")
                host = stage.where == "host"
                row.append(set_cell_size("host" if host else device, 4) + " ",
                           self.style_of("anatomy--host" if host else "anatomy--device"))
                row.append(set_cell_size(stage.name, name_w) + " ", self.style_of("anatomy--name"))
                row.append(stage_shapes(stage), self.style_of("anatomy--shape"))
                lines.append(Line(row, KEEP if part is not None else EXTRA))  # the id alone goes first
                if part == "select" and shorter_form(stage.note, width - 5):  # the shape change, stage by stage
                    note = Text("     " + shorter_form(stage.note, width - 5), style=self.style_of("anatomy--note"))
                    lines.append(Line(note, EXTRA if "draw" in stage.name else NOTE))  # the draw's goes first
        return lines

    def _footer(self, step, width: int) -> list[Line]:
        """The parts against the latency (wrapped when narrow); then, where they fit, the wait and the bytes."""
        summed = timing_sum(step)
        muted = self.style_of("anatomy--muted")
        if summed is None:
            return [Line(Text(t, style=muted), footer=True) for t in wrap(NO_TIMING, width)]
        extras = [waited(step), crossed(step)]
        if cell_len(" · ".join([summed, *extras])) <= width:
            line = Text(summed, style=self.style_of("anatomy--sum"))
            line.append(" · " + " · ".join(extras), muted)
            return [Line(line, footer=True)]
        lines = [Line(Text(t, style=self.style_of("anatomy--sum")), footer=True) for t in wrap(summed, width)]
        lines += [Line(Text(t, style=muted), EXTRA, footer=True) for t in wrap(" · ".join(extras), width)]
        return lines

    def _fit(self, lines: list[Line], height: int, width: int) -> Text:
        """As many lines as `height` holds: the least worth first (the bottom-most of them first), then the last
        lines before the footer."""
        lines = list(lines)
        while len(lines) > height:
            worst = min(line.worth for line in lines)
            if worst >= KEEP:
                break
            drop = max(i for i, line in enumerate(lines) if line.worth == worst)
            del lines[drop]
        if len(lines) > height:
            footer = [line for line in lines if line.footer]
            body = [line for line in lines if not line.footer]
            keep = max(0, height - len(footer) - 1)
            cut = len(body) - keep
            more = Text(f"… {cut} more line{'s' if cut != 1 else ''} in a taller terminal",
                        style=self.style_of("anatomy--muted"))
            lines = (body[:keep] + [Line(more)] + footer)[:height]
        out = Text(no_wrap=True, overflow="ellipsis")
        for n, line in enumerate(lines):
            if n:
                out.append("\n")
            line.text.truncate(width, overflow="ellipsis")  # one line each, however long
            out.append_text(line.text)
        return out


def part_times(stages, timing) -> list[str]:
    """Each stage's time cell: its part and the part's time on the part's first stage, else ""."""
    out, seen = [], set()
    for stage in stages:
        part = stage.part
        if timing is not None and part in PART_FIELD and part not in seen:
            seen.add(part)
            out.append(f"{part} {fmt_ms(getattr(timing, PART_FIELD[part]))} ms")
        else:
            out.append("")
    return out


def part_marks(stages) -> list[str]:
    """A bracket down the rows of each run of one part: ┌ │ └ (a part of one row: ─; no part: a space)."""
    marks = []
    for i, stage in enumerate(stages):
        part = stage.part
        before = part is not None and i > 0 and stages[i - 1].part == part
        after = part is not None and i + 1 < len(stages) and stages[i + 1].part == part
        mark = "│" if before and after else "┌" if after else "└" if before else "─"
        marks.append(" " if part is None else mark)
    return marks


def split_at(stages) -> int:
    """Where the right column starts: the part boundary nearest the middle (the middle when none is near)."""
    n = len(stages)
    half = (n + 1) // 2
    bounds = [i for i in range(1, n) if stages[i].part != stages[i - 1].part]
    near = [b for b in bounds if abs(b - half) <= max(2, n // 5)]
    return min(near, key=lambda b: (abs(b - half), -b)) if near else half
