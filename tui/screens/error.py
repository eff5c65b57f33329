"""A one-line error the user can act on, with the ways out (retry / dismiss / quit)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from tokentui.core.steps.display import printable_text


class ErrorDialog(ModalScreen[str]):
    """Dismisses with "retry", "edit", "change" (model or device), "quit" or "close"."""

    BINDINGS = [
        Binding("escape", "choose('close')", "close"),
        Binding("r", "choose('retry')", "retry"),
        Binding("e", "choose('edit')", "edit prompt"),
        Binding("m", "choose('change')", "change model or device"),
        Binding("q", "choose('quit')", "quit"),
    ]

    DEFAULT_CSS = """
    ErrorDialog { align: center middle; background: $background 60%; }
    ErrorDialog > Vertical {
        width: 72; max-width: 100%; height: auto;
        border: thick $error; background: $surface; padding: 1 2;
        border-title-color: $error; border-title-style: bold;
    }
    ErrorDialog #error-message { width: 100%; margin-bottom: 1; }
    ErrorDialog Horizontal { height: auto; align-horizontal: right; }
    ErrorDialog Button { margin-left: 1; }
    """

    def __init__(self, title: str, message: str, retry: bool = True, edit: bool = False,
                 change: bool = False) -> None:
        super().__init__()
        self._change = change
        self._title = title
        self._message = printable_text(message)  # it may quote a server or a file: drawn escaped
        self._retry = retry
        self._edit = edit

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = self._title
            yield Static(self._message, id="error-message", markup=False)
            with Horizontal():
                if self._retry:
                    yield Button("Retry (r)", id="retry", variant="primary")
                if self._edit:
                    yield Button("Edit prompt (e)", id="edit")
                if self._change:
                    yield Button("Model / device (m)", id="change")
                yield Button("Close (esc)", id="close")
                yield Button("Quit (q)", id="quit", variant="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "close")

    def action_choose(self, choice: str) -> None:
        if (choice == "retry" and not self._retry) or (choice == "edit" and not self._edit) \
                or (choice == "change" and not self._change):
            return
        self.dismiss(choice)
