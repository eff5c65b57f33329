"""Branching and the logit lens, as the dashboard's keys: `b` branch at the step in view, `B` the runs of this
prompt (switch, compare two), `l` the logit lens. A mixin of `TokentuiApp` (tui/app.py), which owns the tree of
runs (tui/branches.py) and the engine client these use."""

from __future__ import annotations

from dataclasses import replace

from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.errors import SettingsError

from .panels import OutputPanel
from .served import server_of
from .screens.branch_list import BranchList
from .screens.branch_picker import BranchPicker
from .screens.compare import CompareScreen


class BranchingMixin:
    lens_on = False

    # ---- b: branch at the step in view -------------------------------------------------------------------
    def _step_to_branch(self):
        """The step a branch would leave from: the cursor's step; live, the newest step once paused or ended.
        None (said why) when there is none."""
        state = self.state
        if not self.client.loaded:
            self.notify("The model is not loaded yet", severity="warning", timeout=4, markup=False)
            return None
        if not self.client.can_branch:
            self.notify("This engine cannot branch (a replay plays what was recorded)", severity="warning",
                        timeout=5, markup=False)
            return None
        if state.cursor is None and state.running and not self.client.paused:
            self.notify("Pause (space) to branch at the newest step, or go back to a step first ([ / ])",
                        severity="warning", timeout=5, markup=False)
            return None
        step = state.view_step
        if step is None:
            self.notify("No step yet to branch from", severity="warning", timeout=4, markup=False)
        return step

    def action_branch(self) -> None:
        step = self._step_to_branch()
        if step is None:
            return
        parent = self.branch_tree.shown_branch
        self._pause_for_dialog()  # the picker covers the panels: the run waits (resumed if nothing is picked)

        def chosen(token: int | None) -> None:
            if token is None:
                self._resume_after_dialog()
                return
            self._dialog_paused = False  # the branch replaces the paused run, which ends "stopped"
            self._branch_at(parent, step, token)

        label = f"#{parent.number}" if len(self.branch_tree) > 1 else ""
        self.push_screen(BranchPicker(step, label), chosen)

    def _branch_at(self, parent, step, token: int) -> None:
        """Start a branch of `parent` at `step` with `token`: the engine cuts its KV cache back and goes on."""
        try:
            point = BranchPoint.of_run(parent.state.run, step.index, token, parent=f"#{parent.number}")
        except SettingsError as err:
            self.notify(str(err), severity="error", markup=False)
            return
        piece = next((c.piece for c in step.candidates if c.id == token), str(token))
        self.client.halt()
        branch = self.branch_tree.add_branch(parent, step.index, piece, self.state.next_run())
        self.query_one(OutputPanel).view.clear()
        self._repaint_now()
        try:
            branch.run_id = self.client.branch(point)
        except SettingsError as err:  # refused before anything started
            self.notify(str(err), severity="error", markup=False)

    # ---- B: the runs of this prompt ----------------------------------------------------------------------
    def action_branches(self) -> None:
        if len(self.branch_tree) < 2:
            self.notify("One run so far — b branches at the step in view", timeout=4, markup=False)
            return

        def chosen(result) -> None:
            if result is None:
                return
            if result[0] == "show":
                self.show_branch(result[1])
            elif result[0] == "compare":
                self.push_screen(CompareScreen(self.branch_tree.number(result[1]), self.branch_tree.number(result[2])))

        self.push_screen(BranchList(self.branch_tree), chosen)

    def show_branch(self, number: int) -> None:
        """Show run `number` of the tree (the live one keeps running underneath)."""
        self.branch_tree.show(number)
        self.query_one(OutputPanel).view.clear()
        self._rebuild_all()

    # ---- l: the logit lens -------------------------------------------------------------------------------
    def action_toggle_lens(self) -> None:
        """Ask the engine for the lens from its next step (or stop asking), and show or hide its panel."""
        self.lens_on = not self.lens_on
        served = server_of(self.state.facts) is not None  # no hidden states come out of a server: nothing to ask
        try:
            if not served:
                self.client.set_options(replace(self.client.options, logit_lens=self.lens_on))
        except SettingsError as err:
            self.notify(str(err), severity="error", markup=False)
        self._layout_plan = None  # the lens panel takes a panel's place: lay out again
        self._apply_layout()
        self._rebuild_all()
        if self.lens_on and not served:
            self.notify("Logit lens on from the next step (it costs a full LM head per layer per step)",
                        timeout=5, markup=False)
