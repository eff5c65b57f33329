"""The dashboard's controller: everything the dashboard does, as plain Python (no Textual), one object.

It owns the engine client (core/link/), the tree of runs of the current prompt (tui/branches.py, with its tree
file, core/runs/tree.py), the prompt, the panel toggles and what was asked for before the model was ready; it
offers the actions the keys trigger (`start_run`, `toggle_lens`, `export`, …; the sampler, pause / step and cursor
keys from tui/run_keys.py, `branch_at` and the rest of branching from tui/branching.py) and folds the client's
replies into the runs' states. The app (tui/app.py) composes the panels, turns each key into
one call here and paints what the controller says changed, through the `View` it passes in (tui/view.py) — which the
tests replace with a recorder, so every rule below is tested without a terminal.

Where a value lives: the sampler settings asked for are the client's (their one owner in this process); the runs'
states are the tree's; everything else the dashboard remembers between keys is a field here.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from tokentui.core.errors import SettingsError, TokentuiError, exit_status
from tokentui.core.link.client import Reply, RunEnded, RunNote, RunOpened, RunUpdate
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.runs.events import DoneEvent, ErrorEvent, LoadProgress, Notice, StepEvent
from tokentui.core.runs.facts import ModelFacts
from tokentui.core.settings import SamplerSettings
from tokentui.core.steps.display import printable_copy

from .attention_view import Inside
from .branches import BranchTree
from .branching import Branching
from .config import DashboardConfig
from .explore import Explore
from .preview import StepPreviews
from .followup import FollowUps
from .export import export_answer
from .run_keys import RunKeys
from .served import server_of
from .state import RunState
from .view import View


class DashboardController(RunKeys, Branching):
    """Everything the dashboard does (see the module docstring): its keys that steer the run are tui/run_keys.py's,
    its branching tui/branching.py's, inherited."""

    def __init__(self, config: DashboardConfig, view: View) -> None:
        self.config = config
        self.view = view
        self.client = config.new_client(config.sampler)  # the one owner of the run ids and the sampler settings
        self.client.listener = self.on_reply
        self.replaying = config.replay is not None  # a record played back: no model, nothing to change or branch
        self.tree = BranchTree(RunState(show_special_tokens=config.options.ignore_eos),
                               recorder_dir=config.recorder.directory if config.recorder is not None else None)
        self.prompt = config.prompt
        self.system = config.system
        # the panel toggles
        self.heat = False
        self.show_ids = False
        self.lens_on = config.options.logit_lens  # --logit-lens: the lens panel from the start
        self.anatomy_choice: bool | None = None  # None: as tui/sizes.py says for the size; True / False: `a`
        self.inside = Inside(self)  # the attention view (`A`) and the raw logits (`L`): tui/attention_view.py
        # what a key asked for before it could happen
        self.pause_armed = False  # space while loading: pause the first run after its first token
        self.dialog_paused = False  # a dialog paused the run (and resumes it when it closes)
        self._last_temperature: float | None = None  # what `g` goes back to from greedy
        self.load_error: BaseException | None = None  # the last load failure, until a load succeeds
        self.last_export: Path | None = None
        self.tree_paths: list[Path] = []  # every tree file this session wrote
        self.record_paths: list[Path] = []  # every run record this session opened (a cut one is named at quit)
        self._replay_queue: list[int] = []  # a tree played back: the recorded branches still to play
        self.explore = Explore(self)  # forcing a phrase, fanning out, a scored text's summary (tui/explore.py)
        self.previews = StepPreviews(self)  # the step in view under the settings asked for (tui/preview.py)
        self.score_request = config.score  # `tokentui score`: the first run scores this text (None: generates)
        self.raw = config.raw  # --raw / ctrl+r in the editor: the prompt runs with no chat template
        self.follow_ups = FollowUps(self)  # `u`: a follow-up turn of the conversation (tui/followup.py)

    # ---- what the panels read ----------------------------------------------------------------------------
    @property
    def state(self) -> RunState:
        """The state of the run shown (the live one unless another was picked)."""
        return self.tree.shown_branch.state

    @property
    def sampler(self) -> SamplerSettings:
        """The settings asked for: the client's (before the model is loaded, what the command line and the keys
        pressed while loading asked for)."""
        return self.client.sampler

    @property
    def loaded(self) -> bool:
        return self.client.loaded

    @property
    def paused(self) -> bool:
        """The engine's own flag: pausing takes effect at the next step boundary."""
        return self.client.loaded and self.client.paused

    @property
    def exit_code(self) -> int:
        """What quitting now returns: 0, or — while the model has failed to load — the exit status of its error's
        kind (2: a model or device that cannot work; 1: anything else), as the command line says it."""
        if not self.client.loaded and self.load_error is not None:
            error = self.load_error
            return exit_status(error.kind) if isinstance(error, TokentuiError) else 1
        return 0

    # ---- loading -----------------------------------------------------------------------------------------
    async def load(self) -> None:
        """Load the model (its progress shown as it comes), then start the first run; a failure opens the load
        error dialog."""
        state = self.state
        state.phase, state.load_stage, state.load_fraction = "loading", "starting", None
        self.view.repaint()
        try:
            facts = await self.client.load(self._load_progressed)
        except asyncio.CancelledError:  # quitting mid-load: the client has ended the model process
            raise
        except Exception as err:
            self._load_failed(err)
            return
        self._ready(facts)

    def _load_progressed(self, progress: LoadProgress) -> None:
        if self.state.phase == "loading":
            self.state.apply(progress)
            self.view.repaint()

    def _ready(self, facts: ModelFacts) -> None:
        self.load_error = None
        self.state.facts = printable_copy(facts)  # a record's or a server's names are drawn as they are: escaped
        if facts.server is not None:  # a served model: the panels that depend on it lay out again
            self.view.relayout()
        self.start_run()

    def _load_failed(self, error: BaseException) -> None:
        self.state.phase = "load-failed"
        self.load_error = error
        message = str(error) if isinstance(error, TokentuiError) else f"{type(error).__name__}: {error}"
        self.state.error_message = message
        self.view.repaint()
        self.view.load_failed(message)

    def switch_model(self, model: str | None, device: str) -> None:
        """Another model or device chosen in the dashboard (checked already): a new client, the settings asked for
        carried over, the old client closed."""
        relaunch = self.config.relaunch
        if relaunch is None:
            return
        self.config = replace(self.config, load=relaunch(model, device), model=model, device=device)
        old, self.client = self.client, self.config.new_client(self.client.sampler)
        self.client.listener = self.on_reply
        old.listener = lambda reply: None
        old.close()

    # ---- runs ----------------------------------------------------------------------------------------------
    def start_run(self) -> None:
        """Stop the current run (if any) and start the current prompt afresh: a new tree of runs."""
        client = self.client
        if not client.loaded:
            return
        client.halt()
        self.tree.restart(self.state.next_run(), self.prompt, self.system)
        self.view.clear_answer()
        if self.pause_armed:  # space was pressed while loading: stop after the first token (prefill's)
            self.pause_armed = False
            client.pause()
            client.step_once()
        self.view.repaint()
        if self.score_request is not None:  # `tokentui score`: the text is scored (again, on `r`)
            self.tree.live_branch.run_id = client.score(self.score_request)
            return
        if self.raw:
            self.tree.live_branch.run_id = self.follow_ups.start_raw(self.prompt, self.system)
        else:
            self.tree.live_branch.run_id = client.start(self.prompt, self.system)
        if self.config.replay is not None:
            self._replay_queue = [node.number for node in self.config.replay.nodes[1:]]

    def restart(self) -> bool:
        """`r`: the same prompt again (after a failed load: load again). False when there is nothing to do."""
        if not self.client.loaded:
            if self.state.phase == "load-failed":
                return True  # the app starts the load (it runs as a worker)
            return False
        if self.replaying:
            self.view.notify("A replay plays what was recorded: r plays it again from the start", timeout=4)
        self.start_run()
        return False

    def set_prompt(self, prompt: str, system: str | None, raw: bool = False) -> None:
        """A prompt from the editor: it runs at once (once the model is loaded, when it is not yet); `raw`: with no
        chat template."""
        self.dialog_paused = False  # the new run replaces the paused one
        self.prompt, self.system, self.raw = prompt, system, raw
        self.score_request = None  # a prompt typed is asked, not scored
        if self.client.loaded:
            self.start_run()
        else:
            self.view.notify("The new prompt runs once the model is loaded", timeout=4)

    def on_reply(self, reply: Reply) -> None:
        """The client's replies, on the event loop; only the current run's reach here (and earlier runs' ends).
        What they carry is drawn as it is, so their strings are made printable first (a record's or a server's
        escape sequence is shown, never sent to the terminal); the record has them as they came."""
        reply = printable_copy(reply)
        if self.explore.takes(reply):  # a fan-out's: not a run of the tree
            return
        if isinstance(reply, RunUpdate):
            self._on_event(reply.event)
        elif isinstance(reply, RunOpened):
            if reply.record_path is not None:
                self.record_paths.append(reply.record_path)
            self.tree.opened(reply.record_path)
            self._note_tree_path()
            self.view.repaint()
        elif isinstance(reply, RunEnded):  # an earlier run (a branch's parent) ended after a newer one began
            if self.tree.ended(reply.run_id, reply.event):
                self.view.repaint()
        elif isinstance(reply, RunNote):
            self.view.notify(reply.message, severity=reply.severity)

    def _note_tree_path(self) -> None:
        path = self.tree.path
        if path is not None and path not in self.tree_paths:
            self.tree_paths.append(path)

    def _on_event(self, event) -> None:
        shown = self.tree.apply(event)  # into the live run's state; True when that run is the one shown
        if isinstance(event, StepEvent):
            if shown:
                self.view.repaint(now=False)
            return
        if isinstance(event, Notice):
            self.view.notify(event.message, severity="warning", timeout=8)
        self.explore.on_event(event)
        if shown:
            self.view.repaint()
        if isinstance(event, ErrorEvent):
            where = f" at step {event.step + 1}" if event.step >= 0 else ""  # numbered from 1, like the tokens
            self.view.run_failed(f"The run failed{where}", event.message)
        elif isinstance(event, DoneEvent) and self._replay_queue:
            self._replay_next_branch()

    def _replay_next_branch(self) -> None:
        """A tree played back: the next recorded branch, from its parent, as it was taken."""
        number = self._replay_queue.pop(0)
        node = self.config.replay.node(number)
        parent = self.tree.number(node.parent)
        if node.is_turn:  # a recorded follow-up (tui/followup.py), asked of its parent as it was
            self.follow_ups.ask(node.user or "", parent)
            return
        point = BranchPoint.of_run(parent.state.run, node.at, node.token, parent=self.tree.parent_name(parent))
        if self.start_branch(parent, node.at, node.piece or str(node.token), point) and node.sample is not None:
            self.tree.live_branch.sample = node.sample  # an adopted sample, named in words as it was (Branch.label)

    # ---- view toggles --------------------------------------------------------------------------------------
    def toggle_lens(self) -> None:
        """Ask the engine for the lens from its next step (or stop asking), and show or hide its panel."""
        self.lens_on = not self.lens_on
        served = server_of(self.state.facts) is not None  # no hidden states come out of a server: nothing to ask
        if not served and not self.replaying:
            try:
                # the sublayer column beside the lens (tui/panels/sublayers.py) comes with it
                self.client.set_options(replace(self.client.options, logit_lens=self.lens_on, sublayers=self.lens_on))
            except SettingsError as err:
                self.view.notify(str(err), severity="error")
        self.view.relayout()
        if not self.lens_on or served:
            return
        state = self.state
        if self.replaying:
            if state.view_step is not None and state.view_step.lens is None:
                self.view.notify("This record was made without the lens: run `tokentui --logit-lens` to record it",
                                 timeout=6)
        elif state.running:
            self.view.notify("Logit lens on from the next step (it costs a full LM head per layer per step)",
                             timeout=5)
        elif state.view_step is not None and state.view_step.lens is None:
            self.view.notify("The lens shows from the next run: r runs the prompt again with it", timeout=6)

    def set_time_stages(self, on: bool) -> None:
        """The one-pass panel is shown (on) or hidden: the engine times each step's stages exactly while it is."""
        options = self.client.options
        if options.time_stages == on or self.replaying:
            return
        try:
            self.client.set_options(replace(options, time_stages=on))
        except SettingsError as err:
            self.view.notify(str(err), severity="error")

    def toggle_heat(self) -> None:
        self.heat = not self.heat
        self.view.repaint()

    def toggle_ids(self) -> None:
        self.show_ids = not self.show_ids
        self.view.repaint()

    # ---- export / quit -------------------------------------------------------------------------------------
    def export(self) -> Path | None:
        """Write the shown run's answer (tui/export.py); None, said why, when there is nothing to write yet or the
        file cannot be written."""
        state = self.state
        if state.phase in ("loading", "load-failed") or (not state.tokens and state.done is None):
            if state.phase != "loading":
                self.view.notify("Nothing to export yet", severity="warning", timeout=4)
            return None
        try:
            path = export_answer(state.answer_text, state.record_path)
        except OSError as err:
            self.view.notify(f"Export failed: {err}", severity="error")
            return None
        self.last_export = path
        return path

    async def finish(self, timeout: float) -> bool:
        """Stop the run and give it `timeout` seconds to end at its step boundary (its record then ends with the
        engine's own `done`)."""
        return await self.client.finish(timeout)

    def close(self) -> None:
        """However the dashboard ends: the client closed (the run in progress ends, its record with `done`; the
        model process too) and the tree file finished."""
        self.client.close()
        self.tree.close()

    def quit_lines(self) -> list[str]:
        """What the terminal is told once the dashboard has closed: where the runs of each prompt were recorded (the
        tree file, which names each run's record)."""
        lines = []
        for path in self.tree_paths:
            runs = self.tree.recorded_in(path)
            what = "1 run" if runs == 1 else f"{runs} runs"
            lines.append(f"{what} of one prompt recorded in {path} (play them back: tokentui replay {path})")
        return lines
