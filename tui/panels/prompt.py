"""Steps 1 and 2: the chat-templated text (special tokens highlighted) and the prompt's tokens as chips.

The panel scrolls (scrollbar, mouse wheel, and ↑ ↓ PgUp PgDn Home End once focused with Tab or a click). A long
template is shown as its first and last lines around "… N more lines", so the token chips are on screen whatever
the prompt's length; how many template rows a terminal gets is in tui/sizes.py.

A turn of a conversation (core/runs/turns.py) opens with a line saying which turn it is and what its prefill
reused ("turn 2 · prefill 23 new tokens · 187 reused from turn 1 (KV 4.1 MiB)"); its chips mark where each turn's
user message starts (`▸2`) and the ids the KV cache already held are dimmed, the new ones plain. A raw run says
"raw: no chat template".
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widget import Widget

from tokentui.core.runs.turns import reuse_line
from tokentui.core.steps.conversation import RAW_LABEL
from tokentui.core.steps.display import display_text

from ..format import ms
from .base import FRAME_CSS, SCROLL_BINDINGS, component_style, forget_styles


class PromptText(Widget):
    """The panel's content (one Text; the panel around it scrolls)."""

    DEFAULT_CSS = "PromptText { height: auto; background: $surface; }"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.text = Text()

    def render(self):
        return self.text


