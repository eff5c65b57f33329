"""The dashboard: a thin engine worker, a state folded from its events, and one widget per panel.

Threads: the model loads in a thread worker (through a daemon thread, so quitting mid-load does not wait for it);
generation runs in an exclusive thread worker (again through a daemon thread, so quitting mid-prefill does not
wait for it) that iterates the engine's run, recorded by core/runner.py, and posts each event — it never waits for
the UI. The app folds events into `RunState` at once and repaints at most ~30 times a second. Failures come back
one way:
`on_worker_state_changed` (load errors → error dialog; a crashed run → status line).

Loading and its failure dialogs live in tui/loading.py, the key actions in tui/actions.py (mixins of this app),
theme registration in tui/theming.py, writing an export in tui/export.py, and running it as a program (exit
status, the record's path on the terminal) in tui/run.py.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal
from textual.css.query import NoMatches
from textual.worker import Worker, WorkerState, get_current_worker

from tokentui.core.errors import TokentuiError
from tokentui.core.events import ErrorEvent, Notice, StepEvent
from tokentui.core.runner import RecordedRun
from tokentui.core.settings import SamplerSettings
from tokentui.themes import THEME_VARIABLE_DEFAULTS

from .actions import ActionsMixin
from .commands import TokentuiCommands
from .config import DashboardConfig, EngineLike
from .keybar import KeyBar
from .keys import app_bindings
from .loading import LoadingMixin
from .layout import HORIZONTAL_BREAKPOINTS, VERTICAL_BREAKPOINTS, READINGS_IDS, hidden_note, plan
from .messages import EngineEvent, RunNote, RunStarted
from .panels import (
    CandidatesPanel,
    KVPanel,
    ModelPanel,
    OutputPanel,
    PendingPanel,
    PromptPanel,
    ReadingsStrip,
    SamplerPanel,
    SpeedPanel,
    StatusLine,
)
from .state import RunState
from .theming import register_themes

FLUSH_INTERVAL = 1 / 30  # at most ~30 repaints a second however fast the model is


class TokentuiApp(LoadingMixin, ActionsMixin, App[int]):
    """Watch a language model write, one token at a time."""

    TITLE = "tokentui"
    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses live elsewhere
    BINDINGS = [*app_bindings(), Binding("ctrl+c", "quit", "quit", show=False, priority=True,
                                         id="tokentui.interrupt")]
    COMMANDS = App.COMMANDS | {TokentuiCommands}
    HORIZONTAL_BREAKPOINTS = HORIZONTAL_BREAKPOINTS  # tui/layout.py: which panels show at which size
    VERTICAL_BREAKPOINTS = VERTICAL_BREAKPOINTS
    AUTO_FOCUS = "#output-view"  # arrows scroll the answer; Tab moves to the (scrollable) prompt panel
    CURSOR_BLINK = True  # snapshot tests turn caret blinking off

    def __init__(self, config: DashboardConfig) -> None:
        super().__init__()
        self.config = config
        self.engine: EngineLike | None = None
        self.state = RunState(show_special_tokens=config.options.ignore_eos)
        self.prompt = config.prompt
        self.system = config.system
        self._sampler_before_load: SamplerSettings = config.sampler  # see `sampler_settings`
        self.heat = False
        self.show_ids = False
        self.user_theme_names: set[str] = set()
        self.record_paths: list[Path] = []  # every run recorded this session
        self._engine_lock = threading.Lock()  # one engine.run at a time, across restarts
        self._flush_timer = None
        self._last_flush = 0.0
        self._status_message_timer = None
        self._startup_notes: list[tuple[str, str]] = []
        self._prompt_key = None
        self._run_worker: Worker | None = None  # the current run's worker (older ones may still be finishing)
        self._load_thread: threading.Thread | None = None
        self.pause_armed = False  # space while loading: pause the first run after its first token
        self._dialog_paused = False  # a dialog paused the run (and resumes it when it closes)
        self.load_error: BaseException | None = None  # the last load failure, until a load succeeds
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
        """The sampler settings asked for. Once the model is loaded these are the engine's own — its client is their
        one owner in this process, and every key reads and changes them there; before that, what the command line
        and the keys pressed while loading asked for (handed to the engine when it is ready)."""
        return self.engine.sampler if self.engine is not None else self._sampler_before_load

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
        """Show and hide the panels as tui/layout.py's table says for this size (the stylesheet sizes them)."""
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
            strip = self.query_one(ReadingsStrip)
            strip.display = layout.readings_strip
            note = hidden_note(layout)  # said under the strip, or under the answer when there is no strip
            strip.border_subtitle = note if layout.readings_strip else ""
            self.query_one(OutputPanel).set_note("" if layout.readings_strip else note)
            self.query_one("#bottom").set_class(layout.readings_strip, "-strip")
            self.query_one(PromptPanel).template_rows = layout.template_rows
        except NoMatches:  # not composed yet, or shutting down
            self._layout_plan = None

    def on_unmount(self) -> None:
        """However the app ends, let the generation thread finish its run at the next step."""
        if self._flush_timer is not None:
            self._flush_timer.stop()
        self._halt_engine()

    # ---- generation ----------------------------------------------------------------------------------------
    def _start_run(self) -> None:
        """Stop the current run (if any) and start the current prompt afresh."""
        engine = self.engine
        if engine is None:
            return
        self._halt_engine()
        run_id = self.state.start_run()  # the state holds the dashboard's one run counter
        self.query_one(OutputPanel).view.clear()
        if self.pause_armed:  # space was pressed while loading: stop after the first token (prefill's)
            self.pause_armed = False
            engine.pause()
            engine.step_once()
        self._repaint_now()
        self._run_worker = self._generate(engine, self.prompt, self.system, run_id)

    def _halt_engine(self) -> None:
        engine = self.engine
        if engine is None:
            return
        engine.stop()
        if engine.paused:
            engine.resume()

    @work(thread=True, exclusive=True, group="generate", name="generate", exit_on_error=False)
    def _generate(self, engine: EngineLike, prompt: str, system: str | None, run_id: int) -> None:
        """Run the generation loop on a daemon thread and wait for it; errors come back through this worker.

        The daemon thread is what lets the app quit at once: a thread worker is joined when the app's event loop
        closes, and one model run (a long prompt's prefill) cannot be stopped half-way. Once cancelled, this
        worker returns and the thread ends its run by itself at the next step boundary (`engine.stop`)."""
        worker = get_current_worker()
        failure: list[BaseException] = []

        def target() -> None:
            try:
                self._generate_events(engine, prompt, system, run_id, worker)
            except BaseException as err:  # handed to the worker, which re-raises it
                failure.append(err)

        thread = threading.Thread(target=target, name="tokentui-generate", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.05)
            if worker.is_cancelled:
                return
        if failure:
            raise failure[0]

    def _generate_events(self, engine: EngineLike, prompt: str, system: str | None, run_id: int,
                         worker: Worker) -> None:
        """Loop the engine's run (recorded by core/runner.py) and post every event. Never waits for the UI."""
        with self._engine_lock:
            if worker.is_cancelled or run_id != self.state.run_id:
                return
            with RecordedRun(engine, self.config.recorder,
                             on_note=lambda message: self.post_message(RunNote(run_id, message))) as run:
                self.post_message(RunStarted(run_id, run.open()))
                stopping = False
                for event in run.events(prompt, system):
                    self.post_message(EngineEvent(run_id, event))
                    if not stopping and (worker.is_cancelled or run_id != self.state.run_id):
                        engine.stop()  # superseded: end at the next step, keep the record complete
                        stopping = True
            if run.cut_off is not None:  # the engine's stream ended without `done`: the run's one is this
                self.post_message(EngineEvent(run_id, run.cut_off))

    def on_run_started(self, message: RunStarted) -> None:
        if message.record_path is not None:
            self.record_paths.append(message.record_path)
        if message.run_id == self.state.run_id:
            self.state.record_path = message.record_path
            self._repaint_now()

    def on_run_note(self, message: RunNote) -> None:
        if message.run_id == self.state.run_id:
            self.notify(message.message, severity=message.severity, markup=False)

    def on_engine_event(self, message: EngineEvent) -> None:
        if message.run_id != self.state.run_id:
            return  # a superseded run finishing
        event = message.event
        self.state.apply(event)
        if isinstance(event, StepEvent):
            self._schedule_flush()
            return
        if isinstance(event, Notice):
            self.notify(event.message, severity="warning", timeout=8, markup=False)
        self._repaint_now()
        if isinstance(event, ErrorEvent):
            where = f" at step {event.step + 1}" if event.step >= 0 else ""  # numbered from 1, like the tokens
            self._run_failed(f"The run failed{where}", event.message)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if worker.group == "load":
            if event.state == WorkerState.SUCCESS and worker.result is not None:
                self._engine_ready(worker.result)
            elif event.state == WorkerState.ERROR:
                self._load_failed(worker.error)
        elif worker.group == "generate" and event.state == WorkerState.ERROR and worker is self._run_worker:
            error = worker.error
            message = str(error) if isinstance(error, TokentuiError) else f"{type(error).__name__}: {error}"
            self.state.phase = "error"
            self.state.error_message = message
            self._repaint_now()
            self._run_failed("The run failed", message)

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
        self._halt_engine()
        self.exit(return_code=self.exit_code)

    def settled(self, timeout: float) -> bool:
        """After the app has ended: wait up to `timeout` seconds for the run in progress to end at its next step
        boundary (its record then ends with `done`). False while the model is still busy in a single long model
        run (a long prompt's prefill) or still loading — neither can be stopped half-way."""
        if self._load_thread is not None and self._load_thread.is_alive():
            return False
        if not self._engine_lock.acquire(timeout=timeout):
            return False
        self._engine_lock.release()
        return True
