"""The API key kept out of what a served model generates: a server can send the key back as tokens (a careless
echo, or a prompt that asks for it), and whatever a run yields is printed, drawn and recorded. `KeyMask` sits
between a served run and everything downstream (core/server/engine.py wraps each run, branch and fan-out in
`KeyMask.events`), so no record, screen, stdout or `--json` line gets the key in the text the server sent. Token
ids pass as they came: only text is masked.

What counts as the key: any MIN_PART (8) consecutive characters of it, in any of the forms `http.key_forms`
gives (as sent, JSON-escaped, URL-encoded) and as the dashboard displays it; a key shorter than that only whole.
Each run of such characters becomes one KEY_MASK.

A key split over tokens, one a few characters: the steps whose text could be the start of the key (or ends in a run
of its characters) are held back, as a detokenizer holds the bytes of an unfinished character, until a later token
says whether the key goes on.
Once it is settled they are let go in order: a step whose text covers part of the key has its text's share of it
replaced (KEY_MASK once, in the step where it starts), and its piece, its own candidate's piece and its completed
characters replaced too. So a step can show a token or more late while its text could begin the key; a run that
ends (or fails) lets go of what it holds, masked where it is key. Every other string of every event (a candidate's
piece, a notice, the done event's text, a branch's or a fan-out's prefix, a sample's pieces, the prompt's text and
pieces) is masked the same way as a whole. Nothing is held, and nothing changes, when no key is sent.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Iterator
from urllib.parse import quote

from ..runs.events import BranchEvent, DoneEvent, ErrorEvent, Event, PromptEvent, StepEvent
from ..runs.explore_events import SampleEvent
from ..steps.display import display_text, map_strings

KEY_MASK = "[API key]"
MIN_PART = 8  # consecutive characters of the key that are masked wherever they appear

__all__ = ["KEY_MASK", "MIN_PART", "KeyMask", "key_forms"]


def key_forms(secret: str) -> set[str]:
    """The forms a server might echo a key in: as sent, JSON-escaped, URL-encoded (http.scrub reads them too)."""
    return {secret, json.dumps(secret)[1:-1], quote(secret, safe="")} if secret else set()


class KeyMask:
    """The masker of one key (None or "": no key, nothing masked); `events` masks one run's events."""

    def __init__(self, key: str | None) -> None:
        self.key = key or ""
        forms = {f for form in key_forms(self.key) for f in (form, display_text(form))} if self.key else set()
        self._grams: dict[int, set[str]] = {}  # a length -> the key's substrings of that length
        for form in forms:
            n = min(MIN_PART, len(form))
            self._grams.setdefault(n, set()).update(form[i:i + n] for i in range(len(form) - n + 1))
        self._shortest = min(self._grams, default=0)
        # the stretches of text made only of the key's characters, long enough to hold a gram: where grams are looked
        # for (a scan in C first: a long prompt's text is mostly not such a stretch)
        chars = "".join(sorted({c for form in forms for c in form}))
        self._stretch = re.compile(f"[{re.escape(chars)}]{{{self._shortest},}}") if chars else None
        self._keep = max((len(f) for f in forms), default=0)  # raw text kept as the context of what follows
        self._held: list[Event] = []  # held steps, and the events that came after them (in order)
        self._buf = ""  # the held steps' text, raw
        self._context = ""  # the raw text let go just before it (a key begun there goes on in the held steps)

    @property
    def active(self) -> bool:
        return bool(self.key)

    # ---- whole strings --------------------------------------------------------------------------------------
    def covered(self, text: str) -> list[tuple[int, int]]:
        """The runs ([start, end), in order) of `text` made of the key's characters: each MIN_PART of them in a row
        (the whole key when it is shorter), in any of its forms."""
        if self._stretch is None or len(text) < self._shortest:
            return []
        cover = bytearray(len(text))
        for stretch in self._stretch.finditer(text):
            for n, grams in self._grams.items():
                for i in range(stretch.start(), stretch.end() - n + 1):
                    if text[i:i + n] in grams:
                        cover[i:i + n] = b"\x01" * n
        runs: list[tuple[int, int]] = []
        at = cover.find(1)
        while at >= 0:
            end = cover.find(0, at)
            end = len(text) if end < 0 else end
            runs.append((at, end))
            at = cover.find(1, end)
        return runs

    def text(self, text: str) -> str:
        """`text` with each run of the key's characters replaced by one KEY_MASK."""
        runs = self.covered(text)
        if not runs:
            return text
        out, at = [], 0
        for start, end in runs:
            out += [text[at:start], KEY_MASK]
            at = end
        out.append(text[at:])
        return "".join(out)

    def pieces(self, pieces: list[str]) -> list[str]:
        """Token pieces in order, each one that holds part of a run of the key's characters (found across the
        pieces, in the text they make together) replaced by KEY_MASK; the same list when none does."""
        runs = self.covered("".join(pieces))
        if not runs:
            return pieces
        out, at = [], 0
        for piece in pieces:
            end = at + len(piece)
            out.append(KEY_MASK if any(s < end and e > at for s, e in runs) else piece)
            at = end
        return out

    def value(self, value):
        """`value` (an event, any dataclass, a list, a string) with every string in it masked (`text`); the same
        object when nothing in it held the key."""
        return map_strings(value, self.text)

    # ---- a run's events -------------------------------------------------------------------------------------
    def events(self, events: Iterator[Event]) -> Iterator[Event]:
        """`events` masked, steps held back while their text could begin the key (the module docstring). A run
        that raises lets go of what is held first, so its record and its `done` keep those steps."""
        if not self.active:
            yield from events
            return
        try:
            for event in events:
                yield from self._take(event)
        except Exception:
            yield from self._settle(final=True)
            raise
        yield from self._settle(final=True)

    def _take(self, event: Event) -> Iterator[Event]:
        if isinstance(event, StepEvent):
            self._held.append(event)
            self._buf += event.text
            yield from self._settle(final=False)
        elif self._held and not isinstance(event, (DoneEvent, ErrorEvent)):
            self._held.append(event)  # in order, behind the held steps
        else:
            yield from self._settle(final=True)  # the run's end: what is held goes first
            yield self._whole(event)

    def _whole(self, event: Event) -> Event:
        """An event other than a step, masked as a whole, its token pieces as one sequence."""
        if isinstance(event, PromptEvent):
            texts = [p.piece for p in event.pieces]
            masked = self.pieces(texts)
            if masked is not texts:
                event = replace(event, pieces=[p if m is p.piece else replace(p, piece=m)
                                               for p, m in zip(event.pieces, masked)])
        elif isinstance(event, SampleEvent):
            masked = self.pieces(event.pieces)
            event = event if masked is event.pieces else replace(event, pieces=masked)
        elif isinstance(event, BranchEvent):  # a key begun in its prefix goes on in its steps
            self._context = event.prefix_text[-self._keep:]
        return self.value(event)

    def _settle(self, final: bool) -> Iterator[Event]:
        """Let go, masked, of the held events the text so far settles: all of them when `final`; else those
        before the first step whose text may be part of the key (its characters reach the end of the text so far,
        or the end could begin the key)."""
        full = self._context + self._buf
        c = len(self._context)
        runs = self.covered(full)
        keep = len(full)
        if not final:
            keep = min([keep, self._begins_key(full)] + [s for s, e in runs if e == len(full)])
        keep = max(keep, c) - c  # from here on (in the held text) steps are held
        local = [(max(0, s - c), e - c) for s, e in runs if e > c]
        out: list[Event] = []
        at = 0
        for event in self._held:
            if isinstance(event, StepEvent):
                end = at + len(event.text)
                if end > keep:
                    break
                out.append(self._step(event, at, end, local))
                at = end
            else:
                out.append(self.value(event))
        self._held = self._held[len(out):]
        self._context = (self._context + self._buf[:at])[-self._keep:]
        self._buf = self._buf[at:]
        yield from out

    def _begins_key(self, text: str) -> int:
        """Where the longest end of `text` that could begin the key (short of the whole key) starts; len(text)
        when none could."""
        for j in range(min(len(self.key) - 1, len(text)), 0, -1):
            if text.endswith(self.key[:j]):
                return len(text) - j
        return len(text)

    def _step(self, step: StepEvent, start: int, end: int, runs: list[tuple[int, int]]) -> StepEvent:
        """A held step let go (its text is the held text's [start, end)): the share of it in a run of the key's
        characters replaced (by KEY_MASK in the step where the run starts), its piece, its own candidate's and its
        completed characters too; then every string in it as in any event."""
        if end > start:
            hit = [(s, e) for s, e in runs if s < end and e > start]
        else:  # a step without text (a special token, or bytes pending) amid the key's characters
            hit = [(s, e) for s, e in runs if s < start < e]
        if hit:
            text, at = [], start
            for s, e in hit:
                if s > at:
                    text.append(self._buf[at:s])
                if s >= start:
                    text.append(KEY_MASK)
                at = max(at, min(e, end))
            text.append(self._buf[at:end])
            step = replace(step, text="".join(text), piece=KEY_MASK, completed_chars=[],
                           candidates=[replace(c, piece=KEY_MASK) if c.id == step.id else c
                                       for c in step.candidates])
        return self.value(step)

