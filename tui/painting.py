"""Painting the dashboard (tui/app.py's): one frame paints every panel from the state of the run shown, so that
every panel shows the same step, at most ~30 frames a second however fast the model is (a step's repaint waits for
the next frame; anything else paints at once). The attention view, when open, covers the panels and is painted
instead (tui/panels/attention.py).
"""

from __future__ import annotations

import time

from textual.css.query import NoMatches

from .panels import (
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

FLUSH_INTERVAL = 1 / 30  # at most ~30 frames a second however fast the model is; each frame paints every panel


class Painter:
    """The app's frames (see the module docstring). `app`: the TokentuiApp whose panels it paints (its controller,
    its state, its panel layout)."""

    def __init__(self, app) -> None:
        self.app = app
        self._flush_timer = None
        self._last_flush = 0.0
        self._prompt_key = None

    def repaint(self, now: bool = True) -> None:
        """The controller's View `repaint`: at once (`now`), or in the next frame."""
        if now:
            self.paint_now()
            return
        if self._flush_timer is not None:
            return
        delay = FLUSH_INTERVAL - (time.monotonic() - self._last_flush)
        if delay <= 0:
            self.paint_now()
        else:
            self._flush_timer = self.app.set_timer(delay, self.paint_now)

    @property
    def due(self) -> bool:
        """A repaint is scheduled: until it runs, the panels show the last frame's step, all of them together."""
        return self._flush_timer is not None

    def stop(self) -> None:
        """The app ends: no frame is painted after it."""
        if self._flush_timer is not None:
            self._flush_timer.stop()

    def paint_now(self, force: bool = False) -> None:
        """A frame now (`force`: every panel painted again, changed or not)."""
        if self._flush_timer is not None:
            self._flush_timer.stop()
            self._flush_timer = None
        self._last_flush = time.monotonic()
        try:
            if attention.paint(self.app, force):  # the attention view covers the panels (tui/panels/attention.py)
                return
            self._paint(force)
        except NoMatches:  # shutting down: the panels are gone
            pass

    def _paint(self, force: bool) -> None:
        app = self.app
        state = app.state
        controller = app.controller
        app.panel_layout.apply()
        prompt_panel = app.query_one(PromptPanel)
        prompt_panel.show_ids = controller.show_ids
        prompt_panel.follow_up_hint = not controller.replaying  # `u` named on the panel once an answer ends
        key = (id(state.prompt), state.phase == "loading", controller.show_ids, prompt_panel.template_rows,
               id(state.prefill), prompt_panel.prefill_shown, state.running)
        if force or key != self._prompt_key:
            self._prompt_key = key
            prompt_panel.show(state, force)
        output = app.query_one(OutputPanel)
        if output.heat != controller.heat:
            output.set_heat(controller.heat)
        if not app.panel_layout.settling:
            output.sync(state)
        controller.previews.sync()  # the step in view asked for again when it or the settings changed
        candidates = app.query_one(CandidatesPanel)
        candidates.raw_logits = controller.inside.raw_logits  # `L`: the raw column as logits
        candidates.show(state, force)
        if controller.lens_on:
            app.query_one(LensPanel).show(state, force)
        self._paint_anatomy(state, force)
        app.query_one(SamplerPanel).show(state, force)
        app.query_one(ModelPanel).show(state, force)
        app.query_one(KVPanel).show(state, force)
        app.query_one(PendingPanel).show(state, force)
        done = state.phase in ("done", "error", "load-failed")
        app.query_one(SpeedPanel).show(state, force=force or done)
        app.query_one(ReadingsStrip).show(state, force)
        status = app.query_one(StatusLine)
        status.paused = controller.paused
        status.show(state)

    def _paint_anatomy(self, state, force: bool) -> None:
        """The one-pass panel, painted in the same frame as the others: every panel shows the same step."""
        panel = self.app.panel_layout.anatomy_panel
        if panel is not None:
            panel.show(state, force)
