"""The one-pass panel (issue 16) as the dashboard's key and layout: `a` shows or hides it at any size. A mixin of
`TokentuiApp` (tui/app.py), which calls `_place_anatomy` from its layout pass and `_paint_anatomy` when it paints.

Where it stands (tui/sizes.py decides the default):
- at ≥160×48 it is on by default, in a row of its own under the answer, candidates and model panels (`#anatomy`);
  the bottom row of four gives up 3 rows for it;
- on a smaller terminal `a` shows it (`#anatomy-side`) in the model panel's place, or the candidates' where there
  is no model panel — the place the logit lens (`l`) takes. When both want that place, the one turned on last is
  shown and the other waits behind it (`a` on a waiting panel brings it forward).

While it is shown the engine times the stages exactly (`RunOptions.time_stages`: on CUDA a sync per step, free on
the CPU); when it is hidden the option is off again. Following a live run it repaints at most 5 times a second
(numbers that change 30 times a second cannot be read, and the dashboard shares the CPU with the model); a step
held by the cursor, a forced repaint and the end of a run paint at once.
"""

from __future__ import annotations

import time
from dataclasses import replace

from textual.css.query import NoMatches

from tokentui.core.errors import SettingsError

from .sizes import plan
from .served import server_of
from .panels.anatomy import AnatomyPanel

ROW_ID = "anatomy"  # its own row (the id in tui/sizes.py's table)
SIDE_ID = "anatomy-side"  # standing in the model panel's (or the candidates') place
LIVE_INTERVAL = 0.2  # seconds between repaints while it follows a live run


class AnatomyMixin:
    anatomy_choice: bool | None = None  # None: as tui/sizes.py says for this size; True / False: what `a` chose
    _side_latest = "anatomy"  # which of the one-pass panel and the lens the shared place shows when both are on
    _lens_seen = False
    _anatomy_painted = 0.0  # when it last painted (time.monotonic)
    _anatomy_timer = None  # a repaint due when the live interval is up

    def anatomy_on(self, layout=None) -> bool:
        """Whether the one-pass panel is on (shown, or waiting behind the lens) at this layout."""
        layout = layout or plan(*self.size)
        if self.anatomy_choice is not None:
            return self.anatomy_choice
        # a served model: off unless asked for (`a`), where it would only say it is not available for one
        return layout.shows(ROW_ID) and server_of(self.state.facts) is None

    @property
    def anatomy_panel(self) -> AnatomyPanel | None:
        """The one-pass panel on screen (its row or its stand-in), None when neither is shown."""
        for widget_id in (ROW_ID, SIDE_ID):
            panel = self.query_one(f"#{widget_id}", AnatomyPanel)
            if panel.display:
                return panel
        return None

    # ---- a: on / off ---------------------------------------------------------------------------------------
    def action_toggle_anatomy(self) -> None:
        layout = plan(*self.size)
        on = self.anatomy_on(layout)
        if on and self.anatomy_panel is None:  # on, but waiting behind the lens: bring it forward
            self._side_latest = "anatomy"
        else:
            self.anatomy_choice = not on
            if self.anatomy_choice:
                self._side_latest = "anatomy"
        self._layout_plan = None  # it takes a row, or a panel's place: lay out again
        self._apply_layout()
        self._rebuild_all()

    # ---- layout and paint (called by the app) ----------------------------------------------------------------
    def _place_anatomy(self, layout) -> None:
        """Show the row or the stand-in (or neither) for this layout; hide what the stand-in replaces; keep the
        engine's stage timing on exactly while the panel is shown."""
        on = self.anatomy_on(layout)
        row = on and layout.shows(ROW_ID)
        side = on and not row
        lens = self.lens_on
        if lens and not self._lens_seen:
            self._side_latest = "lens"  # the lens was just turned on: it takes the place
        self._lens_seen = lens
        if side and lens:  # both want the same place: the one turned on last has it
            if self._side_latest == "lens":
                side = False
            else:
                self.query_one("#lens").display = False  # the place it took stays the one-pass panel's
        if side:
            self.query_one("#model" if layout.shows("model") else "#candidates").display = False
        self.query_one(f"#{ROW_ID}").display = row
        self.query_one(f"#{SIDE_ID}").display = side
        self.query_one("#bottom").set_class(row, "-anatomy")  # the bottom row gives the row 3 of its lines
        # a served model's passes are the server's: nothing to time (the panel says so)
        self._time_stages((row or side) and server_of(self.state.facts) is None)

    def _time_stages(self, on: bool) -> None:
        options = self.client.options
        if options.time_stages == on:
            return
        try:
            self.client.set_options(replace(options, time_stages=on))
        except SettingsError as err:
            self.notify(str(err), severity="error", markup=False)

    def _paint_anatomy(self, state, force: bool) -> None:
        panel = self.anatomy_panel
        if panel is None:
            return
        wait = LIVE_INTERVAL - (time.monotonic() - self._anatomy_painted)
        if not force and state.live and state.running and wait > 0:
            if self._anatomy_timer is None:  # the newest step is painted when the interval is up
                self._anatomy_timer = self.set_timer(wait, self._anatomy_catch_up)
            return
        self._anatomy_painted = time.monotonic()
        panel.show(state, force)

    def _anatomy_catch_up(self) -> None:
        self._anatomy_timer = None
        try:
            self._paint_anatomy(self.state, False)
        except NoMatches:  # shutting down
            pass
