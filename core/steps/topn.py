"""The highest scores of a vocabulary: exact `torch.topk` equivalents that are cheaper on one CPU core.

`top_scores` finds the few candidates a step reports, `top_prefix` the prefixes top-k / top-p need (core/steps/select.py
uses both). The values are exactly torch.topk's; ids of tied scores may come in another order, which topk does not
define either. On other devices both are plain torch.topk. `first_prefix` and `wider_prefix` size those prefixes.
"""

from __future__ import annotations

import math

import torch

__all__ = ["PREFIX_MIN", "TIE_MARGIN", "first_prefix", "top_prefix", "top_scores", "wider_prefix"]

PREFIX_MIN = 256  # smallest prefix tried: cheap at V = 151,936 on CPU (docs/design-record.md), and a widening costs a second pass
TIE_MARGIN = 8  # prefix slots past top_k, so a few scores tied with the k-th need no second try
_DEVICE_PREFIX = 1024  # first prefix on accelerators, where topk barely depends on k and a sync costs more

_BLOCK = 256  # top_scores: blocks of this many scores are ranked by their maximum
_PREFIX_BLOCK = 32  # top_prefix: block size of the block-max shortcut below _PREFIX_SAMPLED
_STRIDE = 16  # top_prefix: every _STRIDE-th score goes into the sample that estimates the k-th largest
_PREFIX_SAMPLED = 512  # top_prefix: from this k on (while 8 * k <= V) the sampled threshold beats torch.topk
_GATHER_SHARE = 8  # top_prefix below _PREFIX_SAMPLED: a threshold once the k best blocks hold >= 1/8 of the scores


