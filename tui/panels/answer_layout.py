"""Where the answer's tokens sit on screen: the word-wrap bookkeeping of `OutputView`, in plain Python.

`AnswerLayout` holds the token texts and lays each one out once, in order, into word-wrapped lines (`add`, then
`lay_out`): each line is a list of slices (token index, start, end) of the token texts, so a token may be split
over lines and a line may hold several tokens. A word split over several tokens wraps as one word, and only the
last line can change when tokens arrive; after a new width (`restart`) every token is laid out again. It also
answers the questions the view asks of the layout: on which lines a token is drawn (`token_lines`), where a token
with nothing to draw is marked (`anchor`), and which token sits at a cell (`token_at`). Widths are in terminal
cells (a wide CJK character takes two). Nothing here draws or knows about Textual; the view turns lines into strips.
"""

from __future__ import annotations

import unicodedata

from rich.cells import cell_len
from rich.cells import get_character_cell_size as cell_size

Slice = tuple[int, int, int]  # (token index, start, end): texts[index][start:end]


class AnswerLayout:
    """Token texts laid out into word-wrapped lines `width` cells wide (width 0: not laid out yet)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.lines: list[list[Slice]] = [[]]
        self.line_cells: list[int] = [0]  # each line's width in cells
        self.width = 0
        self._anchor_cache: tuple | None = None

    def clear(self) -> None:
        """Drop every token (the width stays)."""
        self.texts.clear()
        self.lines = [[]]
        self.line_cells = [0]
        self._anchor_cache = None

    def add(self, text: str) -> int:
        """Add a token's text (not laid out yet: `lay_out` does that); returns its index."""
        self.texts.append(text)
        return len(self.texts) - 1

    def restart(self, width: int) -> None:
        """Forget the lines and wrap at `width` cells from now on; the tokens are then laid out again, in order."""
        self.width = width
        self.lines = [[]]
        self.line_cells = [0]

    # ---- word wrap ---------------------------------------------------------------------------------------
    def lay_out(self, index: int) -> None:
        """Lay token `index` out after the ones before it (tokens are laid out in order, each once per width):
        its text goes onto the last line, wrapping as it must; a newline in it starts a line."""
        text = self.texts[index]
        width = self.width
        start = 0
        for part_no, part in enumerate(text.split("\n")):
            if part_no:
                start += 1  # the newline character
                self._newline()
            self._place(index, start, part, width)
            start += len(part)

    def _newline(self) -> None:
        """End the last line (without its trailing spaces: at a wrap they belong to neither line) and start one."""
        line = self.lines[-1]
        while line:
            index, start, end = line[-1]
            text = self.texts[index]
            cut = end
            while cut > start and text[cut - 1] == " ":
                cut -= 1
            if cut == end:
                break
            self.line_cells[-1] -= end - cut
            if cut > start:
                line[-1] = (index, start, cut)
                break
            line.pop()
        self.lines.append([])
        self.line_cells.append(0)

    def _place(self, index: int, offset: int, part: str, width: int) -> None:
        """Lay out `part` (no newline in it) on the last line, wrapping at word boundaries like any text view: a
        space, or either side of a wide (CJK) character, is a break opportunity, whichever token it came in. When
        a character does not fit, the word it belongs to — which may have begun in earlier tokens — moves to a
        new line whole; a space that does not fit ends the line; only a word longer than the line is broken."""
        lines, cells = self.lines, self.line_cells
        for i, ch in enumerate(part):
            w = cell_size(ch)
            if cells[-1] + w > width and cells[-1] > 0:
                if ch.isspace():
                    self._newline()
                    continue  # the space at a wrap is not carried to the new line
                moved = self._trailing_word(width - w) if w < 2 else None
                self._newline()
                if moved:
                    lines[-1].extend(moved[0])
                    cells[-1] = moved[1]
            line = lines[-1]
            if line and line[-1][0] == index and line[-1][2] == offset + i:
                line[-1] = (index, line[-1][1], offset + i + 1)
            else:
                line.append((index, offset + i, offset + i + 1))
            cells[-1] += w

    def _trailing_word(self, room: int) -> tuple[list[Slice], int] | None:
        """Cut the word at the end of the last line (its slices, possibly from several tokens, and its width) off
        that line, if something before it on the line leaves a break opportunity and the word fits in `room`
        cells; None otherwise (a word longer than a line breaks where it is). A word starts after a space or a
        wide (CJK) character — or at one, when only punctuation follows it, so `开放)` never leaves `)` alone."""
        line = self.lines[-1]
        texts = self.texts
        word_cells = 0
        punctuation_only = True
        for k in range(len(line) - 1, -1, -1):
            index, start, end = line[k]
            text = texts[index]
            for j in range(end - 1, start - 1, -1):
                ch = text[j]
                wide = cell_size(ch) == 2
                if ch.isspace() or wide:  # the break opportunity
                    cut = j if wide and punctuation_only else j + 1
                    if cut == j:
                        word_cells += 2
                    if not word_cells or (k == 0 and cut == start) or word_cells > room:
                        return None  # the line ends at a break already, the word is the line, or too long
                    moved = ([(index, cut, end)] if cut < end else []) + line[k + 1:]
                    del line[k + 1:]
                    if cut > start:
                        line[k] = (index, start, cut)
                    else:
                        del line[k]
                    self.line_cells[-1] -= word_cells
                    return moved, word_cells
                word_cells += cell_size(ch)
                punctuation_only = punctuation_only and unicodedata.category(ch).startswith("P")
                if word_cells > room:
                    return None  # longer than a line: it breaks where it is
        return None  # the whole line is one word

    # ---- finding tokens on the lines ---------------------------------------------------------------------
    def _max_index(self, line_no: int) -> int:
        """The last token index on lines 0..line_no (-1: none)."""
        lines = self.lines
        while line_no >= 0:
            if lines[line_no]:
                return lines[line_no][-1][0]
            line_no -= 1
        return -1

    def _first_line_reaching(self, index: int) -> int:
        """The first line holding token `index` or a later one (len(lines) when there is none): a binary search,
        since token indices only grow down the lines."""
        lo, hi = 0, len(self.lines)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._max_index(mid) >= index:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def blank(self, index: int) -> bool:
        """Whether token `index` draws nothing (empty text, or newlines only)."""
        return 0 <= index < len(self.texts) and not self.texts[index].replace("\n", "")

    def anchor(self, index: int) -> tuple[int, int]:
        """(line, slot) where a token that draws nothing is marked: before the slice `slot` of that line, i.e.
        right after the token before it."""
        key = (index, len(self.texts), len(self.lines), self.width)
        if self._anchor_cache is not None and self._anchor_cache[0] == key:
            return self._anchor_cache[1]
        lines = self.lines
        line_no = self._first_line_reaching(index)
        anchor = None
        if line_no < len(lines):
            slot = next(n for n, piece in enumerate(lines[line_no]) if piece[0] > index)
            if slot > 0:
                anchor = (line_no, slot)
            elif line_no > 0:
                anchor = (line_no - 1, len(lines[line_no - 1]))
            else:
                anchor = (0, 0)
        else:
            anchor = (len(lines) - 1, len(lines[-1]))
        self._anchor_cache = (key, anchor)
        return anchor

    def token_lines(self, index: int) -> tuple[int, int]:
        """(first, last) line on which token `index` is drawn or marked."""
        if self.blank(index):
            line_no = self.anchor(index)[0]
            return line_no, line_no
        lines = self.lines
        first = min(self._first_line_reaching(index), len(lines) - 1)
        last = first
        while last + 1 < len(lines) and (not lines[last + 1] or lines[last + 1][0][0] <= index):
            last += 1
        return first, last

    def token_at(self, column: int, line_no: int) -> int | None:
        """The token drawn at cell `column` of line `line_no` (past the end of a line: its last token; None below
        the text)."""
        if not 0 <= line_no < len(self.lines) or not self.texts:
            return None
        cells, last = 0, None
        for index, start, end in self.lines[line_no]:
            cells += cell_len(self.texts[index][start:end])
            last = index
            if column < cells:
                return index
        return last
