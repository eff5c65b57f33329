"""The step in view, seen under the sampler settings asked for (issue 38, 4): plain Python, no Textual; the controller
owns one (`controller.previews`) and the app calls `sync` as it paints.

While the step in view stands still — the run paused, the cursor held on a run that is not generating, the run
ended — the engine is asked (core/link/client.py `preview`, core/model/preview.py) for that step's distribution
under the settings asked for (the client's): the candidates' new probabilities, what each stage of the chain cut
and which stage cut each candidate, and the token those settings would take, without advancing the run. When the
settings asked for are the step's own, the answer is that step's report (its chain rows and "cut by" for the
selection panel); when they differ, it is a preview, and `branch` (enter) leaves the step with the new settings,
the previewed token taken: the branch machinery's (tui/branching.py `start_branch`, a paused run staying paused,
issue 40 item 12).

Where no preview can be had the panels say so in one line (`line`), only where it matters (the settings differ):
a replay has no model, a served model sends no logits, a run that is generating must pause first.
"""

from __future__ import annotations

import asyncio

from tokentui.core.errors import SettingsError, TokentuiError
from tokentui.core.runs.branch_point import BranchPoint, run_ids
from tokentui.core.runs.preview import BUSY, PreviewRequest, StepPreview
from tokentui.core.samplers import mirostat_mu

from .served import server_of

REPLAY_LINE = "the preview needs the model: a replay has only the recorded candidates of this step"
RETRIES, RETRY_S = 40, 0.05  # a paused run still in its last forward is asked again this often, this long
SERVED_LINE = "a served model returns no logits: this step cannot be recomputed under other settings"


def mu_before(state, step, settings) -> float | None:
    """Mirostat 2.0's state before `step` under `settings`, folded from the run's steps before it (core/samplers.py
    `mirostat_mu`); None where Mirostat is off (or from a fresh start)."""
    if not settings.mirostat:
        return None
    return mirostat_mu([(s.settings, s.chosen_prob) for s in state.run[:step.index - state.run.offset]])


class StepPreviews:
    """The preview of the step in view (see the module docstring): `shown` (a StepPreview, None: none), `line` (why
    there is none, where that matters), `differs` (the settings asked for are not the step's own)."""

    def __init__(self, controller) -> None:
        self.controller = controller
        self.shown: StepPreview | None = None
        self.line: str | None = None
        self._key = None  # (run number, run, step, running, paused, settings): what `shown` / the question is for
        self._asked = 0
        self.pending = False  # a question is in flight
        self.tasks: set[asyncio.Task] = set()

    # ---- what the panels read ------------------------------------------------------------------------------
    def for_step(self, step) -> StepPreview | None:
        """The preview of `step` (the step in view), None where there is none for it."""
        preview = self.shown
        if preview is None or step is None or preview.at != step.index:
            return None
        return preview

    @property
    def differs(self) -> bool:
        """A preview under settings that are not the step's own is shown (enter branches with them)."""
        step = self.controller.state.view_step
        preview = self.for_step(step)
        return preview is not None and preview.settings != step.settings

    # ---- keeping it up to date -------------------------------------------------------------------------------
    def _wanted(self):
        controller = self.controller
        state = controller.state
        step = state.view_step
        if step is None or not controller.loaded:
            return None
        # whether the run stands still is part of it: pausing asks for the step it paused at
        return (controller.tree.shown_branch.number, id(state.run), step.index, state.running,
                controller.client.paused, controller.sampler)

    def sync(self) -> None:
        """Called at each paint: when the step in view or the settings asked for changed, ask again (or say why
        not). Cheap when nothing changed."""
        key = self._wanted()
        if key == self._key:
            return
        self._key = key
        self.shown, self.line, self.pending = None, None, False
        if key is None:
            return
        controller = self.controller
        state = controller.state
        step = state.view_step
        settings = key[-1]
        differs = settings != step.settings
        if controller.replaying:  # its settings are the record's (a change is refused, in a notice that says why)
            return
        if server_of(state.facts) is not None:
            self.line = SERVED_LINE if differs else None
            return
        refusal = controller.client.refusal("preview")
        if refusal is not None:
            self.line = refusal if differs else None
            return
        if state.running and not controller.client.paused:
            if differs and not state.live:
                self.line = f"pause (space) to preview step {step.index + 1} under these settings"
            return
        try:
            prompt_ids, ids = run_ids(state.run)
            request = PreviewRequest(prompt_ids, ids[:step.index], settings,
                                     max(len(step.candidates), controller.client.options.top_candidates),
                                     mu_before(state, step, settings))
        except SettingsError as err:
            self.line = str(err) if differs else None
            return
        self._ask(key, request)

    def _ask(self, key, request: PreviewRequest) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a controller driven without one): nothing can be asked
            return
        self._asked += 1
        self.pending = True
        task = loop.create_task(self._answer(key, self._asked, request))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, key, number: int, request: PreviewRequest) -> None:
        preview, error = None, None
        for _try in range(RETRIES + 1):
            try:
                preview = await self.controller.client.preview(request)
                break
            except TokentuiError as err:
                error = err
                current = key == self._key and number == self._asked
                if str(err) != BUSY or not self.controller.client.paused or not current:
                    break
                await asyncio.sleep(RETRY_S)  # paused while a step was being computed: it reaches its gate soon
        if key != self._key or number != self._asked:
            return  # the view or the settings moved on: a newer question is (or none need be) in flight
        self.pending = False
        if preview is None:
            step = self.controller.state.view_step
            self.line = str(error) if error is not None and step is not None and request.settings != step.settings \
                else None
        else:
            self.shown = preview
        self.controller.view.repaint()

    def forget(self) -> None:
        """Ask again at the next paint (a new run, a branch)."""
        self._key = None
        self.shown, self.line, self.pending = None, None, False

    # ---- enter -------------------------------------------------------------------------------------------------
    def branch(self) -> bool:
        """Leave the step in view with the settings previewed on it: a branch whose step takes the previewed token
        (then the run goes on, or stays paused, as any branch from a paused run). False, said why, when no preview
        under changed settings is shown."""
        controller = self.controller
        state = controller.state
        step = state.view_step
        preview = self.for_step(step)
        if self.pending or (preview is not None and preview.settings != controller.sampler):
            controller.view.notify("The preview of this step is still being computed", timeout=3)
            return False
        if preview is None or preview.settings == step.settings:
            why = self.line or (REPLAY_LINE if controller.replaying else
                                "change a setting (t T p P k K m M, or S for every stage) on a paused step first")
            controller.view.notify(f"Nothing previewed to branch with: {why}", severity="warning", timeout=5)
            return False
        parent = controller.tree.shown_branch
        try:
            point = BranchPoint.of_run(parent.state.run, step.index, preview.pick,
                                       parent=controller.tree.parent_name(parent),
                                       mirostat_mu=mu_before(state, step, preview.settings))
        except SettingsError as err:
            controller.view.notify(str(err), severity="error")
            return False
        started = controller.start_branch(parent, step.index, preview.pick_piece, point)
        if started:
            self.forget()
        return started
