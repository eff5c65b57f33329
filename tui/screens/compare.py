"""Two runs of one prompt side by side, token by token, with the first token where they differ marked.

Each answer is drawn from its run's tokens (the same text the answer panel shows, wrapped by the same rule onto
the same lines at a width); tokens both runs share are plain, the first differing token of each is marked, and what follows it is tinted: where the branches part.
`A` adds where each run's new token looked at one step, side by side (tui/screens/compare_attention.py), that step
underlined in both answers.
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
from .compare_attention import CompareAttention, first_step, pane_text, same_sources, step_attention


def _style(branch: Branch, differ: int | None, i: int, mark: int | None = None) -> str:
    if differ is not None and i == differ:
        style = "reverse bold"
    elif differ is not None and i > differ:
        style = "italic"
    else:
        style = "dim" if i < branch.inherited else ""
    return f"{style} underline".strip() if i == mark else style


def answer_texts(branch: Branch) -> list[str]:
    """Each step's text as the answer panel writes it (a special token with no text: its piece)."""
    run = branch.state.run
    return [text if text else (run.step(i).piece if special else "")
            for i, (text, special) in enumerate(zip(run.values("text"), run.values("special")))]


def answer_text(branch: Branch, differ: int | None, width: int = 0, mark: int | None = None) -> Text:
    """The answer of `branch`, its token `differ` (0-based step) marked and the rest tinted, the step `mark`
    underlined; `width` > 0: broken into lines `width` cells wide by the answer panel's own word wrap
    (tui/panels/answer_layout.py), so the same text sits on the same lines as there."""
    texts = answer_texts(branch)
    out = Text()
    if width <= 0:
        for i, shown in enumerate(texts):
            if shown:
                out.append(shown, style=_style(branch, differ, i, mark))
        return out
    layout = AnswerLayout()
    layout.restart(width)
    for text in texts:
        layout.lay_out(layout.add(text))
    for n, line in enumerate(layout.lines):
        if n:
            out.append("\n")
        for index, start, end in line:
            out.append(texts[index][start:end], style=_style(branch, differ, index, mark))
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
        self.mark: int | None = None  # the step the attention rows show, underlined

    def on_resize(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        width = self.content_size.width
        if width > 0:
            self.update(answer_text(self.branch, self.differ, width, self.mark))


class CompareScreen(Screen[None]):
    BINDINGS = [Binding("escape,c", "app.pop_screen", "close", show=True),
                Binding("q", "quit_app", "quit", show=False),
                Binding("A,shift+a", "attention", "attention", show=True),
                Binding("left_square_bracket", "step(-1)", "step −", show=False),
                Binding("right_square_bracket", "step(1)", "step +", show=False),
                Binding("comma", "layer(-1)", "layer −", show=False),
                Binding("full_stop", "layer(1)", "layer +", show=False),
                Binding("semicolon", "head(-1)", "head −", show=False),
                Binding("apostrophe", "head(1)", "head +", show=False)]

    DEFAULT_CSS = """
    CompareScreen { layout: vertical; }
    CompareScreen #compare-summary { height: auto; padding: 0 1; color: $text-muted; }
    CompareScreen #compare-attention-summary { height: auto; padding: 0 1; color: $text-muted; display: none; }
    CompareScreen Horizontal { height: 1fr; }
    CompareScreen #compare-attention { height: auto; max-height: 50%; display: none; }
    CompareScreen.-attention #compare-attention, CompareScreen.-attention #compare-attention-summary {
        display: block;
    }
    CompareScreen VerticalScroll {
        width: 1fr; border: round $primary; border-title-color: $primary; border-title-style: bold; padding: 0 1;
    }
    CompareScreen .compare-attention-pane { width: 1fr; height: auto; padding: 0 1; border: round $secondary; }
    """

    def __init__(self, left: Branch, right: Branch) -> None:
        super().__init__()
        self.left, self.right = left, right
        a, b = left.state.run.values("id"), right.state.run.values("id")
        self.differ = first_difference(a, b)
        self.inside = CompareAttention(step=first_step((len(a), len(b)), self.differ))

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
        yield Static("", id="compare-attention-summary", markup=False)
        with Horizontal(id="compare-attention"):
            for branch in (self.left, self.right):
                yield Static("", id=f"compare-attention-{branch.number}", classes="compare-attention-pane",
                             markup=False)

    # ---- attention at one step (tui/screens/compare_attention.py) ---------------------------------------------
    def attention_summary(self) -> str:
        """The line above the two runs' attention: which step, whether they look at the same sources, the keys."""
        choice, left, right = self.inside, self.left, self.right
        a, b = step_attention(left.state, choice.step), step_attention(right.state, choice.step)
        same = same_sources(a, b, choice.layer, choice.head)
        said = {True: "the same sources in both runs", False: "the runs look at different sources",
                None: "only one run (or neither) has attention here"}[same]
        return f"attention at step {choice.step + 1}: {said} · [ ] step · , . layer · ; ' head · A hides"

    def show_attention(self) -> None:
        on = self.inside.on
        self.set_class(on, "-attention")
        for branch in (self.left, self.right):
            pane = self.query_one(f"#compare-{branch.number}", AnswerPane)
            pane.mark = self.inside.step if on else None
            pane.redraw()
            if on:
                self.query_one(f"#compare-attention-{branch.number}", Static).update(
                    pane_text(branch.state, branch.number, self.inside))
                self.query_one(f"#compare-attention-{branch.number}", Static).border_title = branch.label
        if on:
            self.query_one("#compare-attention-summary", Static).update(self.attention_summary())

    def _layers(self) -> list[int]:
        attention = step_attention(self.left.state, self.inside.step) or \
            step_attention(self.right.state, self.inside.step) or []
        return [la.layer for la in attention]

    def _heads(self) -> int:
        attention = step_attention(self.left.state, self.inside.step) or \
            step_attention(self.right.state, self.inside.step)
        heads = attention[-1].heads if attention else None
        return len(heads) if heads is not None else 0

    def action_attention(self) -> None:
        self.inside.on = not self.inside.on
        self.show_attention()

    def action_step(self, delta: int) -> None:
        if not self.inside.on:
            return
        self.inside.move_step(delta, max(len(self.left.state.run), len(self.right.state.run)))
        self.show_attention()

    def action_layer(self, delta: int) -> None:
        if not self.inside.on:
            return
        self.inside.move_layer(delta, self._layers())
        self.show_attention()

    def action_head(self, delta: int) -> None:
        if not self.inside.on:
            return
        self.inside.move_head(delta, self._heads())
        self.show_attention()

    def action_quit_app(self) -> None:
        self.app.pop_screen()
        self.app.call_later(self.app.action_quit)
