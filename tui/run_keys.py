"""The keys that steer the run in view, as the dashboard's controller's methods (tui/controller.py's
DashboardController inherits them; plain Python, no Textual): the sampler's settings asked for (each a
SamplerSettings checked once, their owner the engine client), pause and step (and a dialog's own pause), and the
time-travel cursor over the steps.
"""

from __future__ import annotations

import random
from typing import Callable

from tokentui.core.errors import SettingsError
from tokentui.core.link.client import EngineClient
from tokentui.core.samplers import param
from tokentui.core.settings import SamplerSettings

from .state import RunState
from .view import View


class RunKeys:
    """The sampler, pause / step and time-travel keys (see the module docstring); what they use of the controller
    is named here."""

    view: View
    client: EngineClient
    dialog_paused: bool
    _last_temperature: float | None
    replaying: bool
    # the controller's properties
    replayed_record: str  # tui/branching.py's
    state: RunState
    sampler: SamplerSettings

    # ---- the sampler ---------------------------------------------------------------------------------------
    def change_sampler(self, **changes) -> bool:
        """The settings asked for, changed (built and checked once: a SamplerSettings); the engine uses them from
        its next step. A value out of range or a replay (whose settings are the record's) is refused in one line.
        True when the settings changed."""
        if self.replaying:
            self.view.notify(f"A replay plays the recorded settings (previewing others needs the model): run "
                             f"`tokentui branch {self.replayed_record} --at N --token ID` to try others",
                             severity="warning", timeout=6)
            return False
        try:
            new = self.client.sampler.with_changes(**changes)
            before = self.client.sampler
            self.client.set_sampler(new)
        except SettingsError as err:
            self.view.notify(str(err), severity="error")
            return False
        self.view.repaint()
        return new != before

    def sampler_step(self, name: str, direction: int) -> None:
        """A sampler key: the parameter `name` (core/samplers.py) one notch up (+1) or down (-1), by its own
        `nudge`; at its end nothing changes."""
        value = getattr(self.sampler, name)
        new = param(name).nudge(value, direction)
        if new != value:
            self.change_sampler(**{name: new})

    def temperature(self, direction: int) -> None:
        self.sampler_step("temperature", direction)

    def toggle_greedy(self) -> None:
        s = self.sampler
        if s.is_greedy:
            changes: dict = {"greedy": False}
            if s.temperature == 0:
                changes["temperature"] = self._last_temperature or 0.7
            self.change_sampler(**changes)
        else:
            if self.change_sampler(greedy=True):
                self._last_temperature = s.temperature

    def new_seed(self, draw: Callable[[], int] = lambda: random.randrange(0, 2**31 - 1)) -> None:
        seed = self.sampler.seed
        new = seed
        while new == seed:
            new = draw()
        self.change_sampler(seed=new)

    # ---- pause / step --------------------------------------------------------------------------------------
    def _running(self) -> bool:
        if self.client.loaded and self.state.running:
            return True
        hint = "r restarts" if self.client.loaded else "the model is not loaded yet"
        self.view.notify(f"Nothing is generating — {hint}", severity="warning", timeout=4)
        return False

    def toggle_pause(self) -> None:
        if not self.client.loaded and self.state.phase == "loading":
            self.pause_armed = not self.pause_armed
            self.view.notify("Pausing at the first token once the model is loaded" if self.pause_armed
                             else "Will not pause at the first token", timeout=4)
            self.view.repaint()
            return
        if not self._running():
            return
        if self.client.paused:
            self.client.resume()
        else:
            self.client.pause()
        self.view.repaint()

    def step(self) -> None:
        if not self._running():
            return
        if not self.client.paused:
            self.client.pause()
            self.view.notify("Paused — n (or →) lets one token through, space resumes", timeout=4)
            self.view.repaint()
            return
        self.client.step_once()

    def pause_for_dialog(self) -> bool:
        """Dialogs cover the panels, so a run must not go on unseen behind them: pause it while one is open (it
        resumes when the dialog closes, unless it was paused already). True when this paused it."""
        if self.client.loaded and self.state.running and not self.client.paused:
            self.client.pause()
            self.dialog_paused = True
            self.view.repaint()
            return True
        return False

    def resume_after_dialog(self) -> None:
        if self.dialog_paused:
            self.dialog_paused = False
            if self.client.loaded and self.client.paused:
                self.client.resume()
            self.view.repaint()

    # ---- time travel ---------------------------------------------------------------------------------------
    def move_cursor(self, delta: int) -> None:
        """[ ] one step back / forward, { } ten; forward onto the newest step rejoins live."""
        state = self.state
        changed = state.cursor_move(delta)
        if delta > 0 and state.cursor is not None and state.cursor_at_newest:
            changed = state.cursor_live() or changed
        if changed:
            self.view.repaint()

    def cursor_first(self) -> None:
        if self.state.cursor_first():
            self.view.repaint()

    def cursor_live(self) -> None:
        if self.state.cursor_live():
            self.view.repaint()

    def cursor_go(self, position: int) -> None:
        if self.state.cursor_go(position):
            self.view.repaint()
