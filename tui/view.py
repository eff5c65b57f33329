"""What the dashboard's controller (tui/controller.py) and its explore actions (tui/explore.py) ask of the screen:
the app (tui/app.py) is this View; the tests pass a recorder instead."""

from __future__ import annotations

from typing import Protocol


class View(Protocol):
    """What the controller asks of the screen."""

    def repaint(self, now: bool = True) -> None:
        """Paint the panels from the state (now=False: a new step, painted at most ~30 times a second)."""

    def relayout(self) -> None:
        """Which panels show changed (the lens, the one-pass panel, a served model's facts): lay out again."""

    def clear_answer(self) -> None:
        """Another run is shown (or a new one began): the answer panel is drawn again from its start."""

    def notify(self, message: str, severity: str = "information", timeout: float = 5.0) -> None:
        """A toast (one line, markup off)."""

    def run_failed(self, title: str, message: str) -> None:
        """A run ended with an error: the error dialog (retry, edit the prompt, close, quit)."""

    def load_failed(self, message: str) -> None:
        """The model could not be loaded: the load error dialog (retry, another model, quit)."""

    def show_fanout(self, fanout) -> None:
        """A fan-out began (tui/explore.py's FanoutState): show its list."""

    def fanout_changed(self) -> None:
        """The fan-out shown got a sample, or ended: paint its list again."""

    def scored(self, summary) -> None:
        """A scored text's summary came (its ScoreSummary event): show it."""
