"""What else could it have said? The dashboard's side of forcing a phrase, scoring a text and fanning out (issue 26),
as plain Python (no Textual), owned by the controller (tui/controller.py) and tested with its recording View. It
reaches the controller through `ExploreHost`, what it uses of it (starting a branch: `start_branch`), so it does not
import the controller, which imports it.

- A forced phrase is a branch of the run shown at the step in view whose point carries the phrase's ids
  (`force_phrase`): the tree gets it as any branch (its node names the phrase), the engine forces each id.
- A fan-out (`fanout`) is a run of its own (its own record) that the tree does not hold as a branch: its events go
  into a `FanoutState` here, not into a run's state, and the View shows them (`fanout_changed`). Adopting a sample
  (`adopt`) is a branch of the run it fanned out from, forcing the sample's tokens: that branch is in the tree.
- A scored text is the first run of its tree (DashboardConfig.score): its steps are a run's; here its summary
  reaches the View (`scored`) and the answer is heat-coloured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tokentui.core.errors import TokentuiError
from tokentui.core.link.client import EngineClient, RunEnded, RunNote, RunOpened, RunUpdate
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.runs.events import DoneEvent, ErrorEvent, Event, Notice, StepEvent
from tokentui.core.runs.explore_events import FanoutEvent, SampleEvent, ScoreSummary
from tokentui.core.runs.requests import FanoutRequest
from tokentui.core.settings import SamplerSettings

from .branches import Branch, BranchTree
from .state import RunState
from .view import View

FANOUT_SAMPLES = 8  # the dashboard's N and M (the command line's -n / --tokens defaults too)
FANOUT_TOKENS = 32


@dataclass
class FanoutState:
    """One fan-out as it comes in: from run `parent` at `step` (the step in view), its samples in the order drawn."""

    parent: Branch
    step: StepEvent
    request: FanoutRequest
    run_id: int = 0
    record_path: object = None
    event: FanoutEvent | None = None
    samples: list[SampleEvent] = field(default_factory=list)
    done: DoneEvent | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.done is None

    def run_after(self) -> tuple[int, ...]:
        """The parent run's own tokens from the fan-out's step on (what each sample is compared with)."""
        run = self.parent.state.run
        start = self.request.at - run.offset
        return tuple(run.values("id", max(start, 0), len(run))) if start < len(run) else ()

    def apply(self, event: Event) -> None:
        if isinstance(event, FanoutEvent):
            self.event = event
        elif isinstance(event, SampleEvent):
            self.samples.append(event)
        elif isinstance(event, ErrorEvent):
            self.error = event.message
        elif isinstance(event, Notice):
            self.notes.append(event.message)
        elif isinstance(event, DoneEvent):
            self.done = event


class ExploreHost(Protocol):
    """What Explore uses of the controller (tui/controller.py's DashboardController)."""

    view: View
    client: EngineClient
    tree: BranchTree
    heat: bool
    dialog_paused: bool

    @property
    def replaying(self) -> bool: ...

    @property
    def state(self) -> RunState: ...

    @property
    def sampler(self) -> SamplerSettings: ...

    def step_to_branch(self, verb: str = "branch") -> StepEvent | None: ...

    def start_branch(self, parent: Branch, at: int, piece: str, point: BranchPoint) -> bool: ...


class Explore:
    """The controller's phrase, fan-out and score actions (see the module docstring)."""

    def __init__(self, controller: ExploreHost) -> None:
        self.controller = controller
        self.fanout_state: FanoutState | None = None  # the latest fan-out (shown by the View while it is open)
        self._fanout_id: int | None = None  # its run id (its replies are routed here, not into the tree)
        self._opening = False  # the client is opening the fan-out's run: the RunOpened that comes is its

    # ---- replies -----------------------------------------------------------------------------------------
    def takes(self, reply) -> bool:
        """A reply of the fan-out's run: folded here (True); anything else is the controller's (False)."""
        if self._opening and isinstance(reply, RunOpened):  # sent from inside client.fanout, before its id returns
            self._fanout_id = reply.run_id
        if self._fanout_id is None or getattr(reply, "run_id", None) != self._fanout_id:
            return False
        state = self.fanout_state
        view = self.controller.view
        if isinstance(reply, RunOpened):
            state.record_path = reply.record_path
        elif isinstance(reply, (RunUpdate, RunEnded)):
            state.apply(reply.event)
            if isinstance(reply.event, Notice):
                view.notify(reply.event.message, severity="warning", timeout=8)
            view.fanout_changed()
        elif isinstance(reply, RunNote):
            view.notify(reply.message, severity=reply.severity)
        return True

    def on_event(self, event: Event) -> None:
        """An event of the live run (the controller's): a scored text's summary goes to the View."""
        if isinstance(event, ScoreSummary):
            self.controller.heat = True  # the scored answer is drawn by probability
            self.controller.view.scored(event)

    # ---- a phrase ------------------------------------------------------------------------------------------
    async def phrase_pieces(self, text: str):
        """The pieces of `text` as the engine tokenizes a phrase (for the dialog, while typing)."""
        return await self.controller.client.tokenize(text)

    def force_phrase(self, parent: Branch, step: StepEvent, text: str, ids: tuple[int, ...]) -> bool:
        """Branch `parent` at `step`, forcing the phrase `text` (its `ids`, as tokenized for the dialog) one token
        at a time; then the model goes on with the settings in force. False (said why) when it cannot."""
        controller = self.controller
        if not ids:
            controller.view.notify("The phrase is empty: type the text the model is to say", severity="warning")
            return False
        refusal = controller.client.refusal("phrase")
        if refusal is not None:
            controller.view.notify(refusal[0].upper() + refusal[1:], severity="warning", timeout=6)
            return False
        try:
            point = BranchPoint.of_run(parent.state.run, step.index, ids[0], parent=controller.tree.parent_name(parent),
                                       phrase=tuple(ids), phrase_text=text)
        except TokentuiError as err:
            controller.view.notify(str(err), severity="error")
            return False
        return controller.start_branch(parent, step.index, text, point)

    # ---- a fan-out -----------------------------------------------------------------------------------------
    def fanout(self, n: int = FANOUT_SAMPLES, m: int = FANOUT_TOKENS) -> FanoutState | None:
        """`f`: N samples of M tokens from the step in view, under the settings asked for now; the View shows
        them as they come. None (said why) when it cannot start."""
        controller = self.controller
        if controller.replaying:
            viewed = controller.state.view_step
            at = viewed.index + 1 if viewed is not None else "STEP"
            controller.view.notify("A replay cannot run the model: fan out from the record with `tokentui fanout "
                                   f"{controller.replayed_record} --at {at} -n N`", severity="warning", timeout=6)
            return None
        refusal = controller.client.refusal("fanout")
        if refusal is not None:
            controller.view.notify(refusal[0].upper() + refusal[1:], severity="warning", timeout=6)
            return None
        step = controller.step_to_branch("fan out")
        if step is None:
            return None
        parent = controller.tree.shown_branch
        try:
            request = FanoutRequest.of_run(parent.state.run, step.index, n, m, controller.sampler.seed,
                                           parent=controller.tree.parent_name(parent))
            facts = controller.state.facts
            request.check_context(facts.max_context if facts is not None else None)
        except TokentuiError as err:
            controller.view.notify(str(err), severity="error")
            return None
        controller.dialog_paused = False  # the fan-out replaces the paused run, which ends "stopped"
        controller.client.halt()
        state = FanoutState(parent, step, request)
        self.fanout_state = state
        self._fanout_id = None  # the previous fan-out's replies (its end) are no longer this one's
        self._opening = True
        try:
            state.run_id = controller.client.fanout(request)
        except TokentuiError as err:
            controller.view.notify(str(err), severity="error")
            return None
        finally:
            self._opening = False
        self._fanout_id = state.run_id
        controller.view.show_fanout(state)
        return state

    def adopt(self, sample: int) -> bool:
        """Adopt sample `sample` of the latest fan-out as a branch of the run it fanned out from: its tokens forced
        from the step, then the model goes on. False (said why) when it cannot."""
        state = self.fanout_state
        chosen = next((s for s in state.samples if s.n == sample), None) if state is not None else None
        if chosen is None or not chosen.ids:
            self.controller.view.notify("No such sample to adopt", severity="warning")
            return False
        controller = self.controller
        try:
            point = BranchPoint.of_run(state.parent.state.run, state.step.index, chosen.ids[0],
                                       parent=controller.tree.parent_name(state.parent), phrase=tuple(chosen.ids),
                                       sample=chosen.n)
        except TokentuiError as err:
            controller.view.notify(str(err), severity="error")
            return False
        return controller.start_branch(state.parent, state.step.index, f"sample #{chosen.n}", point)
