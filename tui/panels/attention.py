"""The attention view (`A`, issue 39): for the step in view, where its new token's query looks — the prompt and the
answer as a heat strip (each token shaded by its weight, in the theme's `$attention-heat` blended into the
background), the sources ranked (token, position, weight; the attention sinks marked), and every layer's strongest
sources as a compact grid. `,` `.` choose the layer, `;` `'` the query head or the mean of the heads, `/` the grid
alone; `[` `]` travel in time as everywhere. A screen of its own at every size: the view needs the width of the text.

What it draws is the step's own event (StepEvent.attention, tui/attention_view.py): a past step, another run of the
tree and a replayed record redraw from what they carry. Every weight is the engine's (core/model/observe/attention.py,
checked against transformers' eager attention); a position the step does not list is not shaded (its weight is at
most the last listed one's, and the list says what all of them add up to).
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.color import Color
from textual.screen import Screen

from tokentui.core.runs.attention import sink_positions
from tokentui.core.steps.display import display_text

from ..attention_view import NOTE, layer_of, pieces_of, rest_of, source_rows, sources
from ..format import fitting, percent, side_by_side, whole_lines
from ..served import NOT_AVAILABLE, server_of
from .base import Panel

SHADES = 6  # steps of the heat strip's shading, from none to the full theme colour
KEYS_LINE = ", . layer · ; ' head · / all layers · [ ] step · esc close"
WIDE = 110  # content width from which the ranked list and the grid stand side by side
LIST_W = 56  # the ranked list's width beside the grid


def shade_level(weight: float, top: float) -> int:
    """0..SHADES-1: the weight's shade, relative to the strongest source (its square root, so that a weight of a
    few percent still shows against a sink holding most of it)."""
    if weight <= 0 or top <= 0:
        return 0
    return max(1, min(SHADES - 1, round((weight / top) ** 0.5 * (SHADES - 1))))


class AttentionPanel(Panel):
    TITLE = "inside one block · where the new token looks"

    COMPONENT_CLASSES = {"attention--heat", "attention--muted", "attention--header", "attention--value",
                         "attention--special", "attention--query", "attention--chosen", "attention--bar"}

    DEFAULT_CSS = """
    AttentionPanel {
        height: 1fr;
        & > .attention--heat { background: $attention-heat; }
        & > .attention--muted { color: $text-muted; }
        & > .attention--header { color: $text-muted; text-style: bold; }
        & > .attention--value { color: $accent; text-style: bold; }
        & > .attention--special { color: $special-token; }
        & > .attention--query { text-style: reverse bold; }
        & > .attention--chosen { color: $accent; text-style: bold; }
        & > .attention--bar { color: $attention-heat; }
    }
    """

    def __init__(self, inside, *args, replaying: bool = False, **kwargs) -> None:
        """`inside`: the controller's choices (tui/attention_view.py's Inside); `replaying`: a record played back."""
        super().__init__(*args, **kwargs)
        self.inside = inside
        self.replaying = replaying

    # ---- the whole view --------------------------------------------------------------------------------------
    def build(self, state) -> Text:
        muted = self.style_of("attention--muted")
        width = max(20, self.content_size.width or 76)
        height = max(4, self.content_size.height or 20)
        step = state.view_step
        if server_of(state.facts) is not None:
            self.border_subtitle = ""
            return self._lines([f"attention: {NOT_AVAILABLE} (the server does not expose its attention weights)"],
                               width, muted)
        refused = next((n for n in state.notices if NOTE in n), None)
        if step is None:
            self.border_subtitle = ""
            return self._lines([refused or "where each new token's query looks, for the step in view", KEYS_LINE],
                               width, muted)
        self.border_subtitle = (("step " if state.live else "viewing step ") + f"{step.index + 1}"
                                + (" · from prefill" if step.index == 0 else ""))
        attention = getattr(step, "attention", None)
        if not attention:
            return self._lines([refused or self._missing(state, step), KEYS_LINE], width, muted)
        pieces, special, prompt_len = pieces_of(state)
        inside = self.inside
        layer = layer_of(attention, inside.layer)
        head = inside.head if layer.heads is not None else None
        out: list[Text] = self._header(step, layer, attention, head, pieces, width)
        keys = whole_lines(Text(KEYS_LINE, style=muted), width)
        room = height - len(out) - len(keys)
        if inside.grid:
            out += self._grid(attention, layer.layer, pieces, special, width, room)
        else:
            wide = width >= WIDE
            strip_room = max(2, min(room // 3 if wide else room // 2, 14))
            strip = self._strip(layer, head, pieces, special, width, strip_room)
            out += strip
            room -= len(strip) + 1
            out.append(Text(""))
            if wide:
                left = self._ranked(layer, head, pieces, special, LIST_W, room)
                right = self._grid(attention, layer.layer, pieces, special, width - LIST_W - 3, room)
                out += side_by_side(left, right, LIST_W, " │ ", self.style_of("attention--muted"))
            else:
                out += self._ranked(layer, head, pieces, special, width, room)
        out = out[:height - len(keys)]
        out += [Text("")] * (height - len(keys) - len(out)) + keys  # the keys on the last line
        text = Text(no_wrap=True)
        for n, line in enumerate(out):
            if n:
                text.append("\n")
            text.append_text(line)
        return text

    def _missing(self, state, step) -> str:
        if self.replaying:
            return (f"no attention for step {step.index + 1}: this record was made without it "
                    "(tokentui --attention records it)")
        if not self.inside.attention_on:
            return "the attention view is off: A turns it on (the engine captures it from its next step)"
        if state.running:
            return f"no attention for step {step.index + 1}: it ran before the view was on (it shows from the next step)"
        return f"no attention for step {step.index + 1}: it ran before the view was on (r runs the prompt again with it)"

    def _lines(self, lines: list[str], width: int, style: Style) -> Text:
        out = Text()
        for n, line in enumerate(part for raw in lines for part in whole_lines(Text(raw, style=style), width)):
            if n:
                out.append("\n")
            out.append_text(line)
        return out

    # ---- parts -----------------------------------------------------------------------------------------------
    def _header(self, step, layer, attention, head, pieces, width: int) -> list[Text]:
        muted, value = self.style_of("attention--muted"), self.style_of("attention--value")
        query = layer.query
        first = Text()
        first.append(display_text(step.piece), value)
        first.append(f" (step {step.index + 1}) was chosen from the query of ", muted)
        first.append(display_text(pieces[query]) if query < len(pieces) else "?", value)
        first.append(f" at position {query}, which sees {query - layer.first_visible + 1} positions", muted)
        if layer.window is not None:
            first.append(f" (a sliding window of {layer.window}: {layer.first_visible}–{query})", muted)
        second = Text()
        second.append(f"layer {layer.layer}", value)
        second.append(f" of {attention[-1].layer}", muted)
        heads = len(layer.heads) if layer.heads is not None else None
        second.append(" · ", muted)
        if head is None:
            second.append("mean of the heads", value)
            if self.inside.head is not None and layer.heads is None:
                second.append(" (per-head weights from the next step)", muted)
        else:
            second.append(f"head {head + 1}", value)
            second.append(f" of {heads}", muted)
        return whole_lines(first, width) + whole_lines(second, width)

    def _strip(self, layer, head, pieces, special, width: int, room: int) -> list[Text]:
        """The text up to the query, each token shaded by its weight; where it takes more lines than `room`, the
        lines holding the most weight (and a line saying how many are not shown)."""
        pairs = dict(source_rows(layer, head))
        top = max(pairs.values(), default=0.0)
        base = self.styles.background if self.styles.background.a else Color.parse("black")
        heat_style = self.style_of("attention--heat")
        heat = Color.from_rich_color(heat_style.bgcolor) if heat_style.bgcolor is not None else Color.parse("orange")
        shades = []
        for level in range(SHADES):
            bg = base.blend(heat, level / (SHADES - 1))
            shades.append(Style(bgcolor=bg.rich_color, color=bg.get_contrast_text(0.95).rich_color) if level else None)
        special_style, query_style = self.style_of("attention--special"), self.style_of("attention--query")
        lines: list[tuple[Text, float]] = []
        line, used, mass = Text(no_wrap=True), 0, 0.0
        for position in range(layer.first_visible, layer.query + 1):
            shown = display_text(pieces[position]) if position < len(pieces) else "?"
            cells = cell_len(shown) + 1
            if used and used + cells > width:
                lines.append((line, mass))
                line, used, mass = Text(no_wrap=True), 0, 0.0
            weight = pairs.get(position, 0.0)
            style = shades[shade_level(weight, top)]
            if position == 0 or (position < len(special) and special[position]):
                style = (style or Style()) + Style(underline=True)
            if position < len(special) and special[position]:
                style = special_style + style if style is not None else special_style
            if position == layer.query:
                style = (style or Style()) + query_style
            line.append(shown, style)
            line.append(" ")
            used += cells
            mass += weight
        if used:
            lines.append((line, mass))
        muted = self.style_of("attention--muted")
        head_line = Text("heat: each token shaded by its weight · underlined: attention sinks · reversed: the query",
                         style=muted)
        label = whole_lines(head_line, width) if room > len(lines) + 1 else []
        room -= len(label)
        if len(lines) <= room:
            return label + [text for text, _ in lines]
        note = Text(f"{len(lines)} lines (the ones with the least weight not shown)", style=muted)
        notes = whole_lines(note, width)
        keep = sorted(sorted(range(len(lines)), key=lambda n: -lines[n][1])[:max(1, room - len(notes))])
        note = Text(f"{len(lines) - len(keep)} of {len(lines)} lines not shown (the ones with the least weight)",
                    style=muted)
        return label + [lines[n][0] for n in keep] + whole_lines(note, width)

    def _ranked(self, layer, head, pieces, special, width: int, room: int) -> list[Text]:
        """The sources, highest weight first: rank, position, weight, a bar, the token (whole), a sink mark."""
        muted, value, bar_style = (self.style_of("attention--muted"), self.style_of("attention--value"),
                                   self.style_of("attention--bar"))
        special_style = self.style_of("attention--special")
        rows = sources(layer, head, pieces, special)
        rest = rest_of(source_rows(layer, head))
        pos_w = max(3, len(str(layer.query)))
        out = [Text(f"{'#':>2} {'pos':>{pos_w}} {'weight':>6}  token", style=self.style_of("attention--header"))]
        bar_w = max(0, min(10, width - 2 - pos_w - 6 - 4 - 12))
        shown = listed = 0
        tail = len(self._rest_lines(rows, [], rest, width))  # what the rest line takes, at its longest
        for rank, src in enumerate(rows, 1):
            line = Text(no_wrap=True)
            line.append(f"{rank:>2} {src.position:>{pos_w}} ", muted)
            line.append(f"{percent(src.weight):>6}", value)
            line.append(" ")
            if bar_w:
                line.append(_bar(src.weight, bar_w), bar_style)
                line.append(" ")
            line.append(display_text(src.piece), special_style if src.special else None)
            if src.sink:
                line.append(f" sink: {src.sink}", muted)
            parts = whole_lines(line, width)
            if shown + len(parts) > room - 1 - tail:
                break
            out += parts
            shown += len(parts)
            listed += 1
        return out + self._rest_lines(rows, rows[:listed], rest, width)

    def _rest_lines(self, rows, listed, rest: float, width: int) -> list[Text]:
        """What the positions not listed add up to (and how many listed ones a taller terminal would show)."""
        words = f"other positions: {percent(rest)} in all"
        if rows:
            words += f", each at most {percent(rows[-1].weight)}"
        if len(listed) < len(rows):
            words += f"; {len(rows) - len(listed)} more listed in a taller terminal"
        return whole_lines(Text(words, style=self.style_of("attention--muted")), width)

    def _grid(self, attention, chosen: int, pieces, special, width: int, room: int) -> list[Text]:
        """Every layer's strongest sources, one line a layer (as many sources as fit, whole): `L5 <|im_start|>@0
        61% · ␣open@45 12%`. Where the layers do not fit `room` lines, those nearest the chosen one."""
        muted, value = self.style_of("attention--muted"), self.style_of("attention--value")
        chosen_style = self.style_of("attention--chosen")
        out = [Text(fitting(("each layer's strongest sources (head mean): token@position weight",
                             "each layer's strongest sources (head mean)", "each layer's strongest sources",
                             "layers' top sources"), width), style=muted)]
        room -= 1
        layers = list(attention)
        if len(layers) > room:
            at = next((n for n, la in enumerate(layers) if la.layer == chosen), len(layers) - 1)
            start = max(0, min(at - (room - 1) // 2, len(layers) - (room - 1)))
            hidden = len(layers) - (room - 1)
            layers = layers[start:start + max(1, room - 1)]
        else:
            hidden = 0
        label_w = len(str(attention[-1].layer)) + 2
        sinks = sink_positions(special)
        for la in layers:
            line = Text(no_wrap=True)
            mark = "▶" if la.layer == chosen else " "
            line.append(f"{mark}L{la.layer:<{label_w - 1}}", chosen_style if la.layer == chosen else muted)
            used = line.cell_len
            for n, src in enumerate(sources(la, None, pieces, special, sinks, limit=12)):  # more never fit a line
                item = f"{display_text(src.piece)}@{src.position} {percent(src.weight, 0)}"
                sep = " · " if n else " "
                if used + cell_len(sep) + cell_len(item) > width:
                    break
                line.append(sep, muted)
                line.append(item, value if n == 0 else None)
                used += cell_len(sep) + cell_len(item)
            out.append(line)
        if hidden > 0:
            out.append(Text(f"{hidden} more layers: , . move through them", style=muted))
        return out


def _bar(weight: float, width: int) -> str:
    eighths = round(min(max(weight, 0.0), 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")).ljust(width)


class AttentionScreen(Screen[None]):
    """The attention view over the whole terminal; the app's keys go on working under it (time travel, pause, the
    sampler), and it is painted in the app's frame like the panels."""

    BINDINGS = [
        Binding("comma", "layer(-1)", "layer −", show=False),
        Binding("full_stop", "layer(1)", "layer +", show=False),
        Binding("semicolon", "head(-1)", "head −", show=False),
        Binding("apostrophe", "head(1)", "head +", show=False),
        Binding("slash", "grid", "all layers", show=False),
        Binding("escape,A,shift+a", "close", "close", show=False),
    ]

    def __init__(self, inside, replaying: bool = False) -> None:
        super().__init__()
        self.inside = inside
        self.replaying = replaying

    def compose(self) -> ComposeResult:
        yield AttentionPanel(self.inside, id="attention-view", replaying=self.replaying)

    @property
    def panel(self) -> AttentionPanel:
        return self.query_one(AttentionPanel)

    def show(self, state, force: bool = False) -> None:
        self.panel.show(state, force)

    def action_layer(self, delta: int) -> None:
        self.inside.move_layer(delta)

    def action_head(self, delta: int) -> None:
        self.inside.move_head(delta)

    def action_grid(self) -> None:
        self.inside.toggle_grid()

    def action_close(self) -> None:
        self.app.action_toggle_attention()


def paint(app, force: bool = False) -> bool:
    """Paint the attention view where it is the screen on top (True), in the app's frame; else False."""
    screen = app.screen if app.screen_stack else None
    if not isinstance(screen, AttentionScreen):
        return False
    screen.show(app.state, force)
    return True


def toggle(app) -> None:
    """`A`: open the attention view (the engine asked to capture from its next step), or close it (and stop)."""
    controller = app.controller
    inside = controller.inside
    if isinstance(app.screen, AttentionScreen):
        if inside.attention_on:
            inside.toggle_attention()
        app.pop_screen()
        app.call_after_refresh(app.redraw)
        return
    if not inside.attention_on:
        inside.toggle_attention()
    app.push_screen(AttentionScreen(inside, replaying=controller.replaying))
    app.call_after_refresh(app.repaint)
    state = controller.state
    step = state.view_step
    if step is not None and getattr(step, "attention", None) is None and not controller.replaying \
            and server_of(state.facts) is None:
        if state.running:
            native = (getattr(state.facts, "decode_plan", None) or "").startswith("native step")
            how = ("the native step writes each layer's query as it goes" if native
                   else "it costs a pass through transformers' attention per step")
            app.notify(f"Attention from the next step ({how})", timeout=5)
        else:
            app.notify("Attention shows from the next run: r runs the prompt again with it", timeout=6)
