"""The dashboard's key actions: the sampler knobs, pause / step / restart / edit, the view toggles, help and
export. A mixin of `TokentuiApp` (tui/app.py), which owns the state these read and change."""

from __future__ import annotations

import random
from pathlib import Path

from tokentui.core.errors import SettingsError

from .export import export_answer
from .format import short_path
from .keys import next_top_k
from .panels import OutputPanel, SamplerPanel, StatusLine
from .screens import HelpScreen, PromptEditor
from .screens.exported import ExportedDialog


class ActionsMixin:
    # ---- actions: sampler ----------------------------------------------------------------------------------
    def _change_sampler(self, **changes) -> None:
        try:
            self.client.set_sampler(self.client.sampler.with_changes(**changes))  # its one owner
        except SettingsError as err:
            self.notify(str(err), severity="error", markup=False)
            return
        self.query_one(SamplerPanel).show(self.state)  # it reads the settings from the client

    def action_temperature(self, direction: int) -> None:
        t = self.sampler_settings.temperature
        new = round(max(0.0, t + 0.1 * direction), 2)
        if new != t:
            self._change_sampler(temperature=new)

    def action_top_p(self, direction: int) -> None:
        p = self.sampler_settings.top_p
        new = round(min(1.0, max(0.05, p + 0.05 * direction)), 2)
        if new != p:
            self._change_sampler(top_p=new)

    def action_top_k(self, direction: int) -> None:
        k = self.sampler_settings.top_k
        new = next_top_k(k, direction)
        if new != k:
            self._change_sampler(top_k=new)

    def action_toggle_greedy(self) -> None:
        s = self.sampler_settings
        if s.is_greedy:
            changes: dict = {"greedy": False}
            if s.temperature == 0:
                changes["temperature"] = self._last_temperature or 0.7
            self._change_sampler(**changes)
        else:
            self._last_temperature = s.temperature
            self._change_sampler(greedy=True)

    _last_temperature: float | None = None

    def action_new_seed(self) -> None:
        seed = self.sampler_settings.seed
        new = seed
        while new == seed:
            new = random.randrange(0, 2**31 - 1)
        self._change_sampler(seed=new)

    # ---- actions: run control ------------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        """The engine's own flag: pausing takes effect at the next step boundary."""
        return self.client.loaded and self.client.paused

    def _require_running(self, what: str) -> bool:
        if self.client.loaded and self.state.running:
            return True
        hint = "r restarts" if self.client.loaded else "the model is not loaded yet"
        self.notify(f"Nothing is generating — {hint}", severity="warning", timeout=4, markup=False)
        return False

    def action_toggle_pause(self) -> None:
        if not self.client.loaded and self.state.phase == "loading":
            self.pause_armed = not self.pause_armed
            self.notify("Pausing at the first token once the model is loaded" if self.pause_armed
                        else "Will not pause at the first token", timeout=4, markup=False)
            self._repaint_now()
            return
        if not self._require_running("pause"):
            return
        client = self.client
        if client.paused:
            client.resume()
        else:
            client.pause()
        self._repaint_now()

    def action_step(self) -> None:
        if not self._require_running("step"):
            return
        if not self.client.paused:
            self.client.pause()
            self.notify("Paused — n (or →) lets one token through, space resumes", timeout=4, markup=False)
            self._repaint_now()
            return
        self.client.step_once()

    def action_restart(self) -> None:
        if not self.client.loaded:
            if self.state.phase == "load-failed":
                self._start_load()
            return
        self._start_run()

    def _pause_for_dialog(self) -> bool:
        """Dialogs cover the panels, so a run must not go on unseen behind them: pause it while one is open (it
        resumes when the dialog closes, unless it was paused already). True when this paused it."""
        if self.client.loaded and self.state.running and not self.client.paused:
            self.client.pause()
            self._dialog_paused = True
            self._repaint_now()
            return True
        return False

    def _resume_after_dialog(self) -> None:
        if self._dialog_paused:
            self._dialog_paused = False
            if self.client.loaded and self.client.paused:
                self.client.resume()
            self._repaint_now()

    def action_edit_prompt(self) -> None:
        if isinstance(self.screen, PromptEditor):
            return
        paused = self._pause_for_dialog()

        def done(result) -> None:
            if result is None:
                self._resume_after_dialog()
                return
            self._dialog_paused = False  # the new run replaces the paused one (_start_run resumes the engine)
            self.prompt, self.system = result
            if self.client.loaded:
                self._start_run()
            else:
                self.notify("The new prompt runs once the model is loaded", timeout=4, markup=False)

        prompt_event = self.state.prompt
        self.push_screen(PromptEditor(self.prompt, self.system, cursor_blink=self.CURSOR_BLINK,
                                      default_system=prompt_event.default_system_prompt if prompt_event else None,
                                      default_known=prompt_event is not None, run_paused=paused), done)

    # ---- actions: view -------------------------------------------------------------------------------------
    def action_toggle_heat(self) -> None:
        self.heat = not self.heat
        self.query_one(OutputPanel).set_heat(self.heat)

    def action_toggle_ids(self) -> None:
        self.show_ids = not self.show_ids
        self._repaint_now()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            paused = self._pause_for_dialog()
            self.push_screen(HelpScreen(run_paused=paused), lambda _result: self._resume_after_dialog())

    def action_export(self) -> None:
        state = self.state
        if not state.tokens and state.done is None:
            self.notify("Nothing to export yet", severity="warning", timeout=4, markup=False)
            return
        record = state.record_path
        try:
            path = export_answer(state.answer_text, record)  # tui/export.py
        except OSError as err:
            self.notify(f"Export failed: {err}", severity="error", markup=False)
            return
        self.last_export = path
        # the full paths in a dialog of their own, one per line, never wrapped (a toast broke them mid-name)
        if isinstance(self.screen, ExportedDialog):
            self.pop_screen()
        self.push_screen(ExportedDialog(path, record, running=state.running))
        self._status_message(f"exported {short_path(path)}")

    last_export: Path | None = None

    def _status_message(self, message: str, seconds: float = 6.0) -> None:
        status = self.query_one(StatusLine)
        status.message = message
        status.show(self.state)
        if self._status_message_timer is not None:
            self._status_message_timer.stop()

        def clear() -> None:
            status.message = None
            status.show(self.state)

        self._status_message_timer = self.set_timer(seconds, clear)
