"""`?`: every key, what it does, the six steps the panels show, and which panels show at which terminal size
(from tui/sizes.py, the table the app lays itself out by)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tokentui.core.samplers import STAGES

from ..keys import KEYS
from ..sizes import plan, size_table

STEPS = (
    ("1 chat template", "the app wraps your question in the model's fixed format"),
    ("2 tokenize", "the formatted text becomes token ids"),
    ("3 prefill", "one model run over the whole prompt scores the first token and fills the KV cache"),
    ("4 selection", f"{', '.join(s.param.label for s in STAGES)}, then greedy or a draw"),
    ("5 decode", "the chosen token goes back in; one model run per token"),
    ("6 detokenize", "ids turn back into text; incomplete bytes wait for the next token"),
)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q,question_mark,f1", "dismiss", "close", show=True),
    ]
    # The body has the focus from the start, so ↑ ↓ PgUp PgDn Home End and the wheel scroll it at once (the app's
    # AUTO_FOCUS names the answer, which is not on this screen: nothing had the focus until Tab).
    AUTO_FOCUS = "#help-body"

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
        background: $background 60%;
    }
    HelpScreen > VerticalScroll {
        width: 96;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: round $primary;
        border-title-color: $primary;
        border-title-style: bold;
        background: $surface;
        padding: 0 1;
    }
    HelpScreen Static { width: 100%; }
    HelpScreen > VerticalScroll:focus { border: round $primary; }
    """

    def __init__(self, run_paused: bool = False) -> None:
        """run_paused: the dashboard paused the run while this screen covers it (it resumes on close)."""
        super().__init__()
        self.run_paused = run_paused

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body") as body:
            body.border_title = "tokentui · keys"
            body.border_subtitle = ("generation paused while this is open · " if self.run_paused else "") \
                + "↑↓ PgDn End scroll · esc / ? close"
            yield Static(self._keys_table(), id="help-keys")
            yield Static("Tab: the answer ⇄ the prompt panel; ↑ ↓ PgUp PgDn Home End or the mouse wheel scroll it.",
                         id="help-scroll", markup=False)
            yield Static(self._steps_table(), id="help-steps")
            yield Static(self._sizes_table(), id="help-sizes")

    def _keys_table(self) -> Table:
        """One row a key: the key, then its title (bold) and what it does, in one column so that most rows take
        one line and the six steps below still show on a 100×48 terminal."""
        table = Table(box=None, show_header=False, padding=(0, 2, 0, 0), expand=True)
        table.add_column("key", style="bold", no_wrap=True, min_width=7)
        table.add_column("does", ratio=1)
        for spec in KEYS:
            does = Text()
            does.append(spec.title, style="bold")
            does.append("  " + spec.help)
            table.add_row(Text(spec.display, style=self._accent()), does)
        return table

    def _steps_table(self) -> Table:
        table = Table(box=None, show_header=False, padding=(0, 2, 0, 0), expand=True, title="the six steps",
                      title_justify="left", title_style="bold")
        table.add_column("step", style="bold", no_wrap=True, min_width=25)
        table.add_column("what", ratio=1)
        for name, what in STEPS:
            table.add_row(name, what)
        return table

    def _sizes_table(self) -> Table:
        try:
            width, height = self.app.size
        except Exception:
            width = height = 0
        here = plan(width, height)
        hidden = ", ".join(p.short for p in here.hidden) or "nothing"
        table = Table(box=None, show_header=False, padding=(0, 2, 0, 0), expand=True,
                      title=f"panels by terminal size (now {width}×{height}; hidden here: {hidden})",
                      title_justify="left", title_style="bold")
        table.add_column("what", ratio=1)
        table.add_column("shown at", style="bold", no_wrap=True)
        for what, where in size_table():
            table.add_row(what, where)
        return table

    def _accent(self) -> str:
        try:
            return str(self.app.current_theme.accent or "bold")
        except Exception:
            return "bold"

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
