"""The dashboard: one engine client, a state folded from its replies, and one widget per panel.

The app talks to the engine only through its client (core/link/client.py), on the event loop: commands are method calls,
replies come back typed through `_on_reply` (a run opened, an engine event of the current run, a note, a failure).
There is no thread of the app's own: the model runs in its own process, read with `loop.add_reader`, or — a replay,
the tests' scripted engine — in this one, stepped on the client's executor thread. The app folds events into
`RunState` at once and repaints at most ~30 times a second. Failures come back one way each: a load raises in
`_load` (→ error dialog); a run ends with an `error` event or a `RunFailed` reply (→ status line and dialog).

Loading and its failure dialogs live in tui/loading.py, the key actions in tui/actions.py, branching and the lens
in tui/branching.py, the one-pass panel's key and place in tui/anatomy_actions.py (mixins of this app),
theme registration in tui/theming.py, writing an export in tui/export.py, and running it as a program (exit
status, the record's path on the terminal) in tui/program.py.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal
from textual.css.query import NoMatches

from tokentui.core.link.client import Reply, RunEnded, RunNote, RunOpened, RunUpdate
from tokentui.core.steps.display import printable_copy
from tokentui.core.runs.events import ErrorEvent, Notice, StepEvent
from tokentui.core.settings import SamplerSettings
from tokentui.themes import THEME_VARIABLE_DEFAULTS

from .actions import ActionsMixin
from .anatomy_actions import AnatomyMixin
from .branching import BranchingMixin
from .commands import TokentuiCommands
from .config import DashboardConfig
from .keybar import KeyBar
from .keys import app_bindings
from .loading import LoadingMixin
from .sizes import HORIZONTAL_BREAKPOINTS, VERTICAL_BREAKPOINTS, READINGS_IDS, hidden_note, plan
from .panels import (
    AnatomyPanel,
    CandidatesPanel,
    KVPanel,
    LensPanel,
    ModelPanel,
    OutputPanel,
    PendingPanel,
    PromptPanel,
    ReadingsStrip,
    SamplerPanel,
    SpeedPanel,
    StatusLine,
)
from .branches import BranchTree
from .state import RunState
from .theming import register_themes
from .travel import TravelMixin

FLUSH_INTERVAL = 1 / 30  # at most ~30 repaints a second however fast the model is
QUIT_WAIT = 1.0  # seconds quitting waits for the run to end at a step boundary (so its record ends with `done`)


class TokentuiApp(LoadingMixin, ActionsMixin, BranchingMixin, AnatomyMixin, TravelMixin, App[int]):
    """Watch a language model write, one token at a time."""

    TITLE = "tokentui"
    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses live elsewhere
    BINDINGS = [*app_bindings(), Binding("ctrl+c", "quit", "quit", show=False, priority=True,
                                         id="tokentui.interrupt")]
    COMMANDS = App.COMMANDS | {TokentuiCommands}
    HORIZONTAL_BREAKPOINTS = HORIZONTAL_BREAKPOINTS  # tui/sizes.py: which panels show at which size
    VERTICAL_BREAKPOINTS = VERTICAL_BREAKPOINTS
    AUTO_FOCUS = "#output-view"  # arrows scroll the answer; Tab moves to the (scrollable) prompt panel
    CURSOR_BLINK = True  # snapshot tests turn caret blinking off

    def __init__(self, config: DashboardConfig) -> None:
        super().__init__()
        self.config = config
        self.client = config.new_client(config.sampler)  # the one owner of the run id and the sampler settings
        self.client.listener = self._on_reply
        # every run of the current prompt (the first and its branches), each with its own state (tui/branches.py)
        self.branch_tree = BranchTree(RunState(show_special_tokens=config.options.ignore_eos))
        self.prompt = config.prompt
        self.system = config.system
        self.heat = False
        self.lens_on = config.options.logit_lens  # --logit-lens: the lens panel from the start (l toggles it)
        self.show_ids = False
        self.user_theme_names: set[str] = set()
        self.record_paths: list[Path] = []  # every run recorded this session
        self._flush_timer = None
        self._last_flush = 0.0
        self._status_message_timer = None
        self._startup_notes: list[tuple[str, str]] = []
        self._prompt_key = None
        self._quitting = False
        self.pause_armed = False  # space while loading: pause the first run after its first token
        self._dialog_paused = False  # a dialog paused the run (and resumes it when it closes)
        self.load_error: BaseException | None = None  # the last load failure, until a load succeeds
        self.crash: BaseException | None = None  # an exception nobody handled (`_fatal_error`), and its log
        self.crash_log: Path | None = None
        themes = register_themes(self, config.theme, config.user_theme_dir)  # tui/theming.py
        self.user_theme_names.update(themes.user_names)
        self._startup_notes.extend((error, "error") for error in themes.errors)
        self._initial_theme = themes.initial

    # ---- layout --------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield PromptPanel(id="prompt")
        with Horizontal(id="middle"):
            yield OutputPanel(id="output")
            yield CandidatesPanel(id="candidates")
            yield ModelPanel(id="model")
            yield LensPanel(id="lens")  # off by default (l): it takes the model panel's place, or the candidates'
            yield AnatomyPanel(id="anatomy-side")  # `a` on a smaller terminal: the same place (tui/anatomy_actions.py)
        yield AnatomyPanel(id="anatomy")  # one pass, taken apart: a row of its own at ≥160×48 (on by default there)
        with Grid(id="bottom"):
            yield SamplerPanel(id="sampler")
            yield SpeedPanel(id="speed")
            yield KVPanel(id="kv")
            yield PendingPanel(id="pending")
        yield ReadingsStrip(id="readings")  # KV · ms/step · pending on one line when their panels are hidden
        yield StatusLine(id="status")
        yield KeyBar(id="keys")  # whole entries only; `? help` and `q quit` always (tui/keybar.py)

    @property
    def sampler_settings(self) -> SamplerSettings:
        """The sampler settings asked for: the engine client's (their one owner in this process; before the model is
        loaded, what the command line and the keys pressed while loading asked for)."""
        return self.client.sampler

    @property
    def loaded(self) -> bool:
        return self.client.loaded

    @property
    def state(self) -> RunState:
        """What the panels show: the state of the run shown (the live one unless another branch was picked)."""
        return self.branch_tree.shown_branch.state

    @property
    def live_state(self) -> RunState:
        """The state of the run the engine is writing (the shown one when none is)."""
        live = self.branch_tree.live_branch
        return live.state if live is not None else self.state

    def get_driver_class(self):
        """Textual's Linux driver, made to survive its terminal going away (see tui/driver.py)."""
        driver_class = super().get_driver_class()
        if driver_class.__name__ == "LinuxDriver":
            from .driver import TerminalDriver

            if issubclass(TerminalDriver, driver_class):
                return TerminalDriver
        return driver_class

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(THEME_VARIABLE_DEFAULTS)

    def on_mount(self) -> None:
        self.theme = self._initial_theme
        self.theme_changed_signal.subscribe(self, lambda _theme: self.call_after_refresh(self._rebuild_all))
        for message, severity in self._startup_notes:
            self.notify(message, severity=severity, timeout=12, markup=False)
        self.query_one(StatusLine).max_new_tokens = self.config.options.max_new_tokens
        self._repaint_now()
        self._install_signal_handlers()
        self._start_load()

    def _install_signal_handlers(self) -> None:
        """A dropped SSH session (SIGHUP), a kill (SIGTERM) or an interrupt sent as a signal (SIGINT; Ctrl-C
        typed in the dashboard is a key) quits like `q`: run stopped, record kept, terminal restored."""
        if self.is_headless:
            return
        try:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.action_quit)
        except (NotImplementedError, RuntimeError, AttributeError, ValueError):
            pass  # not the main thread, or no such signal here

    def on_resize(self) -> None:
        self._apply_layout()
        self.call_after_refresh(self._rebuild_all)

    _layout_plan = None
    _layout_settling = True  # until the first layout plan is in place

    def _apply_layout(self) -> None:
        """Show and hide the panels as tui/sizes.py's table says for this size (the stylesheet sizes them)."""
        width, height = self.size
        layout = plan(width, height)
        if layout == self._layout_plan:
            return
        self._layout_plan = layout
        self._layout_settling = True  # the answer waits for the new layout (not wrapped at a passing width)

        def settled() -> None:
            self._layout_settling = False
            self._repaint_now()

        self.call_after_refresh(settled)
        try:
            for widget_id in ("model", *READINGS_IDS):
                self.query_one(f"#{widget_id}").display = layout.shows(widget_id)
            # the logit lens (l) takes the model panel's place where there is one, else the candidates'
            self.query_one("#lens").display = self.lens_on
            self.query_one("#candidates").display = not (self.lens_on and not layout.shows("model"))
            if self.lens_on and layout.shows("model"):
                self.query_one("#model").display = False
            strip = self.query_one(ReadingsStrip)
            strip.display = layout.readings_strip
            note = hidden_note(layout)  # said under the strip, or under the answer when there is no strip
            strip.set_note(note if layout.readings_strip else "")
            self.query_one(OutputPanel).set_note("" if layout.readings_strip else note)
            self.query_one("#bottom").set_class(layout.readings_strip, "-strip")
            self._place_anatomy(layout)  # after the lens: they may want the same place
            self.query_one(PromptPanel).template_rows = layout.template_rows
        except NoMatches:  # not composed yet, or shutting down
            self._layout_plan = None

    def on_unmount(self) -> None:
        """However the app ends, the engine client is closed: the run in progress ends (its record with `done`),
        and so does the model process."""
        if self._flush_timer is not None:
            self._flush_timer.stop()
        self.client.close()

    # ---- generation ----------------------------------------------------------------------------------------
    def _start_run(self) -> None:
        """Stop the current run (if any) and start the current prompt afresh."""
        client = self.client
        if not client.loaded:
            return
        client.halt()
        self.branch_tree.restart(self.state.next_run())  # a new prompt or a restart: a new tree of runs
        self.query_one(OutputPanel).view.clear()
        if self.pause_armed:  # space was pressed while loading: stop after the first token (prefill's)
            self.pause_armed = False
            client.pause()
            client.step_once()
        self._repaint_now()
        self.branch_tree.live_branch.run_id = client.start(self.prompt, self.system)

    def _handle_exception(self, error: Exception) -> None:
        self.crash = error  # Textual's handler of an exception nobody handled; it ends in `_fatal_error`
        super()._handle_exception(error)

    def _fatal_error(self) -> None:
        """Textual's end of the app after such an exception, without the traceback it would print (it shows every
        frame's locals: a prompt, a key): the traceback goes to a crash log and tui/program.py prints one line
        naming it (core/crash.py, the last line of defence). Textual's private hooks (textual < 9, pinned)."""
        from tokentui.core.crash import write_crash_log

        self.crash_log = write_crash_log(self.crash) if self.crash is not None else None
        self.bell()
        self._close_messages_no_wait()  # what Textual's own _fatal_error does after rendering the traceback

    def _on_reply(self, reply: Reply) -> None:
        """The engine client's replies, on the event loop; only the current run's reach here. What they carry is
        drawn as it is, so their strings are made printable first (a record's or a server's escape sequence is
        shown, never sent to the terminal); the record has them as they came."""
        reply = printable_copy(reply)
        if isinstance(reply, RunUpdate):
            self._on_event(reply.event)
        elif isinstance(reply, RunOpened):
            if reply.record_path is not None:
                self.record_paths.append(reply.record_path)
            self.live_state.record_path = reply.record_path
            self._repaint_now()
        elif isinstance(reply, RunEnded):  # an earlier run (a branch's parent) ended after a newer one began
            if self.branch_tree.ended(reply.run_id, reply.event):
                self._repaint_now()
        elif isinstance(reply, RunNote):
            self.notify(reply.message, severity=reply.severity, markup=False)

    def _on_event(self, event) -> None:
        shown = self.branch_tree.apply(event)  # into the live run's state; True when that run is the one shown
        if isinstance(event, StepEvent):
            if shown:
                self._schedule_flush()
            return
        if isinstance(event, Notice):
            self.notify(event.message, severity="warning", timeout=8, markup=False)
        if shown:
            self._repaint_now()
        if isinstance(event, ErrorEvent):
            where = f" at step {event.step + 1}" if event.step >= 0 else ""  # numbered from 1, like the tokens
            self._run_failed(f"The run failed{where}", event.message)

    # ---- repainting ----------------------------------------------------------------------------------------
    def _schedule_flush(self) -> None:
        if self._flush_timer is not None:
            return
        delay = FLUSH_INTERVAL - (time.monotonic() - self._last_flush)
        if delay <= 0:
            self._repaint_now()
        else:
            self._flush_timer = self.set_timer(delay, self._repaint_now)

    def _repaint_now(self, force: bool = False) -> None:
        if self._flush_timer is not None:
            self._flush_timer.stop()
            self._flush_timer = None
        self._last_flush = time.monotonic()
        try:
            self._paint(force)
        except NoMatches:  # shutting down: the panels are gone
            pass

    def _paint(self, force: bool) -> None:
        state = self.state
        self._apply_layout()
        prompt_panel = self.query_one(PromptPanel)
        prompt_panel.show_ids = self.show_ids
        key = (id(state.prompt), state.phase == "loading", self.show_ids, prompt_panel.template_rows)
        if force or key != self._prompt_key:
            self._prompt_key = key
            prompt_panel.show(state, force)
        if not self._layout_settling:
            self.query_one(OutputPanel).sync(state)
        self.query_one(CandidatesPanel).show(state, force)
        if self.lens_on:
            self.query_one(LensPanel).show(state, force)
        self._paint_anatomy(state, force)
        self.query_one(SamplerPanel).show(state, force)
        self.query_one(ModelPanel).show(state, force)
        self.query_one(KVPanel).show(state, force)
        self.query_one(PendingPanel).show(state, force)
        done = state.phase in ("done", "error", "load-failed")
        self.query_one(SpeedPanel).show(state, force=force or done)
        self.query_one(ReadingsStrip).show(state, force)
        status = self.query_one(StatusLine)
        status.paused = self.paused
        status.show(state)

    def _rebuild_all(self) -> None:
        self._repaint_now(force=True)
        self.query_one(OutputPanel).view.refresh()

    def action_quit(self) -> None:  # type: ignore[override]
        """Stop the run, give it QUIT_WAIT seconds to end at its step boundary (its record then ends with the
        engine's own `done`; tui/program.py ends what is left), then leave."""
        if self._quitting:
            return
        self._quitting = True
        self.run_worker(self._quit(), group="quit", name="quit", exit_on_error=False)

    async def _quit(self) -> None:
        try:
            await self.client.finish(QUIT_WAIT)
        finally:
            self.exit(return_code=self.exit_code)
