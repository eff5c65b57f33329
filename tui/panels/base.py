"""Shared bits of the panels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.style import Style
from textual.binding import Binding
from textual.widget import Widget

if TYPE_CHECKING:
    from ..state import RunState


# The keys of a scrolling panel: vertical scrolling only, since `right` belongs to the app (one step while paused)
# and the other letters are the app's too. Shared by the answer view and the prompt panel.
SCROLL_BINDINGS = [
    Binding("up", "scroll_up", "Scroll Up", show=False),
    Binding("down", "scroll_down", "Scroll Down", show=False),
    Binding("home", "scroll_home", "Scroll Home", show=False),
    Binding("end", "scroll_end", "Scroll End", show=False),
    Binding("pageup", "page_up", "Page Up", show=False),
    Binding("pagedown", "page_down", "Page Down", show=False),
]


# Every panel's frame: the rounded border with its title and subtitle, on the surface colour. Widgets that cannot be
# a `Panel` (a scroll view, a container) put the same lines at the top of their own rule.
FRAME_CSS = """
        border: round $panel-border;
        border-title-color: $primary;
        border-title-style: bold;
        border-subtitle-color: $text-muted;
        background: $surface;"""


class Panel(Widget):
    """A bordered panel whose content is rebuilt from `RunState` by `show(state)`.

    `show` is called by the app's throttled flush. A panel of fixed size repaints without a layout pass (a
    `Static.update` would re-lay-out the whole screen on every step); `AUTO_HEIGHT` panels ask for layout.
    """

    DEFAULT_CSS = """
    Panel {
        """ + FRAME_CSS + """
        padding: 0 1;
        height: auto;
    }
    """

    TITLE = ""
    AUTO_HEIGHT = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.border_title = self.TITLE
        self._state: "RunState | None" = None
        self.last_text = None  # what the panel shows now (tests read its .plain)

    def show(self, state: "RunState", force: bool = False) -> None:
        self._state = state
        text = self.build(state)
        if text == self.last_text and not force:
            return  # nothing new: no repaint
        self.last_text = text
        self.refresh(layout=self.AUTO_HEIGHT)

    def render(self):
        return self.last_text if self.last_text is not None else ""

    def rebuild(self) -> None:
        """Render again from the last state (theme changed, resized, toggled)."""
        if self._state is not None:
            self.show(self._state, force=True)

    def build(self, state: "RunState"):  # pragma: no cover - abstract
        raise NotImplementedError

    def on_resize(self) -> None:
        self.rebuild()

    def style_of(self, component: str) -> Style:
        return component_style(self, component)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        forget_styles(self)


def forget_styles(widget) -> None:
    widget.__dict__.pop("_tokentui_styles", None)


def component_style(widget, component: str) -> Style:
    """Only what the component's CSS sets (colour, background, text style), with alpha colours blended over
    the widget's background, so spans can be layered (a bar on the chosen row keeps the row's background).

    Cached per widget until its styles change (call `forget_styles` from `notify_style_update`)."""
    cache = widget.__dict__.setdefault("_tokentui_styles", {})
    style = cache.get(component)
    if style is not None:
        return style
    try:
        full = widget.get_component_rich_style(component)
        partial = widget.get_component_rich_style(component, partial=True)
    except Exception:  # not mounted yet: do not cache
        return Style()
    style = Style(
        color=full.color if partial.color is not None else None,
        bgcolor=full.bgcolor if partial.bgcolor is not None else None,
    ) + partial.without_color
    cache[component] = style
    return style
