"""Inside the blocks for a run (issue 39): which of the two captures a forward runs under, as the options say now.

The engine asks `Inside.for_options` before each forward (prefill's, then every decode step's), as it asks for the
logit lens, so a dashboard toggle (`set_options`) shows from the next step; it enters the returned capture around
the forward and, building the step's event, calls `take` for the StepEvent's `attention` and `sublayers`. A forward
under a capture that `needs_forward` goes through transformers' modules (the engine passes the decode step a
`states_out` list, which sends the native, lean and ggml steps through the forward for that step: core/model/decode/
steps.py), so the fast path is untouched while both are off. On the native step (core/model/native/native_step.py)
neither needs the forward: the step writes its queries (and its residual stream, for the sublayers), the weights
come from them and the cache's keys (core/model/observe/attention_native.py, sublayers_native.py); a step the logit
lens sends through the forward is read by the forward's captures, kept active beside them. A model or plan without
them gets None and one Notice line, once a run.
"""

from __future__ import annotations

from typing import Callable

from ...runs.attention import LayerAttention, SublayerRow
from ...runs.events import LensRow
from ...settings import RunOptions
from ..native.native_step import NativeStep, QueryCatch, queries_into
from .attention import AttentionCapture, attention_unavailable
from .attention_native import NativeAttention
from .sublayers import SublayerCapture, sublayers_unavailable
from .sublayers_native import NativeSublayers

__all__ = ["Inside"]

COMPILED = "not available with --compile (the compiled decode step runs no module a hook can read)"


def forward_states(lens_states: list | None, inside: "Inside | None") -> list | None:
    """The `states_out` a prefill or decode forward is given (core/model/decode/steps.py): the logit lens's list;
    else, under a capture that `needs_forward`, a list nobody reads, which sends the native, lean and ggml steps
    (and the ggml step's prefill) through transformers' forward, whose modules the capture watches; else None."""
    if lens_states is not None or inside is None or not inside.needs_forward:
        return lens_states
    return []


class Inside:
    """One forward's captures (attention, sublayers; either may be None) and the options they were made for."""

    def __init__(self, model, options: RunOptions, attention: bool, sublayers: bool, native: NativeStep | None = None):
        self.key = _key(options)
        # on the native step: the views from what the step writes into `catch` (its queries, its stream)
        self.native = native is not None and (attention or sublayers)
        self.catch = QueryCatch(native, residuals=sublayers) if self.native else None
        top, heads = options.attention_top, options.attention_heads
        self.attention = None if not attention else NativeAttention(model, self.catch, top, heads) if self.native \
            else AttentionCapture(model, top, heads)
        self.sublayers = None if not sublayers else NativeSublayers(model, self.catch) if self.native \
            else SublayerCapture(model)
        self._queries = None  # queries_into(catch) while entered

    @property
    def needs_forward(self) -> bool:
        """Whether a decode step under this capture must go through transformers' forward (False: the plan's own
        native step writes what the views need)."""
        return not self.native

    @classmethod
    def for_options(cls, model_of, options: RunOptions, compiled: bool, current: "Inside | None",
                    said: bool, step=None) -> tuple["Inside | None", str | None]:
        """(the capture the next forward runs under, None for none; a Notice's text when something asked for is
        not available and was not `said` yet in this run). `current` is kept while the options are the same.
        `step`: the plan's decode step (core/model/decode/steps.py): on the native step the views read what the step
        writes, without the forward; None: every capture goes through the forward. `model_of()`: transformers'
        model, asked for only where a view is on (a GGUF's later start builds it then: core/model/load/
        gguf_direct.py)."""
        notes = []
        attention = options.attention
        sublayers = options.sublayers
        if not (attention or sublayers):
            return None, None
        model = model_of()
        if attention and (why := COMPILED if compiled else attention_unavailable(model)):
            notes.append(f"attention view: {why}")
            attention = False
        if sublayers and (why := COMPILED if compiled else sublayers_unavailable(model)):
            notes.append(f"sublayer view: {why}")
            sublayers = False
        note = None if said or not notes else "; ".join(notes) + ": running without it"
        if not (attention or sublayers):
            return None, note
        kernel = getattr(step, "kernel", None)
        native = kernel if isinstance(kernel, NativeStep) else None
        if current is not None and current.key == _key(options) and (current.attention is not None) == attention \
                and (current.sublayers is not None) == sublayers \
                and current.native == (native is not None):
            return current, note
        return cls(model, options, attention, sublayers, native), note

    def __enter__(self) -> "Inside":
        for capture in (self.attention, self.sublayers):
            if capture is not None:
                capture.__enter__()
        if self.catch is not None:
            self.catch.clear()
            self._queries = queries_into(self.catch)
            self._queries.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._queries is not None:
            queries, self._queries = self._queries, None
            queries.__exit__(*exc)
        for capture in (self.sublayers, self.attention):
            if capture is not None:
                capture.__exit__(*exc)

    @property
    def caught(self) -> bool:
        return any(c is not None and c.caught for c in (self.attention, self.sublayers))

    def take(self, query: int, lens_rows: list[LensRow] | None, piece: Callable[[int], str]
             ) -> tuple[list[LayerAttention] | None, list[SublayerRow] | None]:
        """The StepEvent's `attention` and `sublayers` for the forward caught last, whose query sat at position
        `query`; None for either not captured."""
        attention = self.attention.take(query) if self.attention is not None and self.attention.caught else None
        sublayers = self.sublayers.take(lens_rows, piece) if self.sublayers is not None and self.sublayers.caught \
            else None
        if self.catch is not None:
            self.catch.clear()  # read by both views: cleared once both have taken it
        return attention or None, sublayers


def _key(options: RunOptions) -> tuple:
    return options.attention_top, options.attention_heads
