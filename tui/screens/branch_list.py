"""`B`: every run of this prompt — the first and each branch, with where it left its parent — to switch to one,
or to compare two side by side (`c`)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from ..branches import BranchTree
from ..format import token_count, whole_parts
from ..served import server_of
from .modal import ListDialog, list_dialog_css


class BranchList(ListDialog):
    """Dismisses with ("show", number), ("compare", shown number, other number) or None."""

    BINDINGS = [Binding("c", "compare", "compare with the shown run", show=True)]

    DEFAULT_CSS = list_dialog_css("BranchList", width=90, list_height=16)

    def __init__(self, tree: BranchTree) -> None:
        super().__init__()
        self.branch_tree = tree

    def compose(self) -> ComposeResult:
        tree = self.branch_tree
        with Vertical() as body:
            body.border_title = f"runs of this prompt ({len(tree)})"
            body.border_subtitle = "enter show · c compare with the shown one · esc close"
            yield Static(f"showing #{tree.shown_branch.number}", markup=False)
            yield OptionList(*[Option(self.line(branch, 0), id=str(branch.number)) for branch in tree.branches],
                             id="branch-list")

    def line(self, branch, width: int) -> Text:
        """One run's entry, broken only between its parts where it is wider than `width` cells."""
        tree = self.branch_tree
        state = branch.state
        parts = [(("▶ " if branch is tree.shown_branch else "  ") + branch.label, ""),
                 (token_count(state), "dim"), (branch.ending, "dim")]
        if branch.event is not None and server_of(state.facts) is not None:
            # a served model's branch: what the server's prefix cache reused, it does not say
            parts.append(("KV the server's prefix cache", "dim"))
        elif branch.event is not None:
            reused = branch.event.kv_reused_tokens
            parts.append((f"KV {'reused ' + format(reused, ',') if reused else 'prefilled afresh'}", "dim"))
        elif branch.turn is not None and state.run.turn is not None:  # a follow-up (tui/followup.py)
            reused = state.run.turn.reused_tokens
            if reused is None and state.prefill is not None:
                reused = state.prefill.reused_tokens  # a server's own count of its cached tokens, where it said
            said = "reuse unknown" if reused is None else f"reused {reused:,}" if reused else "prefilled afresh"
            parts.append((f"KV {said}", "dim"))
        return whole_parts(parts, width, indent="    ")

    def on_resize(self) -> None:
        options = self.query_one(OptionList)
        width = options.scrollable_content_region.width
        for branch in self.branch_tree.branches:
            options.replace_option_prompt(str(branch.number), self.line(branch, width))

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        options.highlighted = self.branch_tree.shown
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(("show", int(event.option.id)))

    def action_compare(self) -> None:
        options = self.query_one(OptionList)
        if options.highlighted is None:
            return
        other = self.branch_tree.branches[options.highlighted].number
        shown = self.branch_tree.shown_branch.number
        if other == shown:
            self.notify("Highlight another run to compare with the shown one", timeout=4, markup=False)
            return
        self.dismiss(("compare", shown, other))
