"""Two runs of one prompt side by side, token by token, with the first token where they differ marked.

Each answer is drawn from its run's tokens (the same text the answer panel shows); tokens both runs share are
plain, the first differing token of each is marked, and what follows it is tinted: where the branches part.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from ..branches import Branch, first_difference
from ..format import token_count


def answer_text(branch: Branch, differ: int | None) -> Text:
    """The answer of `branch`, its token `differ` (0-based step) marked and the rest tinted."""
    run = branch.state.run
    texts = run.values("text")
    specials = run.values("special")
    out = Text()
    for i, (text, special) in enumerate(zip(texts, specials)):
        shown = text if text else ("" if not special else run.step(i).piece)  # as the answer panel writes it
        if not shown:
            continue
        if differ is not None and i == differ:
            out.append(shown, style="reverse bold")
        elif differ is not None and i > differ:
            out.append(shown, style="italic")
        elif i < branch.inherited:
            out.append(shown, style="dim")
        else:
            out.append(shown)
    return out


class CompareScreen(Screen[None]):
    BINDINGS = [Binding("escape,c", "app.pop_screen", "close", show=True),
                Binding("q", "quit_app", "quit", show=False)]

    DEFAULT_CSS = """
    CompareScreen { layout: vertical; }
    CompareScreen #compare-summary { height: auto; padding: 0 1; color: $text-muted; }
    CompareScreen Horizontal { height: 1fr; }
    CompareScreen VerticalScroll {
        width: 1fr; border: round $primary; border-title-color: $primary; border-title-style: bold; padding: 0 1;
    }
    """

    def __init__(self, left: Branch, right: Branch) -> None:
        super().__init__()
        self.left, self.right = left, right
        a, b = left.state.run.values("id"), right.state.run.values("id")
        self.differ = first_difference(a, b)

    @property
    def summary(self) -> str:
        left, right, differ = self.left, self.right, self.differ
        if differ is None:
            return f"#{left.number} and #{right.number} wrote the same {len(left.state.run)} tokens"
        run_a, run_b = left.state.run, right.state.run
        piece_a = run_a.step(differ).piece if differ < len(run_a) else "(ended)"
        piece_b = run_b.step(differ).piece if differ < len(run_b) else "(ended)"
        return (f"same for {differ} token{'s' if differ != 1 else ''}; first difference at step {differ + 1}: "
                f"#{left.number} {piece_a}  vs  #{right.number} {piece_b}")

    def compose(self) -> ComposeResult:
        yield Static(self.summary + "   (esc closes)", id="compare-summary", markup=False)
        with Horizontal():
            for branch in (self.left, self.right):
                with VerticalScroll() as pane:
                    pane.border_title = branch.label
                    ending = "done" if branch.ending.startswith("done") else branch.ending
                    pane.border_subtitle = f"{token_count(branch.state, short=True)} · {ending}"
                    yield Static(answer_text(branch, self.differ), id=f"compare-{branch.number}")

    def action_quit_app(self) -> None:
        self.app.pop_screen()
        self.app.call_later(self.app.action_quit)
