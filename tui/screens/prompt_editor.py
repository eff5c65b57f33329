"""`e`: edit the prompt and the system prompt; ctrl+s runs it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, TextArea


class PromptEditor(ModalScreen["tuple[str, str | None] | None"]):
    """Dismisses with (prompt, system or None), or None when cancelled."""

    BINDINGS = [
        Binding("escape", "cancel", "cancel"),
        Binding("ctrl+s", "submit", "run", priority=True),
    ]

    DEFAULT_CSS = """
    PromptEditor { align: center middle; background: $background 60%; }
    PromptEditor > Vertical {
        width: 80; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1;
        border-title-color: $primary; border-title-style: bold;
    }
    PromptEditor TextArea { height: 6; }
    PromptEditor Label { margin-top: 1; color: $text-muted; }
    PromptEditor #prompt-error { color: $error; height: auto; margin-top: 0; }
    PromptEditor Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    PromptEditor Button { margin-left: 1; }
    """

    def __init__(self, prompt: str, system: str | None, cursor_blink: bool = True) -> None:
        super().__init__()
        self._prompt = prompt
        self._system = system or ""
        self._blink = cursor_blink

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "edit prompt"
            box.border_subtitle = "ctrl+s run · esc cancel"
            yield Label("prompt")
            area = TextArea(self._prompt, id="prompt-text", soft_wrap=True, show_line_numbers=False)
            area.cursor_blink = self._blink
            yield area
            yield Label("", id="prompt-error")
            yield Label("system prompt (empty: none)")
            system = Input(self._system, id="system-text", placeholder="e.g. You are a terse assistant.")
            system.cursor_blink = self._blink
            yield system
            with Horizontal():
                yield Button("Run (ctrl+s)", id="run", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        area = self.query_one("#prompt-text", TextArea)
        area.focus()
        area.move_cursor(area.document.end)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "run":
            self.action_submit()
        else:
            self.action_cancel()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_submit()

    def action_submit(self) -> None:
        prompt = self.query_one("#prompt-text", TextArea).text
        if not prompt.strip():
            self.query_one("#prompt-error", Label).update("the prompt is empty")
            return
        system = self.query_one("#system-text", Input).value.strip() or None
        self.dismiss((prompt, system))

    def action_cancel(self) -> None:
        self.dismiss(None)
