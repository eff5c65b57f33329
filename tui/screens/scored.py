"""A scored text's summary (`tokentui score`): how likely the model finds the answer — its total log-probability,
its perplexity and its least likely tokens (core/runs/scoring.py's figures, from each step's raw probability). The
answer behind it is heat-coloured by probability; every step can be viewed ([ ]), looked into (the lens, the
one-pass panel) and branched (b), as a generated run's."""

from __future__ import annotations

import math

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from tokentui.core.runs.scoring import percent, surprisal_bits


def summary_text(summary) -> Text:
    out = Text()
    out.append(f"{summary.tokens} tokens", style="bold")
    logprob = "−∞" if summary.logprob == -math.inf else f"{summary.logprob:.3f}".replace("-", "−")
    perplexity = "∞" if summary.perplexity == math.inf else f"{summary.perplexity:.3f}"
    out.append(f" · log-probability {logprob} nats · perplexity {perplexity}\n\n")
    out.append("least likely:\n", style="dim")
    for t in summary.least_likely:
        bits = surprisal_bits(t.raw_prob)
        rank = f"rank {t.rank + 1}" if t.rank is not None else "rank ?"
        out.append(f"  step {t.index + 1:>4}  ")
        out.append(f"{t.piece:<14}", style="bold")
        out.append(f" p {percent(t.raw_prob):>9}  {rank:<9} {bits:5.1f} bits\n" if bits != math.inf else
                   f" p {percent(t.raw_prob):>9}  {rank:<9}   inf bits\n")
    out.append("\nThe answer is coloured by probability (h); [ ] view its steps, b branches at one.", style="dim")
    return out


class ScoredDialog(ModalScreen[None]):
    BINDINGS = [Binding("escape,enter", "dismiss", "close", show=True)]

    DEFAULT_CSS = """
    ScoredDialog { align: center middle; background: $background 40%; }
    ScoredDialog > Vertical {
        width: 72; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; border-title-color: $primary; border-title-style: bold;
        border-subtitle-color: $text-muted; background: $surface; padding: 0 1;
    }
    """

    def __init__(self, summary) -> None:
        super().__init__()
        self.summary = summary

    def compose(self) -> ComposeResult:
        with Vertical() as body:
            body.border_title = "scored answer"
            body.border_subtitle = "enter / esc close"
            yield Static(summary_text(self.summary), id="scored-summary")

    async def action_dismiss(self, result=None) -> None:
        self.dismiss(None)
