"""Steps 1 and 2: the chat-templated text (special tokens highlighted) and the prompt's tokens as chips.

The panel scrolls (scrollbar, mouse wheel, and ↑ ↓ PgUp PgDn Home End once focused with Tab or a click). A long
template is shown as its first and last lines around "… N more lines", so the token chips are on screen whatever
the prompt's length; how many template rows a terminal gets is in tui/sizes.py.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widget import Widget

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
        if not event.templated:
            subtitle += " · raw prompt"
            out.append("⚠ no chat template: the raw prompt is used, exactly as typed\n",
                       self.style_of("prompt--warning"))
        if self.prefill_shown:
            subtitle += " · 3 prefill " + (ms(state.prefill.ms) if state.prefill is not None else "—")
        self.border_subtitle = subtitle + (" · ids on" if self.show_ids else "")
        if self.template_rows > 0:
            out.append_text(self._template_text(event, self.template_rows, self.text_width))
            out.append("\n")
        out.append_text(self._chips(event))
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

    def _chips(self, event) -> Text:
        chip = self.style_of("prompt--chip")
        chip_special = self.style_of("prompt--chip-special")
        id_style = self.style_of("prompt--id")
        text = Text()
        for n, piece in enumerate(event.pieces):
            if n:
                text.append(" ")
            text.append(display_text(piece.piece), chip_special if piece.special else chip)
            if self.show_ids:
                text.append(f"·{piece.id}", id_style)
        return text

    def on_resize(self) -> None:
        self.rebuild()
