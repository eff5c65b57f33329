"""Attention in the comparison of two runs (issue 39, item 1: "works with ... branch compare"): for one step of
both runs, where each run's new token looked, side by side, so a learner sees how the two answers' queries part
after the token where they differ.

Which step: at first the one after the first difference, the first whose query differs (the step where the runs
part was chosen from the scores of the prefix they share, so its attention is the same in both); `[` `]` move it.
Which layer and head: as the attention view (`,` `.` the layer, `;` `'` the head or the mean of the heads). What
is drawn is each run's own step event (StepEvent.attention): a run that ran with the view off says so in one line.
Plain Python (no Textual): tui/screens/compare.py places it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from tokentui.core.steps.display import display_text

from ..attention_view import layer_of, pieces_of, rest_of, source_rows, sources
from ..format import percent

__all__ = ["CompareAttention", "first_step", "pane_text", "same_sources"]

ROWS = 6  # sources listed per run: enough to see where the two lists part, few enough to leave the answers room


def first_step(lengths: tuple[int, int], differ: int | None) -> int:
    """The step shown first: the one after the first difference (the first whose query differs) where both runs
    have it, else the difference's own step; with no difference, the last step both runs have."""
    shared = min(lengths)
    if shared <= 0:
        return 0
    if differ is None:
        return shared - 1
    return differ + 1 if differ + 1 < shared else min(differ, max(lengths) - 1)


@dataclass
class CompareAttention:
    """The comparison's attention choices: on or off, the step (0-based), the layer (None: the last) and the head
    (None: the mean of the heads). Kept by the comparison screen, which asks the engine for nothing: it draws
    what the runs' steps carry."""

    step: int
    on: bool = False
    layer: int | None = None
    head: int | None = None

    def move_step(self, delta: int, longest: int) -> None:
        self.step = max(0, min(longest - 1, self.step + delta))

    def move_layer(self, delta: int, layers: list[int]) -> None:
        """One layer up or down among `layers` (wrapping); from the last when none was chosen."""
        if not layers:
            return
        now = self.layer if self.layer in layers else layers[-1]
        self.layer = layers[(layers.index(now) + delta) % len(layers)]

    def move_head(self, delta: int, heads: int) -> None:
        """The next or previous head; past the last (or before the first) the mean of the heads again."""
        order = [None, *range(heads)]
        self.head = order[(order.index(self.head if self.head in order else None) + delta) % len(order)]


def step_attention(state, step: int):
    """The run's step `step`'s attention (a list of LayerAttention), or None (no such step, or none captured)."""
    run = state.run
    if not 0 <= step < len(run):
        return None
    return getattr(run.step(step), "attention", None)


def same_sources(a, b, layer: int | None, head: int | None) -> bool | None:
    """Whether two steps' attentions list the same sources with the same weights at the chosen layer and head
    (None when either is missing)."""
    if not a or not b:
        return None
    la, lb = layer_of(a, layer), layer_of(b, layer)
    return la.layer == lb.layer and la.query == lb.query and source_rows(la, head) == source_rows(lb, head)


def pane_text(state, number: int, choice: CompareAttention, rows: int = ROWS) -> Text:
    """One run's attention at the chosen step: a heading line, then its strongest sources (rank, position,
    weight, token, "sink" on an attention sink) and what the rest add up to; or one line saying why there is none."""
    step = choice.step
    if step >= len(state.run):
        return Text(f"#{number} has no step {step + 1} (it ended after {len(state.run)})", style="dim")
    attention = step_attention(state, step)
    if not attention:
        return Text(f"no attention at step {step + 1} of #{number}: it ran with the attention view off "
                    "(A in the main view captures from the next step; r runs the prompt again)", style="dim")
    layer = layer_of(attention, choice.layer)
    heads = len(layer.heads) if layer.heads is not None else 0
    head = choice.head if choice.head is not None and heads else None
    who = "head mean" if head is None else f"head {head + 1}/{heads}"
    out = Text(f"step {step + 1} · layer {layer.layer}/{attention[-1].layer} · {who} · query @{layer.query}",
               style="bold")
    if choice.head is not None and head is None:
        out.append("\n(no per-head weights were captured: the mean)", style="dim")
    pieces, special, _ = pieces_of(state)
    listed = sources(layer, head, pieces, special, limit=rows)
    pos_w = max(3, len(str(layer.query)))
    for rank, src in enumerate(listed, 1):
        out.append(f"\n{rank:>2} {src.position:>{pos_w}} ", style="dim")
        out.append(f"{percent(src.weight):>6}", style="bold")
        out.append(f" {display_text(src.piece)}")
        if src.sink:
            out.append("  sink", style="dim")  # the reason (first or special token) is the position and the piece
    rest = rest_of(source_rows(layer, head)[:len(listed)])
    out.append(f"\nother positions: {percent(rest)}", style="dim")
    return out
