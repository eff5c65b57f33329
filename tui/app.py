"""The dashboard: one controller (tui/controller.py) and one widget per panel.

Everything the dashboard does is the controller's: it owns the engine client, the tree of runs, the prompt and the
toggles, and each key's action here is one call to it. The app composes the panels, lays them out for the
terminal's size (tui/panel_layout.py, by tui/sizes.py and tui/placement.py), paints them from the state at most ~30
times a second (tui/painting.py), and opens the dialogs (tui/dialogs.py) — it is the controller's `View`. There is
no thread of the app's own: the model runs in its own process, read with `loop.add_reader`, or — a replay, the
tests' scripted engine — in this one, stepped on the client's executor thread. Writing an export is
tui/export.py's, running the app as a program tui/program.py's.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal

from tokentui.themes import THEME_VARIABLE_DEFAULTS

from . import dialogs, followup
from .commands import TokentuiCommands, system_commands
from .config import DashboardConfig
from .controller import DashboardController
from .keybar import KeyBar
from .keys import app_bindings
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
from .panels import attention
from .painting import Painter
from .panel_layout import PanelLayout
from .panels.output_view import OutputView
from .placement import ROW_ID, SIDE_ID
from .screens import sampler_editor
from .sizes import HORIZONTAL_BREAKPOINTS, VERTICAL_BREAKPOINTS
from .state import RunState
from .theming import register_themes

QUIT_WAIT = 1.0  # seconds quitting waits for the run to end at a step boundary (so its record ends with `done`)


class TokentuiApp(App[int]):
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
        self.controller = DashboardController(config, self)
        self.user_theme_names: set[str] = set()
        self.painter = Painter(self)  # the frames: tui/painting.py
        self.panel_layout = PanelLayout(self)  # which panels show, and where: tui/panel_layout.py
        self._status_message_timer = None
        self._startup_notes: list[tuple[str, str]] = []
        self._quitting = False
        self.crash: BaseException | None = None  # an exception nobody handled (`_fatal_error`), and its log
        self.crash_log: Path | None = None
        themes = register_themes(self, config.theme, config.user_theme_dir)  # tui/theming.py
        self.user_theme_names.update(themes.user_names)
        self._startup_notes.extend((error, "error") for error in themes.errors)
        self._initial_theme = themes.initial

    # ---- what tests and dialogs read ---------------------------------------------------------------------
    @property
    def state(self) -> RunState:
        """What the panels show: the state of the run shown."""
        return self.controller.state

    @property
    def config(self) -> DashboardConfig:
        """What the dashboard was started with (another model chosen in it: the controller's new one)."""
        return self.controller.config

    @property
    def client(self):
        return self.controller.client

    @property
    def branch_tree(self):
        return self.controller.tree

    # ---- layout --------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        controller = self.controller
        yield PromptPanel(id="prompt")
        with Horizontal(id="middle"):
            yield OutputPanel(id="output")
            yield CandidatesPanel(id="candidates", previews=controller.previews)  # a step previewed: tui/preview.py
            yield ModelPanel(id="model")
            # the lens: off by default (l); it takes the model panel's place, or the candidates'
            yield LensPanel(id="lens", replaying=controller.replaying)
            yield AnatomyPanel(id=SIDE_ID)  # `a` on a smaller terminal: the same place (tui/placement.py)
        yield AnatomyPanel(id=ROW_ID)  # one pass, taken apart: a row of its own at ≥160×48 (on by default there)
        with Grid(id="bottom"):
            # the settings asked for are read from their owner (the controller's client), never copied
            yield SamplerPanel(id="sampler", asked=lambda: controller.sampler, replaying=controller.replaying,
                               previews=controller.previews)
            yield SpeedPanel(id="speed")
            yield KVPanel(id="kv")
            yield PendingPanel(id="pending")
        yield ReadingsStrip(id="readings")  # KV · ms/step · pending on one line when their panels are hidden
        yield StatusLine(id="status", replaying=controller.replaying)
        yield KeyBar(id="keys", replaying=controller.replaying)  # whole entries only; `? help` and `q quit` always

    def get_driver_class(self):
        """Textual's Linux driver, made to survive its terminal going away (see tui/driver.py)."""
        driver_class = super().get_driver_class()
        if driver_class.__name__ == "LinuxDriver":
            from .driver import TerminalDriver

            if issubclass(TerminalDriver, driver_class):
                return TerminalDriver
        return driver_class

    def get_system_commands(self, screen):
        """The palette's commands from Textual that the dashboard keeps (tui/commands.py)."""
        return system_commands(self, screen, super().get_system_commands(screen))

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(THEME_VARIABLE_DEFAULTS)

    def on_mount(self) -> None:
        self.theme = self._initial_theme
        self.theme_changed_signal.subscribe(self, lambda _theme: self.call_after_refresh(self.redraw))
        if self._startup_notes:  # one notice (a newer one replaces it: see notify)
            severities = [severity for _message, severity in self._startup_notes]
            worst = next((s for s in ("error", "warning") if s in severities), "information")
            self.notify("\n".join(message for message, _severity in self._startup_notes), severity=worst,
                        timeout=12, markup=False)
        self.query_one(StatusLine).max_new_tokens = self.config.options.max_new_tokens
        self.painter.paint_now()
        self._install_signal_handlers()
        self.start_load()

    def start_load(self) -> None:
        self.run_worker(self.controller.load(), exclusive=True, group="load", name="load", exit_on_error=False)

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
        self.panel_layout.apply()
        self.call_after_refresh(self.redraw)

    def anatomy_on(self, layout=None) -> bool:
        """Whether the one-pass panel is on (shown, or waiting behind the lens) at this layout."""
        return self.panel_layout.anatomy_on(layout)

    @property
    def anatomy_panel(self) -> AnatomyPanel | None:
        """The one-pass panel on screen (its row or its stand-in), None when neither is shown."""
        return self.panel_layout.anatomy_panel

    def on_unmount(self) -> None:
        """However the app ends, the controller is closed: the run in progress ends (its record with `done`), and
        so does the model process; the tree file is finished."""
        self.painter.stop()
        self.controller.close()

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

    # ---- the controller's View -----------------------------------------------------------------------------
    def repaint(self, now: bool = True) -> None:
        self.painter.repaint(now)

    @property
    def frame_due(self) -> bool:
        """A repaint is scheduled (the controller's throttled `repaint`): until it runs, the panels show the last
        frame's step, all of them together."""
        return self.painter.due

    def relayout(self) -> None:
        self.panel_layout.reset()
        self.panel_layout.apply()
        self.redraw()

    def clear_answer(self) -> None:
        self.query_one(OutputPanel).view.clear()

    def notify(self, message: str, *, title: str = "", severity: str = "information",  # type: ignore[override]
               timeout: float | None = None, markup: bool = False) -> None:
        """One notice on screen at a time, the newest (issue 40: stacked ones grew down over the live readings; the
        place they go, over the prompt panel, is app.tcss's)."""
        self.clear_notifications()
        if self.screen_stack:  # Textual removes the toasts but leaves their holders, a row each
            for holder in self.screen.query("ToastHolder"):
                holder.remove()
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def run_failed(self, title: str, message: str) -> None:
        dialogs.run_failed(self, title, message)

    def load_failed(self, message: str) -> None:
        dialogs.load_failed(self, message)

    # ---- painting (tui/painting.py) ----------------------------------------------------------------------
    def redraw(self) -> None:
        """Paint every panel again from the state, whether or not it changed since the last frame (what a change of
        theme or of layout, or a resize, needs)."""
        self.painter.paint_now(force=True)
        if not isinstance(self.screen, attention.AttentionScreen):  # the view covers the answer: nothing to refresh
            self.query_one(OutputPanel).view.refresh()

    def status_message(self, message: str, seconds: float = 6.0) -> None:
        """A transient message on the right of the status line."""
        status = self.query_one(StatusLine)
        status.message = message
        status.show(self.state)
        if self._status_message_timer is not None:
            self._status_message_timer.stop()

        def clear() -> None:
            status.message = None
            status.show(self.state)

        self._status_message_timer = self.set_timer(seconds, clear)

    # ---- keys: each one call to the controller (or a dialog that ends in one) ------------------------------
    def action_sampler(self, name: str, direction: int) -> None:
        """A sampler parameter's key (tui/keys.py, from core/samplers.py): one notch up or down."""
        self.controller.sampler_step(name, direction)

    def action_toggle_greedy(self) -> None:
        self.controller.toggle_greedy()

    def action_new_seed(self) -> None:
        self.controller.new_seed()

    def action_toggle_pause(self) -> None:
        self.controller.toggle_pause()

    def action_step(self) -> None:
        self.controller.step()

    def action_restart(self) -> None:
        if self.controller.restart():
            self.start_load()

    def action_cursor(self, delta: int) -> None:
        self.controller.move_cursor(delta)

    def action_cursor_first(self) -> None:
        self.controller.cursor_first()

    def action_cursor_live(self) -> None:
        self.controller.cursor_live()

    def on_output_view_token_clicked(self, message: OutputView.TokenClicked) -> None:
        """A click on a token of the answer views its step."""
        self.controller.cursor_go(message.index)

    def action_toggle_heat(self) -> None:
        self.controller.toggle_heat()

    def action_toggle_ids(self) -> None:
        self.controller.toggle_ids()

    def action_toggle_lens(self) -> None:
        self.controller.toggle_lens()

    def action_toggle_anatomy(self) -> None:
        self.panel_layout.toggle_anatomy()

    def action_toggle_attention(self) -> None:
        attention.toggle(self)

    def action_toggle_logits(self) -> None:
        self.controller.inside.toggle_logits()

    def action_preview_branch(self) -> None:
        self.controller.previews.branch()

    def action_sampler_editor(self) -> None:
        sampler_editor.open_editor(self)

    def action_edit_prompt(self) -> None:
        dialogs.edit_prompt(self)

    def action_follow_up(self) -> None:
        followup.open_editor(self)  # `u`: a follow-up turn (tui/followup.py)

    def action_help(self) -> None:
        dialogs.help(self)

    def action_export(self) -> None:
        dialogs.export(self)

    def action_branch(self) -> None:
        dialogs.branch(self)

    def action_branches(self) -> None:
        dialogs.runs(self)

    def action_fanout(self) -> None:
        self.controller.explore.fanout()

    # the View's side of tui/explore.py: the fan-out list and a scored text's summary (tui/dialogs.py opens them)
    def show_fanout(self, fanout) -> None:
        dialogs.show_fanout(self, fanout)

    def fanout_changed(self) -> None:
        dialogs.fanout_changed(self)

    def scored(self, summary) -> None:
        dialogs.scored(self, summary)

    def action_change_model(self) -> None:
        dialogs.change_model(self)

    @property
    def exit_code(self) -> int:
        return self.controller.exit_code

    def action_quit(self) -> None:  # type: ignore[override]
        """Stop the run, give it QUIT_WAIT seconds to end at its step boundary (its record then ends with the
        engine's own `done`; tui/program.py ends what is left), then leave."""
        if self._quitting:
            return
        self._quitting = True
        self.run_worker(self._quit(), group="quit", name="quit", exit_on_error=False)

    async def _quit(self) -> None:
        try:
            await self.controller.finish(QUIT_WAIT)
        finally:
            self.exit(return_code=self.exit_code)
