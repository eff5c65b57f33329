"""`x` done: where the answer and the run record were written, each full path on a line of its own.

A toast is too narrow for paths (it broke them mid-name); here they are never wrapped (a path wider than the
terminal scrolls sideways), can be selected with the mouse, and `c` / `C` send them to the terminal's clipboard
(OSC 52, which also works over SSH in most terminals; tui/clipboard.py says whether it could); `x` exports again.
"""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import HorizontalScroll, Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from ..clipboard import copy_note


class ExportedDialog(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,enter", "dismiss", "close", show=True),
        # q quits everywhere in the dashboard. Not straight to app.quit: that ended the app while the key was still
        # on its way up to it, which then found no screen left (a traceback at exit, now and then).
        Binding("q", "quit_app", "quit", show=False),
        Binding("c", "copy(0)", "copy the answer's path", show=True),
        Binding("C,shift+c", "copy(1)", "copy the record's path", show=True),
        Binding("x", "app.export", "export again", show=False),
    ]

    DEFAULT_CSS = """
    ExportedDialog {
        align: center middle;
        background: $background 60%;
    }
    ExportedDialog > Vertical {
        width: auto;
        min-width: 40;
        max-width: 100%;
        height: auto;
        border: round $primary;
        border-title-color: $primary;
        border-title-style: bold;
        border-subtitle-color: $text-muted;
        background: $surface;
        padding: 0 1;
    }
    ExportedDialog Static { width: auto; color: $text-muted; }
    ExportedDialog HorizontalScroll { width: auto; max-width: 100%; height: auto; scrollbar-size-horizontal: 1; }
    ExportedDialog #exported-paths { width: auto; color: $foreground; text-wrap: nowrap; }
    """

    def __init__(self, answer: Path, record: Path | None, running: bool = False) -> None:
        super().__init__()
        self.paths = [str(answer)] + ([str(record)] if record is not None else [])
        self.running = running  # the run keeps going behind the dialog (it is small; the panels stay in view)

    @property
    def text(self) -> str:
        """The paths as shown: one per line, whole."""
        return "\n".join(self.paths)

    def compose(self) -> ComposeResult:
        with Vertical(id="exported-body") as body:
            body.border_title = "exported"
            body.border_subtitle = "c copy answer path" + (" · C copy record path" if len(self.paths) > 1 else "") \
                + " · esc close"
            what = "the answer (line 1) and the run record (line 2):" if len(self.paths) > 1 else \
                "the answer (this run was not recorded):"
            yield Static(what + ("  (the run goes on behind this)" if self.running else ""))
            with HorizontalScroll():
                yield Static(self.text, markup=False, id="exported-paths")

    def action_copy(self, which: int) -> None:
        if which < len(self.paths):
            self.app.copy_to_clipboard(self.paths[which])
            message, severity = copy_note(Path(self.paths[which]).name)  # tui/clipboard.py: what it could do
            self.notify(message, severity=severity, timeout=6, markup=False)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)

    def action_quit_app(self) -> None:
        """Close this dialog, then quit once the key has been handled."""
        self.dismiss(None)
        self.app.call_later(self.app.action_quit)
