"""Which panels the dashboard shows at which terminal size: one table, read by the app (to show and hide the
panels), by the readings strip (to say what is hidden) and by the help screen (to list it), so none of them can
disagree. Plain Python, no Textual.

The five live readings are always on screen: the answer and the candidates in their panels, and the KV cache
size, the per-step latency and the pending bytes either in their own panels (large terminals) or in the one-line
readings strip that replaces them. A panel with a key of its own (the one-pass panel, `a`) is listed with the sizes
where it is on by default; the key shows or hides it at any size, so a smaller terminal does not count it as hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

WIDE = 120  # columns from which the model / totals panel fits beside the answer and the candidates
XWIDE = 150  # columns from which every column gets roomier
MEDIUM = 30  # rows from which the chat-template text is shown above the prompt's tokens
TALL = 36  # rows from which the speed, KV cache and pending-bytes panels fit (with WIDE columns)
XTALL = 44  # rows from which they fit in two rows of two on a narrow terminal
ROOMY = (160, 48)  # columns × rows from which the one-pass panel (`a`) is on by default, in a row of its own

# Textual's breakpoints (Screen classes the stylesheet sizes the panels by), from the same numbers.
HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE, "-wide"), (XWIDE, "-xwide")]
VERTICAL_BREAKPOINTS = [(0, "-short"), (MEDIUM, "-medium"), (TALL, "-tall"), (XTALL, "-xtall")]

# How many rows of the chat-templated text the prompt panel shows (the rest is elided: "… N more lines").
TEMPLATE_ROWS = ((XTALL, 8), (TALL, 3), (MEDIUM, 3))


@dataclass(frozen=True)
class Part:
    """A panel (or a part of one) that only some terminal sizes show."""

    id: str  # the widget id in the app ("" for a part of a panel)
    name: str  # what the help screen calls it
    short: str  # what the readings strip calls it when it is hidden
    sizes: tuple[tuple[int, int], ...]  # shown when the terminal is at least (columns, rows) for any of these
    key: str = ""  # a panel a key turns on and off at any size: `sizes` is only where it is on by default

    def shown(self, width: int, height: int) -> bool:
        return any(width >= w and height >= h for w, h in self.sizes)

    def where(self) -> str:
        """The sizes in words: '≥120 columns', '≥120×36 or ≥44 rows'."""
        words = []
        for w, h in self.sizes:
            if w and h:
                words.append(f"≥{w}×{h}")
            elif w:
                words.append(f"≥{w} columns")
            else:
                words.append(f"≥{h} rows")
        return " or ".join(words)


BOTTOM_SIZES = ((WIDE, TALL), (0, XTALL))

PARTS: tuple[Part, ...] = (
    Part("", "chat-template text (prompt panel)", "template", ((0, MEDIUM),)),
    Part("model", "model · totals panel", "model", ((WIDE, 0),)),
    Part("speed", "speed panel with the latency plot", "plot", BOTTOM_SIZES),
    Part("kv", "KV cache panel (formula, context gauge)", "KV detail", BOTTOM_SIZES),
    Part("pending", "pending-bytes panel (split characters)", "byte detail", BOTTOM_SIZES),
    # a row of its own under the answer where it is on by default (the bottom row gives it 3 rows); `a` shows it
    # at any other size in the model panel's place, or the candidates' (as the lens, `l`)
    Part("anatomy", "one-pass panel: each stage's shape, device and time (a: on / off at any size)", "one pass",
         (ROOMY,), key="a"),
)

ALWAYS = ("prompt tokens", "answer", "candidates", "sampler", "status line", "keys")
READINGS_IDS = ("speed", "kv", "pending")  # what the readings strip stands in for


def part(id_or_short: str) -> Part:
    return next(p for p in PARTS if id_or_short in (p.id, p.short))


@dataclass(frozen=True)
class Plan:
    """What to show at one size."""

    width: int
    height: int
    shown: frozenset[str]  # Part.short of every part shown
    readings_strip: bool  # the one-line KV · latency · pending strip
    template_rows: int  # rows of chat-templated text (0: none)

    def shows(self, widget_id: str) -> bool:
        """Whether the widget with this id is shown (widgets not in PARTS always are)."""
        found = [p for p in PARTS if p.id == widget_id]
        return not found or found[0].short in self.shown

    @property
    def hidden(self) -> list[Part]:
        """What a bigger terminal would add (a panel with a key of its own is not: the key shows it anywhere)."""
        return [p for p in PARTS if p.short not in self.shown and not p.key]


def plan(width: int, height: int) -> Plan:
    shown = frozenset(p.short for p in PARTS if p.shown(width, height))
    strip = any(part(i).short not in shown for i in READINGS_IDS)
    rows = next((n for h, n in TEMPLATE_ROWS if height >= h), 0)
    if "template" not in shown:
        rows = 0
    return Plan(width, height, shown, strip, rows)


def hidden_note(p: Plan) -> str:
    """One short line for a border: what a bigger terminal would add (named, when that fits the width)."""
    hidden = p.hidden
    if not hidden:
        return ""
    note = "bigger terminal: " + ", ".join(h.short for h in hidden) + " (?)"
    return note if len(note) <= p.width - 8 else "bigger terminal: more panels (? lists them)"


def size_table() -> list[tuple[str, str]]:
    """(what, at which sizes) for the help screen."""
    rows = [(", ".join(ALWAYS), "every size"),
            ("KV size · ms/step · tok/s · pending bytes (one-line strip)", "when the panels below are hidden")]
    rows += [(p.name, p.where()) for p in PARTS]
    return rows
