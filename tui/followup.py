"""A follow-up turn and a raw run in the dashboard (issue 40, item 13; core/runs/turns.py says what each is).

`u` after an answer (or while the run is paused, or going: the editor pauses it, and its answer as it stands is the
history) opens the prompt editor for the next user message; submitting it starts a turn of the same conversation
as a child of the run shown (the tree records it with its message, core/runs/tree.py) and that child becomes the
live run. The engine reuses the KV cache its latest run left, up to the common prefix of the two prompts
(core/model/turn.py), and the prompt panel says what was reused. A raw run (`ctrl+r` in the prompt editor, `--raw`)
is a first turn with no chat template.

`FollowUps` is the controller's side, plain Python (tested with its recording View); `open_editor` the app's, which
pushes the editor. It reaches the controller through `FollowUpHost`, what it uses of it, so it does not import
tui/controller.py, which imports it.
"""

from __future__ import annotations

from typing import Protocol

from tokentui.core.errors import TokentuiError
from tokentui.core.link.client import EngineClient
from tokentui.core.runs.turns import TurnRequest, follow_up, history_of

from .branches import Branch, BranchTree
from .format import plural
from .state import RunState
from .view import View

ENDINGS = {"eos": "end token", "length": "length limit", "context": "context full", "stopped": "stopped",
           "error": "failed", "scored": "scored"}


class FollowUpHost(Protocol):
    """What FollowUps uses of the controller (tui/controller.py's DashboardController)."""

    view: View
    client: EngineClient
    tree: BranchTree
    dialog_paused: bool

    @property
    def replaying(self) -> bool: ...

    @property
    def state(self) -> RunState: ...


class FollowUps:
    def __init__(self, controller: FollowUpHost) -> None:
        self.controller = controller

    def refusal(self, parent: Branch | None = None) -> str | None:
        """Why a follow-up cannot be asked of `parent` (default: the run shown) now, one line for a user (None: it
        can)."""
        controller = self.controller
        state = parent.state if parent is not None else controller.state
        if controller.replaying and controller.client.refusal("turn") is not None:
            return "A replay plays what was recorded: run `tokentui --headless --prompt … --follow-up …` to ask more"
        refusal = controller.client.refusal("turn")
        if refusal is not None:
            return refusal[0].upper() + refusal[1:]
        if state.run.fanout is not None or state.run.score is not None:
            return "Only an answer the model wrote can be followed up"
        try:
            history_of(state.run)
        except TokentuiError as err:
            return str(err)[0].upper() + str(err)[1:]
        return None

    def summary(self) -> str:
        """What the follow-up goes after, in one line for the editor: the turn, its tokens, how its answer ended."""
        state = self.controller.state
        run = state.run
        turn = run.turn.turn if run.turn is not None else 1
        prompt = len(run.prompt.ids) if run.prompt is not None else 0
        answer = run.offset + len(run)
        ended = ENDINGS.get(run.done.reason, run.done.reason) if run.done is not None else "stopped here"
        return (f"turn {turn + 1} of the conversation, after turn {turn}: {prompt:,} prompt + "
                f"{plural(answer, 'answer token')} ({ended})")

    def ask(self, message: str, parent: Branch | None = None) -> bool:
        """Start the follow-up `message` to `parent` (default: the run shown), as a child of it in the tree, now the
        live run. False (said why, in one line; nothing changes) when it cannot: no answer yet, an empty message,
        an engine that cannot."""
        controller = self.controller
        parent = parent or controller.tree.shown_branch
        refusal = self.refusal(parent)
        if refusal is not None:
            controller.view.notify(refusal, severity="warning", timeout=6)
            return False
        try:
            request = follow_up(parent.state.run, message, parent=controller.tree.parent_name(parent))
        except TokentuiError as err:
            controller.view.notify(str(err), severity="error")
            return False
        return self._start(parent, request)

    def start_raw(self, prompt: str, system: str | None) -> int:
        """The first run of a new tree as a raw run (no chat template): its run id."""
        return self.controller.client.turn(TurnRequest.first(prompt, system, raw=True))

    def _start(self, parent: Branch, request: TurnRequest) -> bool:
        controller = self.controller
        controller.dialog_paused = False  # the turn replaces the paused run, which ends "stopped"
        controller.client.halt()
        branch = controller.tree.add_turn(parent, request.turn, request.user, controller.state.next_run())
        controller.view.clear_answer()
        controller.view.repaint()
        try:
            branch.run_id = controller.client.turn(request)
        except TokentuiError as err:  # refused before anything started
            controller.view.notify(str(err), severity="error")
            return False
        return True


def open_editor(app) -> None:
    """`u`: the prompt editor for a follow-up to the run shown (refused in one line, before it opens, when there is
    nothing to follow up); the run is paused while it is open, and resumes when it is cancelled."""
    from .screens.prompt_editor import PromptEditor

    controller = app.controller
    if isinstance(app.screen, PromptEditor):
        return
    follow_ups = controller.follow_ups
    refusal = follow_ups.refusal()
    if refusal is not None:
        app.notify(refusal, severity="warning", timeout=6, markup=False)
        return
    paused = controller.pause_for_dialog()

    def done(result) -> None:
        if result is None:
            controller.resume_after_dialog()
            return
        follow_ups.ask(result.prompt)

    run = controller.state.run
    raw = run.turn is not None and run.turn.raw
    app.push_screen(PromptEditor("", None, cursor_blink=app.CURSOR_BLINK, run_paused=paused,
                                 follow_up=follow_ups.summary(), raw=raw), done)
