"""The runs of one prompt as the dashboard shows them: the first run and every branch taken from it, each with its
own `RunState` (tui/state.py), and the tree file that records them (core/runs/tree.py). Plain Python, no Textual.

Each branch has its own state, so switching between branches shows each exactly as it ran, cursor and all. A
branch's state starts with its parent's prompt, prefill and steps before the branch point (the same tokens, from
the same KV cache: those steps are the parent's, marked as inherited by `inherited`), then folds the branch's own
events: its prefill (the KV cache cut back, one token fed), the forced step, the rest. A branch whose parent is not
in the tree (a branch's record played back on its own) has only its own steps: its run starts at its branch point
(core/runs/run.py's `offset`) and its answer with the text its record carries for the steps before.

One branch at a time is live (it receives the engine client's events); any branch can be shown. Starting a branch
stops the live one, which keeps what it wrote; the tree file says which branch took over from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokentui.core.runs.events import BranchEvent, DoneEvent, Event
from tokentui.core.runs.facts import ModelFacts
from tokentui.core.runs.tree import RunTree, TreeEnd, TreeNode, TreeWriter, relative_record
from tokentui.core.steps.display import display_text

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
    token: int | None = None
    superseded_by: int | None = None  # the branch that stopped this run when it began
    # a forced phrase or an adopted fan-out sample (core/runs/branch_point.py): every id forced from `at` on
    phrase: tuple[int, ...] | None = None
    phrase_text: str | None = None
    sample: int | None = None
    # a follow-up turn of the run `parent` (tui/followup.py): its turn number and user message (no step, no token)
    turn: int | None = None
    user: str | None = None

    @property
    def inherited(self) -> int:
        """Steps at the start of this run's state that are its parent's (0 for the first run, and for a branch
        whose parent is not in the tree: its steps start at its branch point)."""
        return self.at or 0 if self.parent is not None else 0

    @property
    def own_steps(self) -> int:
        """The steps this run took itself (a branch: from its branch point on, the forced one included)."""
        return len(self.state.run) - self.inherited

    @property
    def total_steps(self) -> int:
        """Its answer's tokens from the prompt on (a branch: the parent's before the branch point too)."""
        return self.state.run.offset + len(self.state.run)

    @property
    def label(self) -> str:
        if self.parent is None:
            return f"#{self.number} first run"
        if self.turn is not None:
            said = " ".join((self.user or "").split())
            said = said if len(said) <= 40 else said[:39] + "…"
            return f"#{self.number} turn {self.turn} after #{self.parent}: {said}"
        was = display_text(self.parent_piece) if self.parent_piece else "?"
        # an adopted sample is named in words ("sample #1"), not a token: no ␣ for its space (issue 40)
        taken = self.token_piece if self.sample is not None else display_text(self.token_piece)
        return f"#{self.number} from #{self.parent} at step {self.at + 1}: {was} → {taken}"

    @property
    def ending(self) -> str:
        """How the run ended (or that it goes on), in words: a run a branch stopped says so."""
        state = self.state
        if state.running:
            return "live"
        done = state.done
        if done is None:
            return state.phase
        if done.reason == "stopped" and self.superseded_by is not None:
            return f"stopped at step {self.total_steps} by #{self.superseded_by}"
        if done.reason == "stopped":
            return f"stopped at step {self.total_steps}"
        return {"eos": "done: end token", "length": "done: length limit", "context": "done: context full",
                "error": "failed"}.get(done.reason, done.reason)


class BranchTree:
    def __init__(self, state: RunState, recorder_dir: Path | None = None) -> None:
        self.branches: list[Branch] = [Branch(1, state)]
        self.shown = 0  # index into branches
        self.live: int | None = None  # the branch receiving events (None: no run in progress yet)
        self.tree = RunTree()
        self._writer: TreeWriter | None = None
        self._recorded: dict[Path, int] = {}  # tree file -> runs recorded in it

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

    @property
    def path(self) -> Path | None:
        """The tree file being written (None: nothing recorded yet, or not recording)."""
        return self._writer.path if self._writer is not None else None

    def recorded_in(self, path: Path) -> int:
        return self._recorded.get(path, 0)

    def parent_name(self, branch: Branch) -> str:
        """How a branch names its parent: the parent's record file (a branch's record then points at it), else
        its number in the tree."""
        record = branch.state.record_path
        return record.name if record is not None else f"#{branch.number}"

    # ---- changing ----------------------------------------------------------------------------------------
    def restart(self, state: RunState, prompt: str = "", system: str | None = None) -> Branch:
        """A new first run (a restart or a new prompt): the old tree is gone (its file is whole)."""
        self.close()
        self.branches = [Branch(1, state)]
        self.shown = 0
        self.live = 0
        self.tree = RunTree(prompt=prompt, system=system, model=state.facts.name if state.facts else "")
        return self.branches[0]

    def add_branch(self, parent: Branch, at: int, token_piece: str, state: RunState, token: int | None = None,
                   **phrase) -> Branch:
        """A branch of `parent` at step `at` (0-based): its state gets the parent's prompt, prefill and steps
        before `at`; it becomes the live and the shown branch. `phrase`: Branch's phrase fields."""
        source = parent.state
        run = source.run
        state.own_from = at  # the steps before `at` are the parent's: not in the branch's own speed figures
        if run.facts is not None:
            state.apply(run.facts)
        if run.turn is not None:  # a branch of a follow-up: the same conversation (what a follow-up to it holds)
            state.apply(run.turn)
        if run.prompt is not None:
            state.apply(run.prompt)
        if run.prefill is not None:
            state.apply(run.prefill)
        for step in run[:at]:
            state.apply(step)
        parent_piece = run.step(at).piece if at < len(run) else None
        branch = Branch(len(self.branches) + 1, state, parent=parent.number, at=at, token_piece=token_piece,
                        parent_piece=parent_piece, token=token, **phrase)
        self.branches.append(branch)
        if self.live is not None and self.branches[self.live].state.running:
            self.branches[self.live].superseded_by = branch.number
        self.shown = self.live = len(self.branches) - 1
        return branch

    def add_turn(self, parent: Branch, turn: int, user: str, state: RunState) -> Branch:
        """A follow-up turn of `parent` (its run is its own: the whole conversation's prompt, its answer); it becomes
        the live and the shown run."""
        branch = Branch(len(self.branches) + 1, state, parent=parent.number, turn=turn, user=user)
        self.branches.append(branch)
        if self.live is not None and self.branches[self.live].state.running:
            self.branches[self.live].superseded_by = branch.number
        self.shown = self.live = len(self.branches) - 1
        return branch

    def opened(self, record: Path | None) -> None:
        """The live run's record opened (None: not recorded): the tree file names it (and starts with the first
        one)."""
        branch = self.live_branch
        if branch is None:
            return
        branch.state.record_path = record
        if record is None:
            return
        if self._writer is None:
            try:
                self._writer = TreeWriter.beside(record, self.tree)
            except OSError:
                return  # the records are written; only the tree that ties them together is missing
        if branch.turn is not None:
            node = TreeNode(branch.number, branch.parent, record=relative_record(self._writer.path, record),
                            turn=branch.turn, user=branch.user)
        else:
            node = TreeNode(branch.number, branch.parent, branch.at, branch.token if branch.parent else None,
                            branch.token_piece if branch.parent else "",
                            self._parent_token(branch), branch.parent_piece if branch.parent else None,
                            relative_record(self._writer.path, record), phrase=branch.phrase,
                            phrase_text=branch.phrase_text, sample=branch.sample)
        if node.number == len(self.tree) + 1:
            self.tree.add(node)
            self._write(lambda w: w.add(node))
            self._recorded[self._writer.path] = self._recorded.get(self._writer.path, 0) + 1

    def _parent_token(self, branch: Branch) -> int | None:
        if branch.parent is None:
            return None
        run = self.number(branch.parent).state.run
        return run.values("id", branch.at, branch.at + 1)[0] if branch.at < len(run) else None

    def apply(self, event: Event) -> bool:
        """Fold an event of the live run into its branch; True when that branch is the one shown."""
        branch = self.live_branch
        if branch is None:
            return False
        if isinstance(event, BranchEvent) and branch.parent is not None:
            branch.event = event  # told by the tree, not a step of the run (its steps carry on the parent's)
        elif isinstance(event, ModelFacts) and branch.parent is not None:
            pass  # the parent's facts came with its state
        else:
            if isinstance(event, BranchEvent):
                branch.event = event  # a branch played back alone: its run starts at its branch point
            branch.state.apply(event)
        if isinstance(event, DoneEvent):
            self._ended(branch, event)
        return self.live == self.shown

    def ended(self, run_id: int, end: DoneEvent) -> bool:
        """The end (`done`) of a run that a newer one replaced: its branch keeps it. True when shown."""
        for index, branch in enumerate(self.branches):
            if branch.run_id == run_id and branch.state.done is None:
                branch.state.apply(end)
                self._ended(branch, end)
                return index == self.shown
        return False

    def _ended(self, branch: Branch, done: DoneEvent) -> None:
        if branch.number > len(self.tree):
            return  # not in the tree file (not recorded)
        end = TreeEnd(branch.number, done.reason, branch.own_steps,
                      branch.superseded_by if done.reason == "stopped" else None)
        self.tree.end(end)
        self._write(lambda w: w.end(end))

    def _write(self, write) -> None:
        if self._writer is None:
            return
        try:
            write(self._writer)
        except OSError:
            self._writer.close()
            self._writer = None

    def show(self, number: int) -> Branch:
        self.shown = number - 1
        return self.branches[self.shown]

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token-id lists differ (the shorter's length when one is a prefix of the other;
    None when they are equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
