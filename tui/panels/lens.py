"""The logit lens (`l`, off by default: it costs time): for the step in view, each layer's top token when the
model's final norm and LM head are applied to that layer's residual stream (core/model/observe/lens.py), so one can see at which
depth the chosen token appears. The last layer is the model's own output."""

from __future__ import annotations

from rich.cells import set_cell_size
from rich.text import Text

from tokentui.core.steps.display import display_text

from ..format import percent
from ..served import NOT_AVAILABLE, server_of
from ..sizes import XWIDE
from . import sublayers
from .base import Panel

LENS_NOTE = "logit lens"  # the engine's notice when it cannot run the lens names it so
SERVED = f"logit lens: {NOT_AVAILABLE} (the server does not expose its hidden states)"


def pick_layers(count: int, rows: int, keep: set[int]) -> list[int]:
    """Which of layers 1..count to show in `rows` lines: all when they fit; else the layers in `keep` (the first
    where the chosen token is on top, the last) and others spread evenly, in order."""
    if count <= rows:
        return list(range(1, count + 1))
    chosen = {layer for layer in keep if 1 <= layer <= count}
    spread = count / rows
    for i in range(rows):  # evenly spaced, then any layer left, until the rows are full
        if len(chosen) >= rows:
            break
        chosen.add(max(1, min(count, round((i + 1) * spread))))
    for layer in range(1, count + 1):
        if len(chosen) >= rows:
            break
        chosen.add(layer)
    return sorted(chosen)


class LensPanel(Panel):
    TITLE = "logit lens"

    COMPONENT_CLASSES = {"lens--header", "lens--muted", "lens--chosen", "lens--bar", "lens--value"}

    DEFAULT_CSS = """
    LensPanel {
        height: 1fr;
        & > .lens--header { color: $text-muted; text-style: bold; }
        & > .lens--muted { color: $text-muted; }
        & > .lens--chosen { color: $accent; text-style: bold; }
        & > .lens--bar { color: $bar; }
        & > .lens--value { color: $foreground; }
    }
    """

    def __init__(self, *args, replaying: bool = False, **kwargs) -> None:
        """`replaying`: a record played back, whose steps have the lens or not as they were recorded."""
        super().__init__(*args, **kwargs)
        self.replaying = replaying

    def build(self, state) -> Text:
        muted = self.style_of("lens--muted")
        if server_of(state.facts) is not None:  # a served model: no hidden states come out of the server
            self.border_subtitle = ""
            return Text(SERVED, style=muted)
        step = state.view_step
        refused = next((n for n in state.notices if LENS_NOTE in n), None)
        if step is None:
            return Text(refused or "each layer's top token, for the step in view", style=muted)
        rows = step.lens
        if not rows:
            if refused:
                return Text(refused, style=muted)
            if self.replaying:
                how = "this record was made without it; tokentui --logit-lens records it"  # one parenthesis deep
            elif state.running:
                how = "it shows from the next step"
            else:  # the run has ended: no next step
                how = "r runs the prompt again with it"
            return Text(f"no lens for step {step.index + 1}: it ran before the lens was on ({how})", style=muted)
        width = max(20, self.content_size.width or 40)
        height = max(3, (self.content_size.height or 12) - 1)  # below the header line
        subs = {sub.layer: sub for sub in (getattr(step, "sublayers", None) or [])}
        self._widen(bool(subs))
        if subs:
            height = max(2, height - 1)  # the sublayer columns' header
        if len(step.lens) > height:
            height -= 1  # room for the line that says how many are not shown
        first_chosen = next((row.layer for row in rows if row.id == step.id), None)
        by_layer = {row.layer: row for row in rows}
        layers = pick_layers(len(rows), height, {rows[-1].layer} | ({first_chosen} if first_chosen else set()))
        out = Text()
        where = (f"on top from layer {first_chosen}/{len(rows)}" if first_chosen is not None
                 else f"on top at none of {len(rows)} layers")
        self.border_subtitle = f"step {step.index + 1}"
        out.append(f"{display_text(step.piece)} {where}", self.style_of("lens--header"))
        if subs:  # the sublayer column (tui/panels/sublayers.py): what each half of a layer added
            return self._with_sublayers(out, step, layers, by_layer, subs, first_chosen, width, len(rows))
        piece_w = max(6, min(16, width - 22))
        bar_w = max(0, width - piece_w - 16)
        for layer in layers:
            row = by_layer[layer]
            is_chosen = row.id == step.id
            style = self.style_of("lens--chosen") if is_chosen else self.style_of("lens--value")
            out.append("\n")
            out.append(f"{layer:>3}{'◆' if layer == first_chosen else ' '} ", muted)
            out.append(set_cell_size(display_text(row.piece), piece_w), style)
            out.append(f" {percent(row.prob):>6} ", style)
            if bar_w:
                out.append("█" * max(0, round(row.prob * bar_w)), self.style_of("lens--bar"))
        if len(layers) < len(rows):
            out.append(f"\n{len(rows) - len(layers)} more layers in a taller terminal", muted)
        return out

    def _widen(self, sublayers_shown: bool) -> None:
        """From XWIDE columns, the panel takes the width the sublayer column needs for both top tokens (after the
        attention and after the MLP); else app.tcss's width."""
        wanted = sublayers.BOTH_TOPS + 4 if sublayers_shown and self.app.size.width >= XWIDE else None
        if self.__dict__.get("_wanted_width", None) != wanted:
            self.__dict__["_wanted_width"] = wanted
            self.styles.width = wanted

    def _with_sublayers(self, out: Text, step, layers, by_layer, subs, first_chosen, width: int, count: int) -> Text:
        """The lens's rows with each layer's sublayer figures (a layer without them: its lens row alone)."""
        muted = self.style_of("lens--muted")
        styles = {"muted": muted, "value": self.style_of("lens--value"), "chosen": self.style_of("lens--chosen")}
        out.append("\n")
        out.append(sublayers.header(width), self.style_of("lens--header"))
        for layer in layers:
            sub = subs.get(layer)
            out.append("\n")
            if sub is None:
                lens_row = by_layer[layer]
                out.append(f"{layer:>3}  {display_text(lens_row.piece)} {percent(lens_row.prob)}", muted)
                continue
            lines = sublayers.row(sub, by_layer.get(layer), step.id, layer == first_chosen, width, styles)
            for n, part in enumerate(lines):  # a long token name on a line of its own, never cut
                if n:
                    out.append("\n")
                out.append_text(part)
        if len(layers) < count:
            out.append(f"\n{count - len(layers)} more layers in a taller terminal", muted)
        return out
