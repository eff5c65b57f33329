"""Inside one block (issue 39), the dashboard's side, as plain Python (no Textual): what the attention view (`A`)
shows and which layer and head it shows, and the candidates' raw column as probability or logit (`L`).

The engine captures attention only while the view is on (RunOptions.attention, core/runs/attention.py): each step
then carries, per layer, the source positions its new token's query weighs most (the mean over the query heads,
and per head once a head has been chosen). What a step carries is all the view draws, so a past step (time travel),
another run of the tree and a replayed record redraw from their stored events.

Positions count from the prompt's first token: position p is the prompt's piece p, or the answer's step
p - prompt length. A step's query sits at the position before its own token (LayerAttention.query).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tokentui.core.errors import SettingsError
from tokentui.core.runs.attention import LayerAttention, sink_positions

__all__ = ["HEAT_TOP", "Inside", "Source", "layer_of", "sources", "source_rows"]

# Source positions asked for per layer while the view is on: enough to shade the heat strip's strongest tokens
# (the rest, each weighing no more than the last listed, are drawn unshaded and summed as "other positions"),
# few enough that a long run's steps stay small (24 pairs × layers per step; 8 is what `--attention` records).
HEAT_TOP = 24
NOTE = "attention view"  # the engine's notice when it cannot capture attention starts so


@dataclass(frozen=True)
class Source:
    """One source position of the step's query: its weight, its token, and whether it is an attention sink."""

    position: int
    weight: float
    piece: str
    special: bool
    sink: str  # "" or why it is a sink: "first token", "special token"


class Inside:
    """The view's choices, kept by the controller (tui/controller.py): the attention view on or off, the layer
    (1-based; None: the last) and the query head (0-based; None: the mean of the heads) it shows, the all-layers grid,
    and the candidates' raw column as logits. Turning the view on asks the engine for attention from its next step;
    choosing a head asks for the per-head weights too."""

    def __init__(self, controller) -> None:
        self.controller = controller
        self.attention_on = False
        self.layer: int | None = None
        self.head: int | None = None
        self.grid = False
        self.raw_logits = False

    # ---- keys ------------------------------------------------------------------------------------------------
    def toggle_attention(self) -> bool:
        """The view on or off (the engine asked to capture, or to stop, from its next step); returns it."""
        self.attention_on = not self.attention_on
        self._ask()
        return self.attention_on

    def toggle_logits(self) -> None:
        self.raw_logits = not self.raw_logits
        self.controller.view.repaint()

    def toggle_grid(self) -> None:
        self.grid = not self.grid
        self.controller.view.repaint()

    def move_layer(self, delta: int) -> None:
        """One layer up or down (wrapping), among the layers the step in view carries."""
        layers = [la.layer for la in (self._step_attention() or [])]
        if not layers:
            return
        now = layer_of(self._step_attention(), self.layer).layer
        at = layers.index(now) if now in layers else len(layers) - 1
        self.layer = layers[(at + delta) % len(layers)]
        self.controller.view.repaint()

    def move_head(self, delta: int) -> None:
        """The next or previous query head; past the last (or before the first) the mean of the heads again. The
        engine is asked for per-head weights from its next step, where a step does not carry them yet."""
        heads = self._heads()
        if heads <= 0:
            self.head = None
        else:
            order = [None, *range(heads)]
            self.head = order[(order.index(self.head if self.head in order else None) + delta) % len(order)]
        self._ask()
        self.controller.view.repaint()

    # ---- what the engine is asked for ------------------------------------------------------------------------
    def _ask(self) -> None:
        controller = self.controller
        if controller.replaying or getattr(controller.state.facts, "server", None) is not None:
            return  # a record plays back what it holds; a server shows no attention
        options = controller.client.options
        wanted = replace(options, attention=self.attention_on, attention_top=max(options.attention_top, HEAT_TOP),
                         attention_heads=self.attention_on and (self.head is not None or options.attention_heads))
        if wanted == options:
            return
        try:
            controller.client.set_options(wanted)
        except SettingsError as err:
            controller.view.notify(str(err), severity="error")

    def _step_attention(self) -> list[LayerAttention] | None:
        step = self.controller.state.view_step
        return getattr(step, "attention", None) if step is not None else None

    def _heads(self) -> int:
        """Query heads to step through: the step in view's per-head lists, else the model's heads."""
        attention = self._step_attention()
        if attention and attention[-1].heads is not None:
            return len(attention[-1].heads)
        facts = self.controller.state.facts
        return int(getattr(facts, "attention_heads", 0) or 0) if facts is not None else 0


def layer_of(attention: list[LayerAttention], layer: int | None) -> LayerAttention:
    """The layer shown: `layer` where the step carries it, else the last one it carries."""
    return next((la for la in attention if la.layer == layer), attention[-1])


def pieces_of(state) -> tuple[list[str], list[bool], int]:
    """Every position's piece and special flag, the prompt's then the answer's (as the steps hold them), and the
    prompt's length. A replayed branch record's steps start at its branch point: the positions before it are
    named by their ids (`#id`), from its branch event."""
    run = state.run
    prompt = run.prompt
    pieces = [p.piece for p in prompt.pieces] if prompt is not None else []
    special = [p.special for p in prompt.pieces] if prompt is not None else []
    count = len(pieces)
    offset = run.offset
    if offset and run.branch is not None:
        pieces += [f"#{i}" for i in run.branch.tokens[:offset]]
        special += [False] * min(offset, len(run.branch.tokens))
    pieces += run.values("piece")
    special += run.values("special")
    return pieces, special, count


def sources(layer: LayerAttention, head: int | None, pieces: list[str], special: list[bool],
            sinks: frozenset[int] | None = None, limit: int | None = None) -> list[Source]:
    """The layer's listed source positions for `head` (None: the head mean), highest weight first (the first
    `limit`), with their tokens and sink marks (the first token, special tokens: core/runs/attention.py
    `sink_positions`; `sinks`: those already found)."""
    pairs = layer.top if head is None or layer.heads is None else layer.heads[min(head, len(layer.heads) - 1)]
    sinks = sink_positions(special) if sinks is None else sinks
    out = []
    for position, weight in pairs[:limit]:
        piece = pieces[position] if position < len(pieces) else "?"
        is_special = position < len(special) and special[position]
        why = "first token" if position == 0 else "special token" if position in sinks else ""
        out.append(Source(position, weight, piece, is_special, why))
    return out


def source_rows(layer: LayerAttention, head: int | None) -> tuple[tuple[int, float], ...]:
    """The (position, weight) pairs the view shows for `head` (None, or no per-head weights: the head mean)."""
    if head is None or layer.heads is None:
        return layer.top
    return layer.heads[min(head, len(layer.heads) - 1)]


def rest_of(pairs) -> float:
    """The weight on the positions a list leaves out."""
    return max(0.0, 1.0 - sum(w for _, w in pairs))
