"""The answer's text, streaming in (step 6, detokenize): `OutputView` draws it; `OutputPanel` (output.py) frames it
and feeds it the run's tokens.

`OutputView` is append-only: each token's text is laid out once into word-wrapped lines by its `AnswerLayout`
(answer_layout.py: which slices of which tokens sit on which line; only the last line can change when tokens
arrive) and only the visible lines are drawn (Textual's line API), so a 4,000-token answer costs the same per step
as a 40-token one. `h` switches to the heat map: each token coloured by the raw probability it had when it
was chosen, on alternating backgrounds that show where one token ends and the next begins; that only changes how
lines are drawn, not the layout.

Time travel: `set_cursor(i)` marks token i (reverse video, over its heat colour), scrolls it into view and shows the
answer as it stood at that step: what came after is dimmed, bytes held then are the ▒ right after the token. A
token with nothing to draw (bytes still pending, a hidden end token, a bare newline) is marked by one cell right
after the token before it. Clicking a
token posts `OutputView.TokenClicked` with its index (the app moves the cursor there).
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.color import Color
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .answer_layout import AnswerLayout
from .base import SCROLL_BINDINGS

HEAT_LEVELS = 10


class OutputView(ScrollView, can_focus=True, inherit_bindings=False):
    """Wrapped, append-only token text with an optional heat map.

    Only vertical scrolling keys: `right` belongs to the app (one step while paused).
    """

    BINDINGS = SCROLL_BINDINGS

    COMPONENT_CLASSES = {
        "output--heat-low",
        "output--heat-high",
        "output--boundary-a",
        "output--boundary-b",
        "output--pending",
        "output--placeholder",
        "output--special",
    }

    DEFAULT_CSS = """
    OutputView {
        background: $surface;
        color: $foreground;
        height: 1fr;
        overflow-y: auto;
        overflow-x: hidden;
        scrollbar-size-vertical: 1;
        scrollbar-gutter: stable;  /* the scrollbar's column is kept: its arrival does not re-wrap the answer */
        & > .output--heat-low { color: $heat-low; }
        & > .output--heat-high { color: $heat-high; }
        & > .output--boundary-a { background: $boundary-a; }
        & > .output--boundary-b { background: $boundary-b; }
        & > .output--pending { color: $pending-bytes; text-style: bold; }
        & > .output--placeholder { color: $text-muted; text-style: italic; }
        & > .output--special { color: $special-token; text-style: bold; }
    }
    """

    heat: reactive[bool] = reactive(False)

    class TokenClicked(Message):
        """A token of the answer was clicked: `index` is its position in the run (the time-travel cursor goes
        there)."""

        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.answer = AnswerLayout()  # the token texts and their word-wrapped lines
        self._probs: list[float] = []
        self._special: set[int] = set()  # token indices drawn as special-token markers (e.g. <|im_end|>)
        self.pending_marker = ""
        self.placeholder = ""
        self.tail_count = 0  # text appended after the tokens (DoneEvent.flushed)
        # text before the tokens: a branch played back alone starts with its prefix, whose steps its record does
        # not carry (one entry, not clickable: no step of this run is behind it)
        self.head_count = 0
        self._palette_cache: dict | None = None
        self._follow = True  # keep the newest line in view; off while the reader has scrolled up
        self.cursor: int | None = None  # the time-travel cursor's token (None: live, nothing marked)
        self.cursor_pending = False  # bytes of a character were held after the cursor's token, at its step

    # ---- data --------------------------------------------------------------------------------------------
    @property
    def _texts(self) -> list[str]:
        """The token texts (the layout's)."""
        return self.answer.texts

    @property
    def _lines(self) -> list[list[tuple[int, int, int]]]:
        """The word-wrapped lines (the layout's): each a list of (token index, start, end) slices."""
        return self.answer.lines

    @property
    def _wrap(self) -> int:
        """The wrap width in cells (0 until the first resize)."""
        return self.answer.width

    @property
    def token_count(self) -> int:
        return len(self._texts)

    @property
    def text(self) -> str:
        return "".join(self._texts)

    def clear(self) -> None:
        self.answer.clear()
        self._probs.clear()
        self._special.clear()
        self.tail_count = 0
        self.head_count = 0
        self.pending_marker = ""
        self._follow = True
        self.cursor = None
        self.virtual_size = Size(self._wrap, 1)
        self.scroll_to(0, 0, animate=False, immediate=True)
        self.refresh()

    def append(self, tokens: list[tuple]) -> None:
        """Add tokens (text, probability[, special marker]); lays out only the new text."""
        if not tokens:
            return
        first_dirty = len(self._lines) - 1
        for text, prob, *marker in tokens:
            index = self.answer.add(text)
            self._probs.append(prob)
            if marker and marker[0]:
                self._special.add(index)
            if self._wrap > 0:
                self._layout(index)
        self._update_size()
        self.refresh_lines(first_dirty, len(self._lines) - first_dirty)
        if self._follow and self.cursor is None:  # a held cursor keeps its token in view instead
            self._scroll_to_newest()

    def _scroll_to_newest(self) -> None:
        """Show the last line. Until the scrollbar has been laid out (the first overflow) Textual refuses to
        scroll, so try again after the next refresh too; without that the view stopped following right there."""
        self.scroll_end(animate=False, immediate=True, x_axis=False)
        if not self.allow_vertical_scroll:
            self.call_after_refresh(lambda: self._follow and self.scroll_end(animate=False, immediate=True,
                                                                             x_axis=False))

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self._follow = new_value >= self.max_scroll_y  # scrolled up: stop following; back at the end: follow

    def set_pending(self, marker: str) -> None:
        if marker != self.pending_marker:
            self.pending_marker = marker
            self.refresh_lines(len(self._lines) - 1)

    def _update_size(self) -> None:
        """Tell Textual the new scroll range. Assigning `virtual_size` re-lays out the whole screen, and then every
        panel renders again (a layout per frame at a fast model's rate: docs/design-record.md, "The answer view's scroll range").
        A longer answer only changes this view's scroll range and its scrollbar's thumb, so that is what is
        updated; a real layout happens only when the scrollbar appears, the width changes or the text shrinks."""
        size, old = Size(self._wrap, len(self._lines)), self.virtual_size
        if size == old:
            return
        appears = not self.show_vertical_scrollbar and size.height > self.container_size.height
        if appears or size.width != old.width or size.height < old.height:
            self.virtual_size = size
            return
        self.set_reactive(OutputView.virtual_size, size)
        if self.show_vertical_scrollbar:
            self.vertical_scrollbar.window_virtual_size = size.height

    # ---- layout ------------------------------------------------------------------------------------------
    def _layout(self, index: int) -> None:
        """Lay token `index` out (the layout's `lay_out`); every token's layout, first or after a resize, goes
        through here."""
        self.answer.lay_out(index)

    def _relayout(self, width: int) -> None:
        """Wrap the whole answer again, `width` cells wide, and tell Textual the new scroll range."""
        self.answer.restart(width)
        for index in range(self.token_count):
            self._layout(index)
        self._update_size()

    def on_resize(self) -> None:
        width = max(1, self.scrollable_content_region.width - 1)  # keep a column for the pending marker
        if width != self._wrap:
            at_end = self.is_vertical_scroll_end or self.max_scroll_y == 0
            self._relayout(width)
            self.refresh()
            if self.cursor is not None:  # re-wrapped: the time-travel cursor's token stays in view
                self.call_after_refresh(self._show_cursor)
            elif at_end:
                self.scroll_end(animate=False, immediate=True, x_axis=False)

    # ---- the time-travel cursor --------------------------------------------------------------------------
    def _token_lines(self, index: int) -> tuple[int, int]:
        """(first, last) line on which token `index` is drawn or marked."""
        return self.answer.token_lines(index)

    def set_cursor(self, index: int | None, pending: bool = False) -> None:
        """Mark token `index` (None: back to live, following the newest line) and show the answer as it stood at
        that step: the tokens after it dimmed, and — `pending`: bytes of a character were still held after it —
        the ▒ placeholder right after it (the character it became is drawn by a later, dimmed, token). Moving from
        step to step redraws the lines between the old and the new cursor token (one step: their lines only);
        entering or leaving time travel, those from the cursor's token on. The new one is scrolled into view."""
        if index is not None and not 0 <= index < len(self._texts):
            index = None
        old = self.cursor
        pending = pending and index is not None
        if index == old and pending == self.cursor_pending:
            return
        self.cursor = index
        self.cursor_pending = pending
        moved = [token for token in (old, index) if token is not None and token < len(self._texts)]
        if len(moved) == 2:  # from one step to another: only the tokens between them change how they look
            first, _ = self._token_lines(min(moved))
            _, last = self._token_lines(max(moved))
            self.refresh_lines(first, last - first + 1)
        elif moved:  # into time travel or out of it: everything after the cursor's token dims or brightens
            first, _ = self._token_lines(moved[0])
            self.refresh_lines(first, len(self._lines) - first)  # only the lines in view are drawn again
        if index is None:
            self._follow = True
            self._scroll_to_newest()
            return
        self._show_cursor()

    def _show_cursor(self) -> None:
        """Scroll the cursor token into view (to the middle) when it is not in view."""
        if self.cursor is None:
            return
        first, last = self._token_lines(self.cursor)
        height = self.scrollable_content_region.height
        top = round(self.scroll_y)
        if height > 0 and (first < top or last >= top + height):
            self.scroll_to(y=max(0, first - height // 2), animate=False, immediate=True)

    def token_at(self, x: int, y: int) -> int | None:
        """The token drawn at content cell (x, y) (past the end of a line: its last token; None below the
        text)."""
        return self.answer.token_at(round(self.scroll_x) + x, round(self.scroll_y) + y)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        index = self.token_at(offset.x, offset.y)
        if index is not None and self.head_count <= index < self.token_count - self.tail_count:
            self.post_message(self.TokenClicked(index - self.head_count))

    # ---- drawing -----------------------------------------------------------------------------------------
    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._palette_cache = None

    def _palette(self) -> dict:
        if self._palette_cache is None:
            base = self.rich_style
            low = Color.from_rich_color(self.get_component_rich_style("output--heat-low").color)
            high = Color.from_rich_color(self.get_component_rich_style("output--heat-high").color)
            bg_a = self.get_component_rich_style("output--boundary-a")
            bg_b = self.get_component_rich_style("output--boundary-b")
            heat = []
            for level in range(HEAT_LEVELS):
                colour = low.blend(high, level / (HEAT_LEVELS - 1)).rich_color
                heat.append((base + bg_a + Style(color=colour), base + bg_b + Style(color=colour)))
            self._palette_cache = {
                "base": base,
                "heat": heat,
                "pending": base + self.get_component_rich_style("output--pending"),
                "placeholder": base + self.get_component_rich_style("output--placeholder"),
                "special": base + self.get_component_rich_style("output--special"),
                "cursor": Style(reverse=True, bold=True),
                "later": Style(dim=True),  # time travel: what was written after the step in view
            }
        return self._palette_cache

    def watch_heat(self) -> None:
        self.refresh()

    def _blank_mark(self, index: int) -> Segment:
        """The one cell that marks a cursor token with nothing to draw: ↵ for a newline, ▒ otherwise (bytes
        still pending, a hidden end token), in the token's heat colour when the heat map is on."""
        palette = self._palette()
        style = palette["base"]
        if self.heat and index not in self._special and self._probs[index] is not None:
            level = min(HEAT_LEVELS - 1, max(0, int(self._probs[index] * (HEAT_LEVELS - 1) + 0.5)))
            style = palette["heat"][level][index % 2]
        return Segment("↵" if "\n" in self._texts[index] else "▒", style + palette["cursor"])

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        line_no = scroll_y + y
        palette = self._palette()
        base = palette["base"]
        if not self._texts:
            if y == 0 and self.placeholder:
                return Strip([Segment(self.placeholder, palette["placeholder"])]).crop_extend(0, width, base)
            return Strip.blank(width, base)
        if line_no >= len(self._lines):
            return Strip.blank(width, base)
        segments = []
        texts, probs = self._texts, self._probs
        heat, special, cursor = self.heat, self._special, self.cursor
        mark_slot = None  # a cursor token that draws nothing is marked by one cell, before this slice
        if cursor is not None and self.answer.blank(cursor):
            anchor_line, slot = self.answer.anchor(cursor)
            if anchor_line == line_no:
                mark_slot = slot
        line = self._lines[line_no]
        later = palette["later"]
        held_after = cursor if cursor is not None and self.cursor_pending and not self.answer.blank(cursor) else None
        for slot, (index, start, end) in enumerate(line):
            if slot == mark_slot:
                segments.append(self._blank_mark(cursor))
            piece = texts[index][start:end]
            if index in special:
                style = palette["special"]
            elif heat and probs[index] is not None:  # None: a served token with no probability reported
                level = min(HEAT_LEVELS - 1, max(0, int(probs[index] * (HEAT_LEVELS - 1) + 0.5)))
                style = palette["heat"][level][index % 2]
            else:
                style = base
            if index == cursor:
                style = style + palette["cursor"]
            elif cursor is not None and index > cursor:  # written after the step in view
                style = style + later
            segments.append(Segment(piece, style))
            if index == held_after and end == len(texts[index]):  # the bytes held at that step, after its token
                segments.append(Segment("▒", palette["pending"]))
        if mark_slot is not None and mark_slot >= len(line):
            segments.append(self._blank_mark(cursor))
        if line_no == len(self._lines) - 1 and self.pending_marker:  # held now, at the newest step
            marker_style = palette["pending"] + (later if cursor is not None else Style())
            segments.append(Segment(self.pending_marker, marker_style))
        return Strip(segments).crop_extend(scroll_x, scroll_x + width, base)
