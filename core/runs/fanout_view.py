"""How a fan-out's samples are read (torch-free: `tokentui fanout` and the dashboard's fan-out list share it): the
samples ranked by sequence log-probability, where each first differs from the run and from the other samples, and
the first tokens drawn against the step's post-sampler probabilities."""

from __future__ import annotations

import codecs
import re
from collections import Counter
from dataclasses import dataclass

__all__ = ["FirstToken", "first_difference", "first_tokens", "piece_texts", "ranked", "split_from_others"]


def ranked(samples) -> list:
    """The samples, most likely first (a sample whose log-probability is not known last), ties by number."""
    return sorted(samples, key=lambda s: (s.logprob is None, -(s.logprob or 0.0), s.n))


def first_difference(a, b) -> int | None:
    """The first position where the id sequences `a` and `b` differ (one ending early differs where it ends);
    None when they agree over the shorter's whole length and are equally long."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def split_from_others(sample, samples) -> int | None:
    """Where `sample` leaves the other sample it follows longest (its own path from there on); None when another
    sample is the same throughout."""
    splits = [first_difference(sample.ids, other.ids) for other in samples if other.n != sample.n]
    if not splits:
        return 0
    if any(split is None for split in splits):
        return None
    return max(splits)


@dataclass(frozen=True)
class FirstToken:
    id: int
    piece: str
    count: int
    share: float  # count / samples
    prob: float | None  # the step's post-sampler probability (None: below the candidates reported)


def first_tokens(samples, candidates) -> list[FirstToken]:
    """The first tokens the samples drew, most often first, each with its share and the step's probability."""
    drawn = [s for s in samples if s.ids]
    counts = Counter(s.ids[0] for s in drawn)
    probs = {c.id: c.prob for c in candidates}
    pieces = {s.ids[0]: s.pieces[0] for s in drawn}
    return [FirstToken(token, pieces[token], count, count / len(drawn), probs.get(token))
            for token, count in counts.most_common()]


_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def piece_texts(pieces) -> list[str]:
    """Each token's text as written (for a list that dims part of a sample): a piece's `␣` a space, `↵` a newline
    shown as ⏎; a character split over byte tokens (`<0xE5><0xBC>`, `<0x80>`) is written by the token that
    completes it (those before it write nothing), as the answer panel writes it."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    out = []
    for piece in pieces:
        raw = _BYTE.findall(piece)
        if raw and _BYTE.sub("", piece) == "":
            out.append(decoder.decode(bytes(int(b, 16) for b in raw)))
        else:
            out.append(decoder.decode(b"", final=True) + piece.replace("␣", " ").replace("↵", "⏎"))
    return out
