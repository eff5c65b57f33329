"""Steps 3 and 5 timed: prefill (one number) and a live plot of decode latency per step."""

from __future__ import annotations

import math

from rich.text import Text
from textual.app import ComposeResult
from textual.color import Color
from textual.containers import Vertical
from textual.widget import Widget
from textual_plotext import PlotextPlot

from ..format import ms
from ..served import CLIENT_MEASURED, reissue_forms, server_of
from .base import FRAME_CSS, component_style, forget_styles

REISSUE_FLAG = "▼"  # over a step that began a request re-issued from the prefix (a served model)


class SpeedStats(Widget):
    DEFAULT_CSS = "SpeedStats { height: 3; background: $surface; text-wrap: nowrap; text-overflow: ellipsis; }"

    text: Text | None = None

    def render(self):
        return self.text if self.text is not None else ""


LABEL_WIDTH = 5  # y-axis labels, right-aligned: the plot never shifts sideways as latencies change
AXIS_WIDTH = 1  # the y axis line plotext draws right of the labels


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k at or above `value` (a y-axis top that halves
    into a round middle tick)."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for base in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        top = base * 10.0 ** exp
        if top >= value * (1 - 1e-9):
            return top
    return 10.0 ** (exp + 1)  # pragma: no cover


def tick_label(value: float) -> str:
    """A y tick in ms, always LABEL_WIDTH cells: '    0', ' 0.75', ' 12.5', '1,250', '12.5k', ' 125k'."""
    if value >= 10_000:
        text = f"{value / 1000:.1f}".rstrip("0").rstrip(".") + "k"
        if len(text) > LABEL_WIDTH:
            text = f"{value / 1000:.0f}k"
    elif value < 10:
        text = f"{value:.3g}"
    elif value != int(value):
        text = f"{value:.1f}"
    else:
        text = f"{value:,.0f}"
    return text.rjust(LABEL_WIDTH)[-LABEL_WIDTH:]


def y_ticks(points) -> tuple[float, list[float], list[str]]:
    """(top, tick values, labels): 0, half and the top, the top a nice number a little above the window's max."""
    peak = max((p[1] for p in points), default=0.0)
    top = nice_ceiling(peak * 1.1) if peak > 0 else 1.0
    ticks = [0.0, top / 2, top]
    return top, ticks, [tick_label(t) for t in ticks]


class LatencyPlot(PlotextPlot):
    """Decode latency per step: the last steps that fit the width (one per cell), y in ms from 0."""

    DEFAULT_CSS = """
    LatencyPlot { height: 1fr; min-height: 4; background: $surface; }
    """

    colour: tuple[int, int, int] | None = None  # the line colour of the last drawing (the theme's)
    window: list = []  # the (step, ms) points of the last drawing
    labels: list[str] = []  # the y labels of the last drawing

    @property
    def capacity(self) -> int:
        """How many steps fit: one per cell right of the labels and the axis."""
        return max(2, (self.size.width or 40) - LABEL_WIDTH - AXIS_WIDTH - 1)

    mark: int | None = None  # the step marked (the time-travel cursor's), if it is in the window
    flags: list = []  # the steps flagged at the top of the last drawing (a served model's re-issued requests)

    def draw(self, points, colour: tuple[int, int, int], mark: int | None = None,
             mark_colour: tuple[int, int, int] | None = None, flags=(),
             flag_colour: tuple[int, int, int] | None = None) -> None:
        """Plot the last `capacity` of `points`; `mark`: a step number to mark with a vertical line (the step the
        time-travel cursor holds); `flags`: step numbers to flag with a REISSUE_FLAG at the top (a served model's
        requests re-issued from the prefix)."""
        self.colour = colour
        window = list(points)[-self.capacity:]
        self.window = window
        plt = self.plt
        plt.clear_data()
        top, ticks, labels = y_ticks(window)
        self.labels = labels
        plt.ylim(0, top)
        plt.yticks(ticks, labels)
        if window:
            xs = [p[0] for p in window]
            ys = [p[1] for p in window]
            plt.plot(xs, ys, marker="braille", color=colour)
            plt.xlim(xs[0], max(xs[-1], xs[0] + 1))
        self.mark = mark if window and mark is not None and window[0][0] <= mark <= window[-1][0] else None
        if self.mark is not None:
            plt.vline(self.mark, color=mark_colour or colour)
        self.flags = [f for f in flags if window and window[0][0] <= f <= window[-1][0]]
        if self.flags:
            plt.scatter(self.flags, [top] * len(self.flags), marker=REISSUE_FLAG, color=flag_colour or colour)
        roomy = (self.size.height or 0) >= 7  # else every row goes to the data; the subtitle names the steps
        if window and roomy:
            plt.xticks([xs[0], xs[-1]], [str(xs[0]), str(xs[-1])])
        else:
            plt.xticks([])
        plt.frame(False)
        plt.xaxes(roomy, False)
        plt.yaxes(True, False)
        self.refresh()


