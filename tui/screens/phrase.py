"""`b` then `t`: force a phrase at the step in view — "why didn't it say X?". The user types text; its tokens (the
phrase tokenized on its own, no special tokens, as the engine will force them) are shown as they are typed. Enter
forces them one by one from that step (each step then shows the model's raw probability and rank for its token, and
what the model preferred), and generation goes on with the sampler settings in force.

The dialog asks the engine for the pieces (`tokenize`, an async callable: the model process answers at once, also
while a run is paused) and dismisses with (text, ids) as last tokenized, or None.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from tokentui.core.errors import TokentuiError
from tokentui.core.runs.events import PromptPiece, StepEvent

Tokenize = Callable[[str], Awaitable[list[PromptPiece]]]


def pieces_text(pieces: list[PromptPiece], at: int) -> Text:
    """The pieces as chips, `␣Lyon│,│␣and`, their count and the steps they are forced at (`at`: the first)."""
    line = Text()
    for n, piece in enumerate(pieces):
        if n:
            line.append("│", style="dim")
        line.append(piece.piece, style="bold reverse" if piece.special else "bold")
    where = f"step {at + 1}" if len(pieces) == 1 else f"steps {at + 1}–{at + len(pieces)}"
    line.append(f"   {len(pieces)} token{'s' if len(pieces) != 1 else ''}, forced at {where}", style="dim")
    return line


class PhraseDialog(ModalScreen):
    BINDINGS = [Binding("escape", "cancel", "cancel", show=True)]

    DEFAULT_CSS = """
    PhraseDialog { align: center middle; background: $background 60%; }
    PhraseDialog > Vertical {
        width: 72; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; border-title-color: $primary; border-title-style: bold;
        border-subtitle-color: $text-muted; background: $surface; padding: 0 1;
    }
    PhraseDialog .hint { color: $text-muted; }
    PhraseDialog #phrase-pieces { height: auto; min-height: 1; }
    PhraseDialog Input { margin: 1 0 0 0; }
    """

    def __init__(self, step: StepEvent, tokenize: Tokenize, run_label: str = "", cursor_blink: bool = True) -> None:
        super().__init__()
        self.step = step
        self.tokenize = tokenize
        self.run_label = run_label
        self.cursor_blink = cursor_blink
        self.pieces: list[PromptPiece] = []
        self.pieces_of = ""  # the text `pieces` are the tokens of

    def compose(self) -> ComposeResult:
        with Vertical() as body:
            body.border_title = f"force a phrase at step {self.step.index + 1}" + (
                f" of {self.run_label}" if self.run_label else "")
            body.border_subtitle = "type · enter force · esc cancel"
            yield Static("Type what the model is to say from here. Each token is forced in turn, shown with the "
                         "probability and rank the model gave it and the token it preferred; then it goes on.",
                         classes="hint", markup=False)
            yield Input(placeholder="e.g.  Lyon, of course", id="phrase-input")
            yield Static(Text("no tokens yet", style="dim"), id="phrase-pieces")

    def on_mount(self) -> None:
        phrase = self.query_one(Input)
        phrase.cursor_blink = self.cursor_blink
        phrase.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.show_pieces(event.value)

    @work(exclusive=True)
    async def show_pieces(self, text: str) -> None:
        await self._tokenized(text)

    async def _tokenized(self, text: str) -> bool:
        shown = self.query_one("#phrase-pieces", Static)
        if not text:
            self.pieces, self.pieces_of = [], text
            shown.update(Text("no tokens yet", style="dim"))
            return False
        try:
            pieces = await self.tokenize(text)
        except TokentuiError as err:
            shown.update(Text(str(err), style="bold red"))
            return False
        self.pieces, self.pieces_of = pieces, text
        shown.update(pieces_text(pieces, self.step.index) if pieces else Text("no tokens", style="dim"))
        return bool(pieces)

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value
        if (text != self.pieces_of or not self.pieces) and not await self._tokenized(text):
            self.notify("The phrase is empty: type the text the model is to say", severity="warning", timeout=4)
            return
        self.dismiss((text, tuple(p.id for p in self.pieces)))

    def action_cancel(self) -> None:
        self.dismiss(None)
