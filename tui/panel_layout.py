"""The dashboard's layout (tui/app.py's): which panels show, and where, as tui/sizes.py's table and
tui/placement.py's placement say for the terminal's size, the lens and the one-pass panel; laid out again when one
of those changes. Until a new layout is in place the answer waits (it is not wrapped at a passing width).
"""

from __future__ import annotations

from textual.css.query import NoMatches

from .panels import AnatomyPanel, OutputPanel, PromptPanel, ReadingsStrip
from .placement import ROW_ID, SIDE_ID, SidePlace, anatomy_default, place
from .served import server_of
from .sizes import READINGS_IDS, hidden_note, plan


class PanelLayout:
    """The app's layout (see the module docstring). `app`: the TokentuiApp whose panels it shows and hides (its
    controller holds the lens and one-pass toggles, its painter paints once a layout has settled)."""

    def __init__(self, app) -> None:
        self.app = app
        self._plan = None
        self.settling = True  # until the first layout plan is in place
        self._side = SidePlace()

    def anatomy_on(self, layout=None) -> bool:
        """Whether the one-pass panel is on (shown, or waiting behind the lens) at this layout."""
        app = self.app
        layout = layout or plan(*app.size)
        choice = app.controller.anatomy_choice
        return choice if choice is not None else anatomy_default(layout, server_of(app.state.facts) is not None)

    @property
    def anatomy_panel(self) -> AnatomyPanel | None:
        """The one-pass panel on screen (its row or its stand-in), None when neither is shown."""
        for widget_id in (ROW_ID, SIDE_ID):
            panel = self.app.query_one(f"#{widget_id}", AnatomyPanel)
            if panel.display:
                return panel
        return None

    def toggle_anatomy(self) -> None:
        """`a`: the one-pass panel on or off (on, but waiting behind the lens: brought forward)."""
        app = self.app
        layout = plan(*app.size)
        on = self.anatomy_on(layout)
        if on and self.anatomy_panel is None:  # on, but waiting behind the lens: bring it forward
            self._side.latest = "anatomy"
        else:
            app.controller.anatomy_choice = not on
            if not on:
                self._side.latest = "anatomy"
        app.relayout()

    def reset(self) -> None:
        """The next `apply` lays the panels out again, whether or not what decides it changed."""
        self._plan = None

    def apply(self) -> None:
        """Show and hide the panels as tui/sizes.py's table and tui/placement.py say for this size."""
        app = self.app
        width, height = app.size
        layout = plan(width, height)
        controller = app.controller
        key = (layout, controller.lens_on, self.anatomy_on(layout), self._side.latest)
        if key == self._plan:
            return
        self._plan = key
        self.settling = True  # the answer waits for the new layout (not wrapped at a passing width)

        def settled() -> None:
            self.settling = False
            app.painter.paint_now()

        app.call_after_refresh(settled)
        try:
            for widget_id in READINGS_IDS:
                app.query_one(f"#{widget_id}").display = layout.shows(widget_id)
            placed = place(layout, controller.lens_on, self.anatomy_on(layout), self._side)
            app.query_one("#model").display = placed.model
            app.query_one("#candidates").display = placed.candidates
            app.query_one("#lens").display = placed.lens
            app.query_one(f"#{ROW_ID}").display = placed.row
            app.query_one(f"#{SIDE_ID}").display = placed.side
            app.query_one("#bottom").set_class(placed.row, "-anatomy")  # the bottom row gives the row 3 lines
            strip = app.query_one(ReadingsStrip)
            strip.display = layout.readings_strip
            note = hidden_note(layout)  # said under the strip, or under the answer when there is no strip
            strip.set_note(note if layout.readings_strip else "")
            app.query_one(OutputPanel).set_note("" if layout.readings_strip else note)
            app.query_one("#bottom").set_class(layout.readings_strip, "-strip")
            app.query_one(PromptPanel).template_rows = layout.template_rows
            app.query_one(PromptPanel).prefill_shown = not layout.shows("speed")  # step 3 named somewhere
            # a served model's passes are the server's: nothing to time (the panel says so)
            controller.set_time_stages(placed.anatomy_shown and server_of(app.state.facts) is None)
        except NoMatches:  # not composed yet, or shutting down
            self._plan = None
