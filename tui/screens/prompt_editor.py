"""`e`: edit the prompt and the system prompt; ctrl+s runs it, ctrl+a selects all of the field being typed in (then
typing replaces it, delete clears it: the dialog says so), ctrl+r switches between the chat template and a raw
run (no template: the text tokenized as is, core/runs/turns.py). `u` opens it for a follow-up (tui/followup.py):
the next user message of the conversation, with no system prompt field (the conversation keeps its own) and the
conversation's mode (chat or raw) fixed."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea


CLEAR_HINT = "prompt — ctrl+a selects it all: type to replace it, delete to clear it"
FOLLOW_UP_HINT = "follow-up — your next message in this conversation (ctrl+a selects it all)"


@dataclass(frozen=True, slots=True)
class Edited:
    """What the editor was submitted with: the prompt (or the follow-up message), the system prompt (None: empty,
    or a follow-up's), and whether the run is raw (no chat template)."""

    prompt: str
    system: str | None = None
    raw: bool = False


class PromptEditor(ModalScreen["Edited | None"]):
    """Dismisses with an Edited, or None when cancelled."""

    BINDINGS = [
        Binding("escape", "cancel", "cancel"),
        Binding("ctrl+s", "submit", "run", priority=True),
        # every editor's select-all (issue 40: it went to the line's start); priority: the fields' own ctrl+a is home
        Binding("ctrl+a", "select_all", "select all", priority=True),
        Binding("ctrl+r", "toggle_raw", "raw", priority=True),
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
    PromptEditor #system-effective { color: $text-muted; height: auto; max-height: 4; }
    PromptEditor #editor-paused { color: $warning; height: auto; margin-top: 1; }
    PromptEditor #follow-up-after { color: $text-muted; height: auto; }
    PromptEditor Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    PromptEditor Button { margin-left: 1; }
    """

    def __init__(self, prompt: str, system: str | None, cursor_blink: bool = True, *,
                 default_system: str | None = None, default_known: bool = False, run_paused: bool = False,
                 raw: bool = False, follow_up: str | None = None) -> None:
        """default_system: what this model's chat template puts in the system message when the field is left
        empty (None: nothing); default_known is False until a run has reported it (the model is still loading).
        run_paused: the dashboard paused the run while this dialog is open. raw: the run starts raw (ctrl+r
        switches). follow_up: a follow-up's editor, this line saying what it follows (its mode is the
        conversation's)."""
        super().__init__()
        self.raw = raw
        self._follow_up = follow_up
        self._prompt = prompt
        self._system = system or ""
        self._blink = cursor_blink
        self._default = default_system
        self._default_known = default_known
        self._run_paused = run_paused

    def empty_means(self) -> str:
        """What an empty system prompt field means for this model, in words."""
        if not self._default_known:
            return "empty: the model's own default, if its template has one (known once it is loaded)"
        if self._default:
            return "empty: this model's template puts in its default (below)"
        return "empty: no system message (this model's template adds none)"

    def label(self, typed: str) -> str:
        """The system prompt field's label with `typed` in it: what leaving it empty would mean, only while it is."""
        if typed.strip():
            return "system prompt — yours (empty it for " + (
                "the template's default)" if self._default or not self._default_known else "none)")
        return f"system prompt — {self.empty_means()}"

    def effective(self, typed: str) -> str:
        """The system prompt the model will read with `typed` in the field."""
        typed = typed.strip()
        if typed:
            return f"in effect: {typed}"
        if not self._default_known:
            return "in effect: not known until the model is loaded"
        return f"in effect (template default): {self._default}" if self._default else "in effect: none"

    def dialog_title(self) -> str:
        """The dialog's title: what it edits and the mode it runs in (in the border, not on a row of its own, so the
        dialog is no taller at 80×24)."""
        mode = "raw: no chat template" if self.raw else "chat template"
        return f"follow-up · {mode}" if self._follow_up is not None else f"edit prompt · {mode}"

    def compose(self) -> ComposeResult:
        with Vertical(id="editor-box") as box:
            follow_up = self._follow_up is not None
            box.border_title = self.dialog_title()
            box.border_subtitle = "ctrl+s run · ctrl+a select all · " + ("" if follow_up else "ctrl+r raw · ") + \
                "esc cancel"
            if follow_up:
                yield Static(self._follow_up, id="follow-up-after", markup=False)
            yield Label(FOLLOW_UP_HINT if follow_up else CLEAR_HINT, id="prompt-label")
            area = TextArea(self._prompt, id="prompt-text", soft_wrap=True, show_line_numbers=False)
            area.cursor_blink = self._blink
            yield area
            yield Label("", id="prompt-error")
            if not follow_up:
                yield Label(self.label(self._system), id="system-label")
                system = Input(self._system, id="system-text", placeholder="e.g. You are a terse assistant.")
                system.cursor_blink = self._blink
                yield system
                yield Static(self.effective(self._system), id="system-effective", markup=False)
            if self._run_paused:
                yield Static("generation is paused while this is open; esc resumes it, ctrl+s starts the new run",
                             id="editor-paused", markup=False)
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

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "system-text":
            self.query_one("#system-label", Label).update(self.label(event.value))
            self.query_one("#system-effective", Static).update(self.effective(event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_submit()

    def action_submit(self) -> None:
        prompt = self.query_one("#prompt-text", TextArea).text
        if not prompt.strip():
            self.query_one("#prompt-error", Label).update(
                "the follow-up is empty: type a message" if self._follow_up is not None else "the prompt is empty")
            return
        if self._follow_up is not None:
            self.dismiss(Edited(prompt, None, self.raw))
            return
        system = self.query_one("#system-text", Input).value.strip() or None
        self.dismiss(Edited(prompt, system, self.raw))

    def action_toggle_raw(self) -> None:
        """ctrl+r: a raw run (no chat template) or the chat template; a follow-up keeps its conversation's."""
        if self._follow_up is not None:
            self.notify("A follow-up keeps the conversation's mode: e starts a new one, where ctrl+r switches",
                        timeout=5, markup=False)
            return
        self.raw = not self.raw
        self.query_one("#editor-box", Vertical).border_title = self.dialog_title()

    def action_select_all(self) -> None:
        """Select all of the focused field (the prompt or the system prompt)."""
        focused = self.focused
        if isinstance(focused, (TextArea, Input)):
            focused.select_all()

    def action_cancel(self) -> None:
        self.dismiss(None)
