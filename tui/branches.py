"""The runs of one prompt as a tree: the first run and every branch taken from it (plain Python, no Textual).

Each branch has its own `RunState` (tui/state.py), so switching between branches shows each exactly as it ran,
cursor and all. A branch's state starts with its parent's prompt, prefill and steps before the branch point (the
same tokens, from the same KV cache: those steps are the parent's, marked as inherited by `inherited`), then
folds the branch's own events: its prefill (the KV cache cut back, one token fed), the forced step, the rest.

One branch at a time is live (it receives the engine client's events); any branch can be shown. Starting a
branch stops the live one, which keeps what it wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokentui.core.runs.events import BranchEvent, Event, ModelFacts

from .state import RunState


@dataclass
class Branch:
    """One run of the tree: `number` 1 is the first run; a branch names its parent's number, the step it left at
    (0-based index; shown + 1) and the token it took there instead of the parent's."""

    number: int
    state: RunState
    parent: int | None = None
    at: int | None = None
    token_piece: str = ""
    parent_piece: str | None = None
    event: BranchEvent | None = None  # the engine's account of the branch (KV positions reused), once it came
    run_id: int | None = None  # the engine client's id for this run

    @property
    def inherited(self) -> int:
        """Steps at the start of this run that are its parent's (0 for the first run)."""
        return self.at or 0

    @property
    def label(self) -> str:
        if self.parent is None:
            return f"#{self.number} first run"
        return f"#{self.number} from #{self.parent} at step {self.at + 1}: {self.parent_piece or '?'} → {self.token_piece}"


class BranchTree:
    def __init__(self, state: RunState) -> None:
        self.branches: list[Branch] = [Branch(1, state)]
        self.shown = 0  # index into branches
        self.live: int | None = None  # the branch receiving events (None: no run in progress yet)

    # ---- reading -----------------------------------------------------------------------------------------
    @property
    def shown_branch(self) -> Branch:
        return self.branches[self.shown]

    @property
    def live_branch(self) -> Branch | None:
        return self.branches[self.live] if self.live is not None else None

    def __len__(self) -> int:
        return len(self.branches)

    def number(self, number: int) -> Branch:
        return self.branches[number - 1]

    # ---- changing ----------------------------------------------------------------------------------------
    def restart(self, state: RunState) -> Branch:
        """A new first run (a restart or a new prompt): the old tree is gone."""
        self.branches = [Branch(1, state)]
        self.shown = 0
        self.live = 0
        return self.branches[0]

    def add_branch(self, parent: Branch, at: int, token_piece: str, state: RunState) -> Branch:
        """A branch of `parent` at step `at` (0-based): its state gets the parent's prompt, prefill and steps
        before `at`; it becomes the live and the shown branch."""
        source = parent.state
        run = source.run
        state.own_from = at  # the steps before `at` are the parent's: not in the branch's own speed figures
        if run.facts is not None:
            state.apply(run.facts)
        if run.prompt is not None:
            state.apply(run.prompt)
        if run.prefill is not None:
            state.apply(run.prefill)
        for step in run[:at]:
            state.apply(step)
        parent_piece = run.step(at).piece if at < len(run) else None
        branch = Branch(len(self.branches) + 1, state, parent=parent.number, at=at, token_piece=token_piece,
                        parent_piece=parent_piece)
        self.branches.append(branch)
        self.shown = self.live = len(self.branches) - 1
        return branch

    def apply(self, event: Event) -> bool:
        """Fold an event of the live run into its branch; True when that branch is the one shown."""
        branch = self.live_branch
        if branch is None:
            return False
        if isinstance(event, BranchEvent):
            branch.event = event  # told by the tree, not a step of the run (its steps carry on the parent's)
        elif not (isinstance(event, ModelFacts) and branch.parent is not None):
            branch.state.apply(event)
        return self.live == self.shown

    def ended(self, run_id: int, end: Event) -> bool:
        """The end (`done` / `error`) of a run that a newer one replaced: its branch keeps it. True when shown."""
        for index, branch in enumerate(self.branches):
            if branch.run_id == run_id and branch.state.run.end is None:
                branch.state.apply(end)
                return index == self.shown
        return False

    def show(self, number: int) -> Branch:
        self.shown = number - 1
        return self.branches[self.shown]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token-id lists differ (the shorter's length when one is a prefix of the other;
    None when they are equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
