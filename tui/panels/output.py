"""The answer panel (step 6, detokenize): `OutputPanel` frames the answer's view (output_view.py's `OutputView`:
the word-wrapped, append-only token text, its heat map and the time-travel cursor) and, at each flush, feeds it the
tokens it has not seen yet, the pending-bytes marker, the cursor and the placeholder for the run's phase; its
subtitle says what the heat map colours by.
"""

from __future__ import annotations

from textual.containers import Vertical

from ..served import prob_label, server_of
from .base import FRAME_CSS
from .output_view import OutputView


class OutputPanel(Vertical):
    """Border + OutputView; the app feeds it new tokens at each flush."""

    DEFAULT_CSS = """
    OutputPanel {
        """ + FRAME_CSS + """
        padding: 0 0 0 1;
        height: 1fr;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = "6 detokenize · answer"
        self.view = OutputView(id="output-view")
        self.view.placeholder = "waiting for the first token…"
        self.heat = False
        self.heat_label = "raw p"  # what the heat map colours by (a served model: the probability its server gives)
        self.note = ""  # what a bigger terminal would add, when the readings strip is not there to say it

    def set_note(self, note: str) -> None:
        self.note = note
        self.set_heat(self.heat)

    def compose(self):
        yield self.view

    def set_heat(self, on: bool) -> None:
        self.heat = on
        self.view.heat = on
        self.border_subtitle = (f"heat: {self.heat_label} [$heat-low]■ low[/] → [$heat-high]■ high[/]" if on
                                else self.note)

    def sync(self, state) -> None:
        """Append the tokens this view has not seen yet; update the pending-bytes marker."""
        view = self.view
        server = server_of(state.facts)
        label = prob_label(server) if server is not None else "raw p"
        if label != self.heat_label:
            self.heat_label = label
            self.set_heat(self.heat)
        if len(state.tokens) < view.token_count - view.tail_count - view.head_count:
            view.clear()
        head = state.inherited_text
        if head and not view.token_count:
            view.append([(head, None)])
            view.head_count = 1
        new = state.tokens[view.token_count - view.tail_count - view.head_count:]
        if new and not view.tail_count:
            # With --ignore-eos the end token does not end the run: it is part of the answer the model goes on
            # from, so it is shown, marked, instead of vanishing (its text is empty: special tokens decode to "").
            marked = state.show_special_tokens
            view.append([(t.piece, t.heat_prob, True) if marked and t.special and not t.text
                         else (t.text, t.heat_prob) for t in new])
        flushed = getattr(state.done, "flushed", "") if state.done is not None else ""
        if flushed and not view.tail_count:
            # bytes still pending at the end, released as U+FFFD (as a one-shot decode would)
            view.append([(flushed, 0.0)])
            view.tail_count = 1
        hex_, _need = state.pending
        view.set_pending("▒" if hex_ else "")
        cursor = state.cursor
        held = cursor is not None and state.view_step is not None and bool(state.view_step.pending_hex)
        view.set_cursor(None if cursor is None else cursor + view.head_count, pending=held)  # marked, kept in view
        if state.phase == "error" and not state.tokens:
            view.placeholder = "no answer: the run failed"
        elif state.phase == "loading":
            view.placeholder = "loading the model…"
        elif state.phase == "load-failed":
            view.placeholder = "no model loaded: r retries, q quits"
        else:
            view.placeholder = "waiting for the first token…"
        if not state.tokens:
            view.refresh()
