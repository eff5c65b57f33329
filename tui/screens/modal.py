"""What the small list dialogs share: a framed box in the middle of a dimmed screen, a line of text, a list."""

from __future__ import annotations

from textual.binding import Binding
from textual.screen import ModalScreen


def list_dialog_css(name: str, width: int, list_height: int) -> str:
    """The stylesheet of dialog `name`: a `width`-column box (at most the screen) holding a Static and an
    OptionList of at most `list_height` rows."""
    return f"""
    {name} {{ align: center middle; background: $background 60%; }}
    {name} > Vertical {{
        width: {width}; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; border-title-color: $primary; border-title-style: bold;
        border-subtitle-color: $text-muted; background: $surface; padding: 0 1;
    }}
    {name} Static {{ color: $text-muted; }}
    {name} OptionList, {name} OptionList:focus {{
        height: auto; max-height: {list_height}; border: none; padding: 0; background: $surface;
    }}
    """


class ListDialog(ModalScreen):
    """A list dialog: `escape` closes it with None, `q` closes it and quits (after the key has been handled:
    quitting from the binding itself raced the key's way up to the app)."""

    BINDINGS = [Binding("escape", "dismiss_none", "close", show=True),
                Binding("q", "quit_app", "quit", show=False)]

    def action_dismiss_none(self) -> None:
        self.dismiss(None)

    def action_quit_app(self) -> None:
        self.dismiss(None)
        self.app.call_later(self.app.action_quit)
