"""After a failed load: choose another model or device and load again (the dialog checks them first)."""

from __future__ import annotations

from typing import Callable

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label


class ModelPicker(ModalScreen["tuple[str, str] | None"]):
    """Dismisses with (model, device), or None when cancelled.

    `check(model, device)` raises with a one-line message when the pair cannot work (the same checks the command line
    makes before the dashboard opens); the message is shown here and the dialog stays open.
    """

    BINDINGS = [
        Binding("escape", "cancel", "cancel"),
        Binding("ctrl+s", "submit", "load", priority=True),
    ]

    DEFAULT_CSS = """
    ModelPicker { align: center middle; background: $background 60%; }
    ModelPicker > Vertical {
        width: 80; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1;
        border-title-color: $primary; border-title-style: bold;
    }
    ModelPicker Label { margin-top: 1; color: $text-muted; }
    ModelPicker #picker-error { color: $error; height: auto; margin-top: 0; }
    ModelPicker Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    ModelPicker Button { margin-left: 1; }
    """

    def __init__(self, model: str | None, device: str, check: Callable[[str, str], None] | None = None) -> None:
        super().__init__()
        self._model = model or "embedded"
        self._device = device or "auto"
        self._check = check

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "change model or device"
            box.border_subtitle = "enter / ctrl+s load · esc cancel"
            yield Label("model: embedded, a .gguf file, a model folder, or a hub id in your local cache")
            yield Input(self._model, id="picker-model")
            yield Label("device: auto, cpu, cuda or cuda:N")
            yield Input(self._device, id="picker-device")
            yield Label("", id="picker-error")
            with Horizontal():
                yield Button("Load (ctrl+s)", id="load", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#picker-model", Input).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "load":
            self.action_submit()
        else:
            self.action_cancel()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_submit()

    def action_submit(self) -> None:
        if self._checking:
            return
        model = self.query_one("#picker-model", Input).value.strip() or "embedded"
        device = self.query_one("#picker-device", Input).value.strip() or "auto"
        if self._check is None:
            self.dismiss((model, device))
            return
        self._checking = True
        self.query_one("#picker-error", Label).update("checking…")
        self._run_check(model, device)

    _checking = False

    @work(thread=True, exclusive=True, group="model-check")
    def _run_check(self, model: str, device: str) -> None:
        """Off the UI thread: asking whether CUDA is visible, or whether the hub answers, takes seconds."""
        try:
            self._check(model, device)
        except Exception as err:  # the checker's one-line message is the point
            self.app.call_from_thread(self._checked, model, device, str(err))
        else:
            self.app.call_from_thread(self._checked, model, device, None)

    def _checked(self, model: str, device: str, error: str | None) -> None:
        self._checking = False
        if error is not None:
            self.query_one("#picker-error", Label).update(error)
            return
        self.dismiss((model, device))

    def action_cancel(self) -> None:
        self.dismiss(None)
