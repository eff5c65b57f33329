"""Steps 1 and 2: the chat-templated text (special tokens highlighted) and the prompt's tokens as chips."""

from __future__ import annotations

from rich.text import Text

from ..format import display_piece
from .base import Panel


class PromptPanel(Panel):
    TITLE = "1 chat template · 2 tokenize"
    AUTO_HEIGHT = True

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
        self.show_ids = False
        self.show_template = True  # the app turns the templated text off on small terminals

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
        self.border_subtitle = subtitle + (" · ids on" if self.show_ids else "")
        if self.show_template:
            out.append_text(self._template_text(event))
            out.append("\n")
        out.append_text(self._chips(event))
        return out

    def _template_text(self, event) -> Text:
        special = self.style_of("prompt--special")
        newline = self.style_of("prompt--newline")
        specials = sorted({p.piece for p in event.pieces if p.special and p.piece}, key=len, reverse=True)
        text = Text()
        lines = event.text.split("\n")
        if lines and lines[-1] == "":
            lines = lines[:-1]
            trailing_newline = True
        else:
            trailing_newline = False
        for n, line in enumerate(lines):
            segment = Text(line)
            if specials:
                segment.highlight_words(specials, special)
            text.append_text(segment)
            if n < len(lines) - 1 or trailing_newline:
                text.append("↵", newline)
                if n < len(lines) - 1:
                    text.append("\n")
        return text

    def _chips(self, event) -> Text:
        chip = self.style_of("prompt--chip")
        chip_special = self.style_of("prompt--chip-special")
        id_style = self.style_of("prompt--id")
        text = Text()
        for n, piece in enumerate(event.pieces):
            if n:
                text.append(" ")
            text.append(display_piece(piece.piece), chip_special if piece.special else chip)
            if self.show_ids:
                text.append(f"·{piece.id}", id_style)
        return text
