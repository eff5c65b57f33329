"""Branching, as the dashboard's controller's methods (tui/controller.py's DashboardController inherits them; plain
Python, no Textual): the step a branch leaves from, starting a branch of a run of the tree (a token picked, or a
forced phrase or an adopted sample from tui/explore.py), showing another run of the tree, and what a replay, which
cannot branch, says to run instead.
"""

from __future__ import annotations

import shlex

from tokentui.core.errors import SettingsError
from tokentui.core.link.client import EngineClient
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.runs.events import StepEvent

from .branches import Branch, BranchTree
from .config import DashboardConfig
from .format import short_path
from .state import RunState
from .view import View


class Branching:
    """The controller's branching (see the module docstring); what it uses of the controller is named here."""

    config: DashboardConfig
    view: View
    client: EngineClient
    tree: BranchTree
    dialog_paused: bool
    replaying: bool
    state: RunState  # the controller's property: the run shown

    def step_to_branch(self, verb: str = "branch") -> StepEvent | None:
        """The step a branch (or a fan-out: `verb` "fan out") would leave from: the cursor's step; live, the newest
        step once paused or ended. None (said why, in words for a user) when there is none."""
        state = self.state
        if self.replaying:
            where = f" --at {state.view_step.index + 1}" if state.view_step is not None else " --at STEP"
            self.view.notify(f"A replay cannot branch: run `tokentui branch {self.replayed_record}{where} --token ID`",
                             severity="warning", timeout=6)
            return None
        refusal = self.client.branch_refusal
        if refusal is not None:
            self.view.notify(refusal[0].upper() + refusal[1:], severity="warning", timeout=5)
            return None
        if state.cursor is None and state.running and not self.client.paused:
            self.view.notify(f"Pause (space) to {verb} at the newest step, or go back to a step first ([ / ])",
                             severity="warning", timeout=5)
            return None
        step = state.view_step
        if step is None:
            self.view.notify(f"No step yet to {verb} from", severity="warning", timeout=4)
        return step

    def branch_at(self, parent: Branch, step: StepEvent, token: int) -> bool:
        """Start a branch of `parent` at `step` with `token`: the engine cuts its KV cache back and goes on. False
        (said why) when it cannot start."""
        try:
            point = BranchPoint.of_run(parent.state.run, step.index, token, parent=self.tree.parent_name(parent))
        except SettingsError as err:
            self.view.notify(str(err), severity="error")
            return False
        piece = next((c.piece for c in step.candidates if c.id == token), str(token))
        return self.start_branch(parent, step.index, piece, point)

    def start_branch(self, parent: Branch, at: int, piece: str, point: BranchPoint) -> bool:
        """Start the branch `point` of `parent` at step `at` (`piece`: what its node is named by in the tree; a
        forced phrase or an adopted sample too, tui/explore.py): the run in progress stops, the branch becomes the
        live run of the tree and is shown. False (said why) when the engine refuses it. A run the user paused
        stays paused: the branch's forced steps (the token taken, a phrase's tokens) come, then it waits for n
        (issue 40: picking tokens by hand, step by step, as token-explorer does)."""
        keep_paused = self.client.paused and not self.dialog_paused  # a dialog's own pause is not the user's
        self.dialog_paused = False  # the branch replaces the paused run, which ends "stopped"
        self.client.halt()
        branch = self.tree.add_branch(parent, at, piece, self.state.next_run(), token=point.token,
                                      phrase=point.phrase or None, phrase_text=point.phrase_text, sample=point.sample)
        self.view.clear_answer()
        self.view.repaint()
        if keep_paused:  # as `space` while loading does for a run: paused, the forced steps let through
            self.client.pause()
            for _token in point.forced_ids:  # one token, or a phrase's (or a sample's) every token
                self.client.step_once()
        try:
            # the parent's prompt goes first into the branch's record: it replays on its own
            branch.run_id = self.client.branch(point, prompt=parent.state.prompt)
        except SettingsError as err:  # refused before anything started
            self.view.notify(str(err), severity="error")
            return False
        return True

    def show_run(self, number: int) -> None:
        """Show run `number` of the tree (the live one keeps running underneath)."""
        self.tree.show(number)
        self.view.clear_answer()
        self.view.repaint()

    @property
    def replayed_record(self) -> str:
        """The record of the run a replay shows, as it is typed in a command (`~/…` where that needs no quoting),
        for the notices that say what to run instead (issue 40: they said `FILE`); "FILE" when not known."""
        tree = self.config.replay
        if tree is None:
            return "FILE"
        run = tree.runs.get(self.tree.shown_branch.number) or tree.runs.get(1)
        path = getattr(run, "record_path", None)
        if path is None:
            return "FILE"
        short = short_path(path, width=100_000)
        return short if shlex.quote(short.removeprefix("~")) == short.removeprefix("~") else shlex.quote(str(path))
