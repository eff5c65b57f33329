"""What each sublayer adds, on the native decode step (issue 39): the norms from the stream the step wrote, without
transformers' forward.

Why: sublayers.py reads the stream with forward hooks on the decoder blocks, which the native step (one C++ call,
core/model/native/decode_step.cpp) does not run. Asked for (a QueryCatch made with `residuals=True`), the step
copies, per layer, the stream entering it, attention's contribution (the output projection's result, before it is
added), the MLP's (the down projection's) and the stream leaving it: the four vectors SublayerCapture finds with its
hooks, from the step's own arithmetic. The lens's tokens after each sublayer need the lens, whose forward goes
through transformers' modules: a step with the lens on is read by sublayers.py's capture, kept active beside this.
"""

from __future__ import annotations

from typing import Callable

from ...runs.attention import SublayerRow
from ...runs.events import LensRow
from ..native.native_step import QueryCatch
from .native_capture import BesideForward
from .sublayers import SublayerCapture, sublayer_rows

__all__ = ["NativeSublayers"]


class NativeSublayers(BesideForward):
    """SublayerCapture's interface (`with`, `caught`, `take`) for a run on the native step: a native step's rows from
    the stream it wrote into `catch`, a forward's from SublayerCapture's hooks."""

    def __init__(self, model, catch: QueryCatch):
        super().__init__(catch, SublayerCapture(model))
        self.model = model

    def take(self, lens_rows: list[LensRow] | None = None,
             piece: Callable[[int], str] | None = None) -> list[SublayerRow] | None:
        """The rows of the step caught last, layer 1..L (SublayerCapture.take's); the catch is Inside's to clear."""
        if self.catch.position is None:
            return self.forward.take(lens_rows, piece)
        self.forward.take()  # (nothing went through the forward: nothing to keep)
        r = self.catch.residuals  # [L, 4, H]
        return sublayer_rows(self.model, r[:, 0], r[:, 1], r[:, 2], r[:, 3], lens_rows, piece)
