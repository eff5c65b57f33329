"""Shared bits of the panels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.style import Style
from textual.widgets import Static

if TYPE_CHECKING:
    from ..state import RunState


class Panel(Static):
    """A bordered panel whose content is rebuilt from `RunState` by `show(state)`.

    `show` is called by the app's throttled flush; `STEP` is the article's step number(s) in the border title.
    """

    DEFAULT_CSS = """
    Panel {
        border: round $primary 40%;
        border-title-color: $primary;
        border-title-style: bold;
        border-subtitle-color: $text-muted;
        background: $surface;
        padding: 0 1;
        height: auto;
    }
    """

    TITLE = ""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.border_title = self.TITLE
        self._state: "RunState | None" = None

    def show(self, state: "RunState") -> None:
        self._state = state
        self.update(self.build(state))

    def rebuild(self) -> None:
        """Render again from the last state (theme changed, resized, toggled)."""
        if self._state is not None:
            self.update(self.build(self._state))

    def build(self, state: "RunState"):  # pragma: no cover - abstract
        raise NotImplementedError

    def on_resize(self) -> None:
        self.rebuild()

    def style_of(self, component: str) -> Style:
        return component_style(self, component)


def component_style(widget, component: str) -> Style:
    """Only what the component's CSS sets (colour, background, text style), with alpha colours blended over
    the widget's background, so spans can be layered (a bar on the chosen row keeps the row's background)."""
    try:
        full = widget.get_component_rich_style(component)
        partial = widget.get_component_rich_style(component, partial=True)
    except Exception:  # not mounted yet
        return Style()
    return Style(
        color=full.color if partial.color is not None else None,
        bgcolor=full.bgcolor if partial.bgcolor is not None else None,
    ) + partial.without_color