def top_scores(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(x, n) (values descending, their ids) for the few candidates a step reports, cheaper on CPU.

    Hand-written because torch.topk over a whole vocabulary on one CPU core is a heap pass over every score for 10
    winners, a sizeable share of a step (docs/design-record.md, "Top-n without torch.topk"). Blocks of _BLOCK scores are ranked by their maximum (a vectorised reduction), and the
    n best blocks plus the ragged tail hold the n largest scores: if a top-n score's block is not among them, each
    of the n chosen blocks has a maximum at least as large, so the candidates hold n scores that large anyway. The
    values are exactly topk's; ids of tied scores may come in another order, which topk does not define either.
    """
    if x.device.type != "cpu" or n > 64 or x.numel() < 64 * _BLOCK:
        return torch.topk(x, n)
    return _block_topk(x, n, _BLOCK)


def _block_max(x: torch.Tensor, block: int) -> tuple[torch.Tensor, int]:
    """The maximum of each whole block of `block` scores ([v // block]) and where the ragged tail starts."""
    full = x.numel() - x.numel() % block
    return x[:full].view(-1, block).amax(dim=1), full


def _topk_among(x: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk(x, k) when `ids` ([m >= k]) holds every id of the k largest scores."""
    values, at = torch.topk(x.index_select(0, ids), k)  # [k]
    return values, ids.index_select(0, at)


def _block_topk(x: torch.Tensor, n: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk(x, n) through the n best blocks of `block` scores by their maximum (top_scores says why it is exact)."""
    block_max, full = _block_max(x, block)  # [v // block]
    blocks = torch.topk(block_max, min(n, block_max.numel())).indices  # [<= n]
    ids = (blocks[:, None] * block + torch.arange(block)).reshape(-1)  # [<= n * block]
    if full < x.numel():
        ids = torch.cat([ids, torch.arange(full, x.numel())])
    return _topk_among(x, ids, n)


def _block_threshold_topk(x: torch.Tensor, k: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk(x, k) through a threshold: the k-th largest block maximum. At least k scores (those k maxima) reach it,
    so the k-th largest score does too, and every top-k score is among the scores at or above it."""
    threshold = torch.topk(_block_max(x, block)[0], k, sorted=False).values.min()  # []
    return _topk_among(x, (x >= threshold).nonzero().squeeze(1), k)  # ascending ids, the ragged tail included


def top_prefix(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(x, k) (values descending, their ids) for the prefixes top-k / top-p need, cheaper on CPU.

    Hand-written because on one CPU core topk(k) over a whole vocabulary is a heap pass for a few hundred and, past
    that, an nth_element plus a sort: the nucleus of top-p 0.9 at temperature 0.7 runs to thousands of entries. Two
    exact shortcuts, each faster there (docs/design-record.md, "Top-n without torch.topk"):
    * k < _PREFIX_SAMPLED: the block maxima of top_scores with blocks of 32 scores; where the k best blocks would
      be 1/8 of the vocabulary or more (k = 256 at V = 49,152), the k-th largest block maximum as a threshold
      instead (one compare and one nonzero pass over the scores; cheaper than gathering those blocks there, dearer
      at V = 151,936).
    * larger k: estimate the k-th largest score from every _STRIDE-th score (with a 30 % margin), keep the scores
      at or above that threshold (one compare and one nonzero pass), and topk those. If at least k scores pass,
      every score above the true k-th largest passed too, so the values are exactly topk's; otherwise fall back
      to topk.
    Ids of tied scores may differ from topk's, which leaves them undefined too.
    """
    v = x.numel()
    if x.device.type != "cpu":
        return torch.topk(x, k)
    if k < _PREFIX_SAMPLED:
        if 64 * k > v:
            return torch.topk(x, k)
        if _GATHER_SHARE * k * _PREFIX_BLOCK >= v:  # the k best blocks would be a large share of the vocabulary
            return _block_threshold_topk(x, k, _PREFIX_BLOCK)
        return _block_topk(x, k, _PREFIX_BLOCK)
    if 8 * k > v:
        return torch.topk(x, k)
    sample = x[::_STRIDE].contiguous()  # [ceil(v / _STRIDE)]
    rank = min(sample.numel(), int(1.3 * k / _STRIDE) + 16)
    threshold = torch.topk(sample, rank).values[-1]  # [] about the (1.3 k)-th largest score
    ids = (x >= threshold).nonzero().squeeze(1)  # [m] ascending ids; m >= k in all but rare cases
    if ids.numel() < k:
        return torch.topk(x, k)
    return _topk_among(x, ids, k)


# --------------------------------------------------------------------------------------------------------------
# How many of the highest scores core/steps/select.py takes for top-k / top-p.


def first_prefix(x: torch.Tensor, hs: torch.Tensor, top_p: float) -> int:
    """How many of the highest scores to try first for top-p alone; a guess, checked by `enough` and widened.

    The nucleus of top_p runs at roughly 0.4 / (1 - top_p) times the perplexity exp(H) (measured on normal, Zipf
    and Gumbel scores), so guess 1.5 times that from the entropy (reading it back is free on CPU). On CPU the cost
    of `top_prefix` grows with k, so a close guess pays (against rounding every guess above 192 up to V / 64:
    docs/design-record.md, "Top-n without torch.topk"). On accelerators topk barely depends on
    k and a sync costs more.
    """
    if x.numel() <= PREFIX_MIN:
        return PREFIX_MIN
    if x.device.type != "cpu":
        return _DEVICE_PREFIX
    guess = math.exp(min(float(hs), 30.0)) * 0.4 / (1.0 - top_p)  # NaN scores: nan, then PREFIX_MIN
    if not guess > PREFIX_MIN / 1.5:
        return PREFIX_MIN
    return int(1.5 * guess)


def wider_prefix(k: int, vocab: int, prefix_mass: float, last_prob: float, xs: torch.Tensor, top_k: int,
                 top_p: float) -> int:
    """Next prefix size after one that did not hold the whole kept set (flat distributions, many ties), given the
    probability mass (after temperature and top-k) the prefix held and its last entry's probability.

    At least four times the last try and V / 64, so that one widening is almost always the last; from half the
    vocabulary on, a topk costs a full sort, so take it all.
    """
    if top_k:
        kth = torch.topk(xs, top_k).values[-1]  # the warper's own threshold, after temperature
        return min(vocab, int((xs >= kth).sum()) + TIE_MARGIN)  # extra syncs, only on this rare path
    # Every token past the prefix weighs at most the prefix's last one, so at least `need` more are needed; real
    # tails decay, so ask for several times that.
    missing = top_p - prefix_mass
    need = math.ceil(missing / last_prob) if last_prob > 0 else vocab
    k = max(4 * k, k + 8 * need, vocab // 64 + 1)
    return vocab if k >= vocab // 2 else k