class SpeedPanel(Vertical):
    COMPONENT_CLASSES = {"speed--label", "speed--value", "speed--muted", "speed--line", "speed--cursor"}

    DEFAULT_CSS = """
    SpeedPanel {
        """ + FRAME_CSS + """
        padding: 0 1;
        & > .speed--label { color: $text-muted; }
        & > .speed--value { color: $accent; text-style: bold; }
        & > .speed--muted { color: $text-muted; }
        & > .speed--line { color: $primary; }
        & > .speed--cursor { color: $warning; text-style: bold; }
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = "3 prefill · 5 decode · speed"
        self.stats = SpeedStats(id="speed-stats")
        self.plot = LatencyPlot(id="speed-plot")
        self._state = None
        self.last_text = None
        self._drawn: tuple | None = None  # what the plot was last drawn for: the run, its length, the cursor, size

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
        # Drawn in the same frame as every other panel (a plot a few steps behind the KV panel read as a lag), and
        # only when what it shows changed: a new step, the cursor, the end of the run, a new size.
        drawn = (id(state.run), len(state.run), state.cursor, state.done is not None, self.plot.size)
        if force or drawn != self._drawn:
            self._draw_plot()

    def rebuild(self) -> None:
        if self._state is not None:
            self.show(self._state, force=True)

    def on_resize(self) -> None:
        """Shown again after being hidden, or resized: the stats' forms and the plot's window depend on the width."""
        self.call_after_refresh(self.rebuild)

    def _draw_plot(self) -> None:
        if self._state is None:
            return
        line = component_style(self, "speed--line")
        colour = line.color.get_truecolor() if line.color is not None else None
        rgb = (colour.red, colour.green, colour.blue) if colour else Color.parse("#5fb3f0").rgb
        state = self._state
        self._drawn = (id(state.run), len(state.run), state.cursor, state.done is not None, self.plot.size)
        position = state.cursor
        mark = component_style(self, "speed--cursor").color
        mark_rgb = mark.get_truecolor() if mark is not None else None
        mark_colour = (mark_rgb.red, mark_rgb.green, mark_rgb.blue) if mark_rgb else None
        capacity, n = self.plot.capacity, len(state.run)
        if position is None:
            points = list(state.plot_points)
            flags = state.reissue_steps(max(1, n - capacity), n) if state.reissues else []
            self.plot.draw(points, rgb, flags=flags, flag_colour=mark_colour)
        else:  # the window that holds the cursor's step (the latest steps when it is among them), marked
            start = max(1, n - capacity)
            if position < start:
                start = max(1, position - capacity // 2)
            step = state.view_step
            flags = state.reissue_steps(start, start + capacity) if state.reissues else []
            self.plot.draw(state.latency_points(start, start + capacity), rgb, mark=step.index + 1,
                           mark_colour=mark_colour, flags=flags, flag_colour=mark_colour)
        self._subtitle()

    def _stats(self, state) -> Text:
        """Three lines, none ever wrapped: each the longest of its forms that fits the panel's width, so p95 and
        tokens/s stay on screen in a narrow panel (e.g. at 120×36)."""
        s = lambda name: component_style(self, f"speed--{name}")  # noqa: E731
        width = max(10, self.stats.size.width or 40)
        stats = state.latency_stats()
        dash = "—"

        def num(value, fmt="{:.1f}") -> str:
            return fmt.format(value) if value is not None else dash

        prefill = state.prefill.ms if state.prefill is not None else None
        n_prompt = f" ({state.prefill.tokens:,} tok)" if state.prefill is not None else ""
        ttft = ms(state.ttft_ms) if state.ttft_ms is not None else dash
        last, median, p95_, tok_s = (num(stats["last"]), num(stats.get("median")), num(stats["p95"]),
                                     num(stats["tok_s"]))
        L, V, M = "label", "value", "muted"
        viewed = state.view_step if not state.live else None
        last_label, C = "last ", V
        if viewed is not None:  # the time-travel cursor's step: its latency, marked; the totals stay the run's
            # a step scored by a prefill: its latency is the time to the first token, said so
            which = "TTFT " if state.view_scored_by_prefill else ""
            last_label, last, C = f"step {viewed.index + 1} {which}", num(viewed.latency_ms), "cursor"
        lines = [
            [[("prefill ", L), (ms(prefill) if prefill is not None else dash, V), (n_prompt, M), (" · TTFT ", L),
              (ttft, V)],
             [("prefill ", L), (num(prefill, "{:,.0f}"), V), (" · TTFT ", L), (num(state.ttft_ms, "{:,.0f}"), V),
              (" ms", M)],
             [("TTFT ", L), (ttft, V)]],
            [[(last_label, L), (last, C), (" · median ", L), (median, V), (" · p95 ", L), (p95_, V), (" ms", M)],
             [(last_label, L), (last, C), (" · median ", L), (median, V), (" ms", M)],
             [(last_label, L), (last, C), (" · med ", L), (median, V), (" ms", M)],
             [(last_label, L), (last, C), (" ms", M)]],
            [[("decode ", L), (tok_s, V), (" tokens/s", M), (f" · all {state.decode_steps:,} steps", M)],
             [("decode ", L), (tok_s, V), (" tokens/s", M)],
             [("p95 ", L), (p95_, V), (" ms · ", M), (tok_s, V), (" tok/s", M)],
             [(tok_s, V), (" tok/s", M)]],
        ]
        server = server_of(state.facts)
        if server is not None:  # a served model: times measured by tokentui, re-issued requests marked
            lines[0] = self._served_first(state, server, ttft)
            if width >= len(f"{last_label}{last} · median {median} · p95 {p95_} ms"):
                lines[2][:0] = [[("decode ", L), (tok_s, V), (f" tokens/s · {CLIENT_MEASURED}", M)],
                                [("decode ", L), (tok_s, V), (f" tok/s · {CLIENT_MEASURED}", M)]]
        paused_ms = getattr(state.done, "paused_ms", 0.0) if state.done is not None else 0.0
        if paused_ms and paused_ms >= 100:  # say that the speed leaves the pause out, where it fits
            lines[2].insert(0, [("decode ", L), (tok_s, V), (" tokens/s", M),
                                (f" · {paused_ms / 1000:,.1f} s paused, not counted", M)])
        if width < len(f"{last_label}{last} · median {median} · p95 {p95_} ms"):
            lines[2] = lines[2][2:]  # p95 did not fit on the second line: it goes on the third
        out = Text(no_wrap=True, overflow="ellipsis")
        for n, forms in enumerate(lines):
            if n:
                out.append("\n")
            chosen = next((f for f in forms if sum(len(t) for t, _ in f) <= width), forms[-1])
            line = Text(no_wrap=True)
            for text, style in chosen:
                line.append(text, s(style))
            line.truncate(width, overflow="ellipsis")
            out.append_text(line)
        return out

    def _served_first(self, state, server, ttft: str) -> list:
        """The first line's forms for a served model: the time to the first token as tokentui measured it; at a
        step that began a request re-issued from the prefix, that request's TTFT (and the prefix cache's state)."""
        L, V, M = "label", "value", "muted"
        forms = reissue_forms(state.view_step, server)
        if forms:
            return [[(words.split(":")[0], "cursor"), (":" + words.split(":", 1)[1], V)] for words in forms]
        prompt = f" · {state.prefill.tokens:,} prompt tok" if state.prefill is not None else ""
        return [[("TTFT ", L), (ttft, V), (f" {CLIENT_MEASURED}", M), (prompt, M)],
                [("TTFT ", L), (ttft, V), (f" {CLIENT_MEASURED}", M)],
                [("TTFT ", L), (ttft, V)]]

    def _subtitle(self) -> None:
        """The plot's unit, and its window of steps when that is not the whole run or has no x labels."""
        window = self.plot.window
        total = self._state.decode_steps if self._state is not None else 0
        served = self._state is not None and server_of(self._state.facts) is not None
        if served:
            self.border_subtitle = self._served_subtitle(window, total)
        elif window and (total > len(window) or (self.plot.size.height or 0) < 7):
            self.border_subtitle = f"ms · steps {window[0][0]:,}–{window[-1][0]:,}"
        else:
            self.border_subtitle = "ms per decode step"

    def _served_subtitle(self, window, total: int) -> str:
        """A served model's plot: the times are tokentui's, the re-issued requests flagged; the longest form that
        fits the border."""
        flag = f" · {REISSUE_FLAG} re-issued" if self.plot.flags else ""
        if window and (total > len(window) or (self.plot.size.height or 0) < 7):
            first = f"ms · steps {window[0][0]:,}–{window[-1][0]:,} · {CLIENT_MEASURED}"
        else:
            first = f"ms between tokens · {CLIENT_MEASURED}"
        room = max(10, (self.size.width or 40) - 6)
        forms = [first + flag, f"ms · {CLIENT_MEASURED}" + flag, f"ms · {CLIENT_MEASURED}"]
        return next((form for form in forms if len(form) <= room), forms[-1])