class PromptPanel(VerticalScroll, can_focus=True, inherit_bindings=False):
    """Only vertical scrolling keys: `right` belongs to the app (one step while paused)."""

    TITLE = "1 chat template · 2 tokenize"

    BINDINGS = SCROLL_BINDINGS

    COMPONENT_CLASSES = {
        "prompt--special",
        "prompt--chip",
        "prompt--chip-special",
        "prompt--id",
        "prompt--newline",
        "prompt--warning",
        "prompt--muted",
        "prompt--turn",
        "prompt--chip-reused",
    }

    DEFAULT_CSS = """
    PromptPanel {
        """ + FRAME_CSS + """
        padding: 0 1;
        height: auto;
        scrollbar-size-vertical: 1;
        &:focus { border: round $primary; }
        & > .prompt--special { color: $special-token; text-style: bold; }
        & > .prompt--chip { background: $chip-background; color: $foreground; }
        & > .prompt--chip-special { background: $chip-background; color: $special-token; text-style: bold; }
        & > .prompt--id { color: $text-muted; }
        & > .prompt--newline { color: $text-muted; }
        & > .prompt--warning { color: $warning; text-style: bold; }
        & > .prompt--muted { color: $text-muted; }
        & > .prompt--turn { color: $accent; text-style: bold; }
        & > .prompt--chip-reused { background: $chip-background; color: $text-muted; }
    }
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.border_title = self.TITLE
        self.body = PromptText()
        self.show_ids = False
        self.template_rows = 3  # rows of templated text; 0 hides it (the app sets this per terminal size)
        # the bottom border names step 3 with its time where no speed panel does (the app sets it per size: issue
        # 40, every one of the six steps named at every size)
        self.prefill_shown = False
        self.follow_up_hint = True  # an ended answer's subtitle names `u` (the app turns it off in a replay)
        self.last_text: Text | None = None  # what the panel shows now (tests read its .plain)
        self._state = None
        self._shown_prompt = None

    def compose(self):
        yield self.body

    def notify_style_update(self) -> None:
        super().notify_style_update()
        forget_styles(self)

    def style_of(self, component: str):
        return component_style(self, component)

    def show(self, state, force: bool = False) -> None:
        self._state = state
        text = self.build(state)
        if text == self.last_text and not force:
            return
        self.last_text = text
        self.body.text = text
        self.body.refresh(layout=True)
        if state.prompt is not self._shown_prompt:  # a new prompt: back to its start
            self._shown_prompt = state.prompt
            self.scroll_home(animate=False, immediate=True)

    def rebuild(self) -> None:
        if self._state is not None:
            self.show(self._state, force=True)

    @property
    def text_width(self) -> int:
        return max(10, (self.scrollable_content_region.width or 78) - 1)  # a column for the scrollbar

    def build(self, state) -> Text:
        event = state.prompt
        if event is None:
            self.border_subtitle = ""
            if state.phase in ("loading", "load-failed"):
                return Text("the prompt is tokenized once the model is loaded", style=self.style_of("prompt--muted"))
            return Text("tokenizing…", style=self.style_of("prompt--muted"))
        out = Text()
        count = len(event.ids)
        subtitle = f"{count:,} prompt token{'s' if count != 1 else ''}"
        turn = state.run.turn
        if turn is not None and (turn.turn > 1 or turn.raw):  # a follow-up, or a raw run: what it is, what it reused
            what = f"turn {turn.turn} · " if turn.turn > 1 else ""
            out.append(what + reuse_line(turn, state.prefill) + "\n", self.style_of("prompt--turn"))
            subtitle += f" · turn {turn.turn}" if turn.turn > 1 else ""
        if not event.templated and turn is not None and turn.raw:
            subtitle += " · raw"
            if turn.turn > 1:
                out.append(f"{RAW_LABEL}: the conversation's text, tokenized as is\n", self.style_of("prompt--muted"))
        elif not event.templated:
            subtitle += " · raw prompt"
            out.append("⚠ no chat template: the raw prompt is used, exactly as typed\n",
                       self.style_of("prompt--warning"))
        if self.prefill_shown:
            subtitle += " · 3 prefill " + (ms(state.prefill.ms) if state.prefill is not None else "—")
        if self.follow_up_hint and state.done is not None and state.done.reason != "error" and len(state.run):
            subtitle += " · u follow-up"
        self.border_subtitle = subtitle + (" · ids on" if self.show_ids else "")
        if self.template_rows > 0:
            out.append_text(self._template_text(event, self.template_rows, self.text_width))
            out.append("\n")
        out.append_text(self._chips(event, turn))
        return out

    def _template_lines(self, event) -> list[Text]:
        special = self.style_of("prompt--special")
        newline = self.style_of("prompt--newline")
        specials = sorted({p.piece for p in event.pieces if p.special and p.piece}, key=len, reverse=True)
        lines = event.text.split("\n")
        trailing_newline = bool(lines) and lines[-1] == ""
        if trailing_newline:
            lines = lines[:-1]
        out = []
        for n, line in enumerate(lines):
            segment = Text(line)
            if specials:
                segment.highlight_words(specials, special)
            if n < len(lines) - 1 or trailing_newline:
                segment.append("↵", newline)
            out.append(segment)
        return out

    def _template_text(self, event, rows: int, width: int) -> Text:
        """The templated text in at most `rows` rows of `width` cells: whole when it fits, else its first and last
        lines (each cut to one row) around "… N more lines"."""
        lines = self._template_lines(event)
        wrapped = sum(max(1, -(-cell_len(line.plain) // width)) for line in lines)
        if wrapped <= rows:
            return Text("\n").join(lines)
        keep = max(1, rows - 1)
        head = max(1, (keep + 1) // 2)
        tail = keep - head
        if len(lines) <= rows:  # few lines, but long ones: cut each to a row
            head, tail = len(lines), 0
        shown = lines[:head] + ([] if not tail else lines[-tail:])
        out = []
        for line in shown[:head]:
            line = line.copy()
            line.truncate(width, overflow="ellipsis")
            out.append(line)
        hidden = len(lines) - head - tail
        if hidden:
            chars = sum(len(line.plain) for line in lines[head:len(lines) - tail])
            out.append(Text(f"… {hidden:,} more line{'s' if hidden != 1 else ''} ({chars:,} characters) …",
                            style=self.style_of("prompt--muted")))
        for line in shown[head:]:
            line = line.copy()
            line.truncate(width, overflow="ellipsis")
            out.append(line)
        return Text("\n").join(out)

    def _chips(self, event, turn=None) -> Text:
        chip = self.style_of("prompt--chip")
        chip_special = self.style_of("prompt--chip-special")
        reused_chip = self.style_of("prompt--chip-reused")
        turn_style = self.style_of("prompt--turn")
        id_style = self.style_of("prompt--id")
        # a follow-up: where each turn's user message starts (marked ▸N), and the ids its KV cache held (dimmed)
        starts = {at: k for k, at in enumerate(turn.turn_starts, start=1) if k > 1} if turn is not None else {}
        reused = (turn.reused_tokens or 0) if turn is not None else 0
        text = Text()
        for n, piece in enumerate(event.pieces):
            if n:
                text.append(" ")
            if n in starts:
                text.append(f"▸{starts[n]} ", turn_style)
            style = chip_special if piece.special else chip
            text.append(display_text(piece.piece), reused_chip if n < reused else style)
            if self.show_ids:
                text.append(f"·{piece.id}", id_style)
        return text

    def on_resize(self) -> None:
        self.rebuild()
