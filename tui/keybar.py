"""The key bar: the dashboard's keys on one line, read from the key table (tui/keys.py).

Hand-written rather than Textual's `Footer`, which cuts the line wherever the terminal ends (`r restar`) and so
can hide `q quit`: this bar shows whole entries only, drops the least important first (PRIORITY) and always keeps
`?` and `q quit`; the help screen lists every key, so where the bar leaves keys out `?` says it leads to them
(`? all keys`, or `? more` where that would cost another entry).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widget import Widget

from .keys import KEYS, SAMPLER_KEYS, KeySpec
from .panels.base import component_style, forget_styles

# Binding ids, most important first: what a narrow bar keeps. Ids not listed come last, in table order.
PRIORITY = (
    "tokentui.quit",
    "tokentui.help",
    "tokentui.pause",
    "tokentui.step",
    "tokentui.temperature-down",
    "tokentui.top-k-down",
    "tokentui.top-p-down",
    "tokentui.restart",
    "tokentui.edit",
    "tokentui.greedy",
    "tokentui.seed",
    "tokentui.cursor-back",  # [] past: the time-travel cursor (the status line names esc while it is held)
    "tokentui.branch",
    "tokentui.heat",
    "tokentui.lens",
    "tokentui.anatomy",  # not in the bar (bar=False: the 160-column bar is full); listed for when it is
    "tokentui.branches",
    "tokentui.export",
)
GAP = 2  # spaces between entries
# What a replay refuses (it plays the recorded settings and prompt, and cannot branch): not offered in its bar.
REPLAY_REFUSES = frozenset({spec.id for spec in SAMPLER_KEYS} | {"tokentui.greedy", "tokentui.seed", "tokentui.edit",
                                                                  "tokentui.branch"})


def replay_keys(specs: tuple[KeySpec, ...] = KEYS) -> tuple[KeySpec, ...]:
    """The keys that work in a replay."""
    return tuple(spec for spec in specs if spec.id not in REPLAY_REFUSES)


@dataclass(frozen=True)
class Entry:
    """One entry of the bar: a key (or a group of keys, `tT`) and what it does."""

    ids: tuple[str, ...]
    keys: str
    label: str

    @property
    def width(self) -> int:
        return Text(f"{self.keys} {self.label}").cell_len


def entries(specs: tuple[KeySpec, ...] = KEYS) -> list[Entry]:
    """The bar's entries in table order; the keys of one group (temperature − / +) share one entry."""
    out: list[Entry] = []
    for spec in specs:
        if not spec.show or not spec.bar:
            continue
        key = "^p" if spec.keys == "ctrl+p" else spec.display.split(" ")[0]
        if spec.group is not None and out and out[-1].label == spec.group.description:
            last = out[-1]
            out[-1] = Entry(last.ids + (spec.id,), last.keys + key, last.label)
        else:
            out.append(Entry((spec.id,), key, spec.group.description if spec.group else spec.footer))
    return out


def rank(entry: Entry) -> int:
    ranks = [PRIORITY.index(i) for i in entry.ids if i in PRIORITY]
    return min(ranks) if ranks else len(PRIORITY)


HELP_ID = "tokentui.help"
# What `?` says where the bar leaves keys out, longest first: the first that costs no other entry its place.
HELP_LABELS = ("all keys", "more")


def fit(width: int, specs: tuple[KeySpec, ...] = KEYS) -> list[Entry]:
    """The entries that fit in `width` cells, most important first, shown in table order. Where some are left out,
    the help entry says that it leads to them."""
    shown = _fit(width, entries(specs))
    if len(shown) == len(entries(specs)):
        return shown
    for label in HELP_LABELS:
        relabelled = [Entry(e.ids, e.keys, label) if HELP_ID in e.ids else e for e in entries(specs)]
        again = _fit(width, relabelled)
        if [e.ids for e in again] == [e.ids for e in shown]:
            return again
    return shown


def _fit(width: int, all_entries: list[Entry]) -> list[Entry]:
    chosen: set[int] = set()
    used = 0
    for n in sorted(range(len(all_entries)), key=lambda n: (rank(all_entries[n]), n)):
        need = all_entries[n].width + (GAP if chosen else 0)
        if used + need <= width:
            chosen.add(n)
            used += need
    return [e for n, e in enumerate(all_entries) if n in chosen]


class KeyBar(Widget):
    COMPONENT_CLASSES = {"keybar--key", "keybar--label"}

    DEFAULT_CSS = """
    KeyBar {
        height: 1;
        background: $panel;
        padding: 0 1;
        & > .keybar--key { color: $accent; text-style: bold; }
        & > .keybar--label { color: $foreground; }
    }
    """

    def __init__(self, *args, replaying: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.specs = replay_keys() if replaying else KEYS

    def notify_style_update(self) -> None:
        super().notify_style_update()
        forget_styles(self)

    def on_resize(self) -> None:
        self.refresh()

    @property
    def shown(self) -> list[Entry]:
        return fit(max(1, self.content_size.width), self.specs)

    def render(self) -> Text:
        key = component_style(self, "keybar--key")
        label = component_style(self, "keybar--label")
        out = Text(no_wrap=True, overflow="crop")
        for n, entry in enumerate(self.shown):
            if n:
                out.append(" " * GAP)
            out.append(entry.keys, key)
            out.append(" " + entry.label, label)
        return out
