"""Two runs of one prompt side by side, token by token, with the first token where they differ marked.

Each answer is drawn from its run's tokens (the same text the answer panel shows, wrapped by the same rule onto
the same lines at a width); tokens both runs share are plain, the first differing token of each is marked, and what follows it is tinted: where the branches part.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from ..branches import Branch, first_difference
from tokentui.core.steps.display import display_text

from ..format import plural, token_count, whole_parts
from ..panels.answer_layout import AnswerLayout


def _style(branch: Branch, differ: int | None, i: int) -> str:
    if differ is not None and i == differ:
        return "reverse bold"
    if differ is not None and i > differ:
        return "italic"
    return "dim" if i < branch.inherited else ""


def answer_texts(branch: Branch) -> list[str]:
    """Each step's text as the answer panel writes it (a special token with no text: its piece)."""
    run = branch.state.run
    return [text if text else (run.step(i).piece if special else "")
            for i, (text, special) in enumerate(zip(run.values("text"), run.values("special")))]


def answer_text(branch: Branch, differ: int | None, width: int = 0) -> Text:
    """The answer of `branch`, its token `differ` (0-based step) marked and the rest tinted; `width` > 0: broken
    into lines `width` cells wide by the answer panel's own word wrap (tui/panels/answer_layout.py), so the same
    text sits on the same lines as there."""
    texts = answer_texts(branch)
    out = Text()
    if width <= 0:
        for i, shown in enumerate(texts):
            if shown:
                out.append(shown, style=_style(branch, differ, i))
        return out
    layout = AnswerLayout()
    layout.restart(width)
    for text in texts:
        layout.lay_out(layout.add(text))
    for n, line in enumerate(layout.lines):
        if n:
            out.append("\n")
        for index, start, end in line:
            out.append(texts[index][start:end], style=_style(branch, differ, index))
    return out


class WholeParts(Static):
    """A line of parts, broken between them (never inside one) at this widget's width, again on each resize."""

    def __init__(self, parts: list[tuple[str, str]], **kwargs) -> None:
        super().__init__(whole_parts(parts, 0, sep="  "), markup=False, **kwargs)
        self.parts = parts

    def on_resize(self) -> None:
        if self.content_size.width > 0:
            self.update(whole_parts(self.parts, self.content_size.width, sep="  ", indent=""))


class AnswerPane(Static):
    """One run's answer, wrapped as the answer panel wraps it at this pane's width (again on each resize)."""

    DEFAULT_CSS = "AnswerPane { text-wrap: nowrap; }"

    def __init__(self, branch: Branch, differ: int | None, **kwargs) -> None:
        super().__init__(answer_text(branch, differ), markup=False, **kwargs)
        self.branch, self.differ = branch, differ

    def on_resize(self) -> None:
        width = self.content_size.width
        if width > 0:
            self.update(answer_text(self.branch, self.differ, width))


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

    def summary_parts(self) -> list[tuple[str, str]]:
        """What the line above the panes says, in parts that are never broken."""
        left, right, differ = self.left, self.right, self.differ
        if differ is None:
            said = [(f"#{left.number} and #{right.number} wrote the same {plural(len(left.state.run), 'token')}",
                     "")]
        else:
            run_a, run_b = left.state.run, right.state.run
            piece_a = display_text(run_a.step(differ).piece) if differ < len(run_a) else "(ended)"
            piece_b = display_text(run_b.step(differ).piece) if differ < len(run_b) else "(ended)"
            said = [(f"same for {plural(differ, 'token')};", ""), (f"first difference at step {differ + 1}:", ""),
                    (f"#{left.number} {piece_a}  vs  #{right.number} {piece_b}", "")]
        return said + [("(esc closes)", "dim")]

    @property
    def summary(self) -> str:
        return whole_parts(self.summary_parts(), 0, sep="  ").plain

    def compose(self) -> ComposeResult:
        yield WholeParts(self.summary_parts(), id="compare-summary")
        with Horizontal():
            for branch in (self.left, self.right):
                with VerticalScroll() as pane:
                    pane.border_title = branch.label
                    ending = "done" if branch.ending.startswith("done") else branch.ending
                    pane.border_subtitle = f"{token_count(branch.state, short=True)} · {ending}"
                    yield AnswerPane(branch, self.differ, id=f"compare-{branch.number}")

    def action_quit_app(self) -> None:
        self.app.pop_screen()
        self.app.call_later(self.app.action_quit)
