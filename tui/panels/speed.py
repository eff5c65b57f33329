"""Steps 3 and 5 timed: prefill (one number) and a live plot of decode latency per step."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.color import Color
from textual.containers import Vertical
from textual.widget import Widget
from textual_plotext import PlotextPlot

from ..format import ms
from .base import component_style, forget_styles

PLOT_INTERVAL = 0.25  # at most 4 plot redraws a second


class SpeedStats(Widget):
    DEFAULT_CSS = "SpeedStats { height: 3; background: $surface; }"

    text: Text | None = None

    def render(self):
        return self.text if self.text is not None else ""


class LatencyPlot(PlotextPlot):
    DEFAULT_CSS = """
    LatencyPlot { height: 1fr; min-height: 4; background: $surface; }
    """

    colour: tuple[int, int, int] | None = None  # the line colour of the last drawing (the theme's)

    def draw(self, points, colour: tuple[int, int, int]) -> None:
        self.colour = colour
        plt = self.plt
        plt.clear_data()
        plt.xticks([])
        if points:
            xs = [p[0] for p in points]
            ys = [p[1] for p in points]
            plt.plot(xs, ys, marker="braille", color=colour)
            top = max(ys)
            plt.ylim(0, top * 1.15 if top > 0 else 1)
            plt.xlim(xs[0], max(xs[-1], xs[0] + 1))
            plt.xticks([xs[0], xs[-1]], [str(xs[0]), str(xs[-1])])
        plt.yfrequency(3)
        plt.frame(False)
        self.refresh()


class SpeedPanel(Vertical):
    COMPONENT_CLASSES = {"speed--label", "speed--value", "speed--muted", "speed--line"}

    DEFAULT_CSS = """
    SpeedPanel {
        border: round $panel-border;
        border-title-color: $primary;
        border-title-style: bold;
        border-subtitle-color: $text-muted;
        background: $surface;
        padding: 0 1;
        & > .speed--label { color: $text-muted; }
        & > .speed--value { color: $accent; text-style: bold; }
        & > .speed--muted { color: $text-muted; }
        & > .speed--line { color: $primary; }
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = "3 prefill · 5 decode · speed"
        self.stats = SpeedStats(id="speed-stats")
        self.plot = LatencyPlot(id="speed-plot")
        self._state = None
        self._plotted_at = 0.0
        self._plot_timer = None
        self.last_text = None

    def compose(self) -> ComposeResult:
        yield self.stats
        yield self.plot

    def notify_style_update(self) -> None:
        super().notify_style_update()
        forget_styles(self)

    def show(self, state, force: bool = False) -> None:
        self._state = state
        if not self.display:  # hidden on small terminals: nothing to draw (a resize rebuilds with force)
            return
        text = self._stats(state)
        if force or text != self.last_text:
            self.last_text = text
            self.stats.text = text
            self.stats.refresh()
        self._maybe_plot(force)

    def rebuild(self) -> None:
        if self._state is not None:
            self.show(self._state, force=True)

    def _maybe_plot(self, force: bool) -> None:
        now = time.monotonic()
        if force or now - self._plotted_at >= PLOT_INTERVAL:
            self._draw_plot()
        elif self._plot_timer is None:
            self._plot_timer = self.set_timer(PLOT_INTERVAL - (now - self._plotted_at), self._draw_plot)

    def _draw_plot(self) -> None:
        self._plot_timer = None
        self._plotted_at = time.monotonic()
        if self._state is None:
            return
        line = component_style(self, "speed--line")
        colour = line.color.get_truecolor() if line.color is not None else None
        rgb = (colour.red, colour.green, colour.blue) if colour else Color.parse("#5fb3f0").rgb
        self.plot.draw(list(self._state.plot_points), rgb)

    def _stats(self, state) -> Text:
        s = lambda name: component_style(self, f"speed--{name}")  # noqa: E731
        narrow = (self.stats.size.width or 40) < 36  # e.g. 120 columns
        out = Text()
        stats = state.latency_stats()

        def num(value, fmt="{:.1f}") -> None:
            out.append(fmt.format(value) if value is not None else "—", s("value"))

        out.append("prefill ", s("label"))
        prefill = state.prefill.ms if state.prefill is not None else None
        if narrow:
            num(prefill, "{:,.0f}")
            out.append(" · TTFT ", s("label"))
            num(state.ttft_ms, "{:,.0f}")
            out.append(" ms", s("muted"))
        else:
            out.append(ms(prefill) if prefill is not None else "—", s("value"))
            if state.prefill is not None:
                out.append(f" ({state.prefill.tokens:,} tok)", s("muted"))
            out.append(" · TTFT ", s("label"))
            out.append(ms(state.ttft_ms) if state.ttft_ms is not None else "—", s("value"))
        out.append("\nlast ", s("label"))
        num(stats["last"])
        out.append(" · mean ", s("label"))
        num(stats["mean"])
        if narrow:
            out.append(" ms\np95 ", s("label"))
            num(stats["p95"])
            out.append(" ms · ", s("muted"))
            num(stats["tok_s"])
            out.append(" tok/s", s("muted"))
        else:
            out.append(" · p95 ", s("label"))
            num(stats["p95"])
            out.append(" ms", s("muted"))
            out.append("\ndecode ", s("label"))
            num(stats["tok_s"])
            out.append(" tokens/s", s("muted"))
        self.border_subtitle = "ms per decode step"
        return out
