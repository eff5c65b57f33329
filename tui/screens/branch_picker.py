"""`b`: branch at a step — pick another of that step's candidates; the model goes on from there.

Lists the step's candidates as the candidates panel does (raw and post-sampler probability, the token the run took
marked). Enter branches with the highlighted one, or a digit with that rank at once (1–9, 0 for the 10th: picking
tokens by hand is one key a token); the engine cuts its KV cache back to that step (no new prefill of the prompt)
and generates on with the sampler settings in force now — a paused run stays paused (tui/branching.py). `t` types
a phrase to force instead (tui/screens/phrase.py): the dialog closes with "phrase".
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from tokentui.core.runs.events import StepEvent

from ..format import fit_piece, percent
from .modal import ListDialog, list_dialog_css


def _pct(p: float | None) -> str:
    """A probability as the list writes it; "—" where it was not reported (a served model's other one)."""
    return f"{percent(p):>6}" if p is not None else "     —"


class BranchPicker(ListDialog):

    DEFAULT_CSS = list_dialog_css("BranchPicker", width=64, list_height=14)
    BINDINGS = [Binding("t", "phrase", "type a phrase", show=True),
                *(Binding(str(rank % 10), f"pick({rank})", f"rank {rank}", show=False) for rank in range(1, 11))]

    def __init__(self, step: StepEvent, run_label: str = "", paused: bool = False) -> None:
        """`paused`: the run is paused by the user, and the branch will be too."""
        super().__init__()
        self.step = step
        self.run_label = run_label
        self.paused = paused

    def compose(self) -> ComposeResult:
        step = self.step
        with Vertical() as body:
            body.border_title = f"branch at step {step.index + 1}" + (f" of {self.run_label}" if self.run_label else "")
            body.border_subtitle = "↑↓ enter or 1–9 branch · t type a phrase · esc cancel"
            then = ("The run stays paused: n lets the next token through." if self.paused else
                    "The model goes on from it.")
            yield Static("Take another token here (its rank's digit, or ↑↓ and enter): the KV cache is cut back to "
                         f"this step, no new prefill. {then} Cut: the sampler had cut it; it can still be taken.",
                         markup=False)
            options = []
            for rank, c in enumerate(step.candidates, 1):
                line = Text()
                line.append(f"{rank:>2} ")
                line.append(fit_piece(c.piece, 16), style="bold" if c.id != step.id else "dim")
                line.append(f" raw {_pct(c.raw_prob)} post {_pct(c.prob)}")
                if c.id == step.id:
                    line.append("  taken", style="dim italic")
                elif c.prob == 0:
                    line.append("  cut", style="dim")  # by top-k / top-p or greedy: still a valid branch
                options.append(Option(line, id=str(c.id), disabled=c.id == step.id))
            yield OptionList(*options, id="branch-candidates")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        first = next((i for i, c in enumerate(self.step.candidates) if c.id != self.step.id), None)
        if first is not None:
            options.highlighted = first
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id))

    def action_pick(self, rank: int) -> None:
        """The candidate of this rank (1 = the top), at once; the token the run took, or a rank not listed, is no
        branch: a bell."""
        cands = self.step.candidates
        if rank <= len(cands) and cands[rank - 1].id != self.step.id:
            self.dismiss(cands[rank - 1].id)
        else:
            self.app.bell()

    def action_phrase(self) -> None:
        self.dismiss("phrase")
