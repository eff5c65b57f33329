"""What the native step's captures share (attention_native.py, sublayers_native.py): a capture that reads a step on
the native step from what the step wrote into its `catch` (native_step.py's QueryCatch), and keeps the forward's own
capture (`forward`: attention.py's or sublayers.py's) active beside it for the passes that go through transformers'
modules (the prefill, a step sent through the forward)."""

from __future__ import annotations

from ..native.native_step import QueryCatch

__all__ = ["BesideForward"]


class BesideForward:
    """`with` enters and leaves the forward's capture; `caught` is either side's."""

    def __init__(self, catch: QueryCatch, forward) -> None:
        self.catch = catch
        self.forward = forward

    def __enter__(self):
        self.forward.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.forward.__exit__(*exc)

    @property
    def caught(self) -> bool:
        return self.catch.position is not None or self.forward.caught
