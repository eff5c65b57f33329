"""Time travel: the keys and the mouse that move the cursor over the run's steps (issue 13). A mixin of
`TokentuiApp` (tui/app.py).

The cursor lives in `RunState` (tui/state.py: `cursor`; tui/state_readings.py: `view_step`, the readings as of the
viewed step); these actions only move it and repaint at once. Every panel reads the viewed step, so a held cursor shows that step as it
was (candidates, settings in force, latency, KV size, pending bytes, the token marked in the answer) while the run
goes on underneath; the status line says so and names `esc`, which goes back to live.
"""

from __future__ import annotations

from .panels.output import OutputView


class TravelMixin:
    def _cursor_moved(self, changed: bool) -> None:
        if changed:
            self._repaint_now()

    def action_cursor(self, delta: int) -> None:
        """[ ] one step back / forward, { } ten (clamped at the first and the newest step)."""
        self._cursor_moved(self.state.cursor_move(delta))

    def action_cursor_first(self) -> None:
        self._cursor_moved(self.state.cursor_first())

    def action_cursor_live(self) -> None:
        self._cursor_moved(self.state.cursor_live())

    def on_output_view_token_clicked(self, message: OutputView.TokenClicked) -> None:
        """A click on a token of the answer views its step."""
        self._cursor_moved(self.state.cursor_go(message.index))
