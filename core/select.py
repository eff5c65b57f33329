"""Step 4 of generation, selection: turn the last position's scores into the next token, and say why.

The post-sampler distribution is, by definition, what transformers' `generate(do_sample=True)` samples from:

    softmax(TopP(top_p)(TopK(top_k)(Temperature(temperature)(logits))))

`reference_probs` computes exactly that with transformers' own warpers over the whole vocabulary. `select` gets the
same distribution without sorting the vocabulary (a full sort of 151,936 scores costs ~14 ms on one CPU core, a
quarter of a decode step): only the highest-scoring tokens can survive top-k / top-p, so it takes `torch.topk` of a
prefix, normalises with one O(V) softmax, and widens the prefix only when the kept set does not end inside it.
Sampling inside the kept prefix, renormalised, is the same distribution as sampling the whole vocabulary after the
warpers: every token past the prefix has probability 0 there.

Everything runs on the scores' device. The numbers a step reports are packed into one small vector and moved to the
host with a single `.tolist()` (one device sync per step on CUDA; more only when the prefix has to be widened).
Nothing here imports textual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import GenerationError
from .settings import SamplerSettings

__all__ = ["Selection", "select", "reference_probs", "sample_index"]

PREFIX_MIN = 64  # first prefix for peaked distributions: on CPU topk(64) costs about what topk(10) does
_TIE_MARGIN = 8  # prefix slots past top_k, so a few scores tied with the k-th need no second try
_PEAKED_PERPLEXITY = 24.0  # exp(entropy) up to which the top-p nucleus almost always fits in PREFIX_MIN
_DEVICE_PREFIX = 1024  # first prefix on accelerators, where topk barely depends on k and a sync costs more
_BLOCK = 512  # sample_index: draw a block of this many entries, then an entry inside it
_LN2 = math.log(2.0)
_NAN_MESSAGE = (
    "the model produced NaN/inf scores (numerical overflow: try another dtype, e.g. --dtype float32, or another model)"
)


@dataclass(frozen=True, slots=True)
class Selection:
    """What step 4 chose and what the distribution looked like, as plain Python numbers."""

    token_id: int
    chosen_rank: int  # 0-based rank among ALL tokens by raw logit = count of logits strictly greater
    chosen_raw_prob: float  # softmax(raw logits)[token]
    chosen_prob: float  # post-sampler probability of the chosen token
    top_ids: list[int]  # top-K ids by raw logit, descending (K = top_n clipped to V)
    top_raw_probs: list[float]  # softmax(raw logits) for those ids
    top_probs: list[float]  # post-sampler probability for those ids (0.0 where cut by top-k / top-p)
    kept_count: int  # tokens with non-zero post-sampler probability (1 for greedy)
    kept_mass: float  # raw probability mass (softmax at temperature 1) of those tokens
    entropy_bits: float  # entropy of softmax(raw logits), bits
    sampled_entropy_bits: float  # entropy of the post-sampler distribution, bits (0 for greedy)
    greedy: bool


# --------------------------------------------------------------------------------------------------------------
# The oracle: transformers' warpers over the whole vocabulary.


def reference_probs(logits: torch.Tensor, settings: SamplerSettings) -> torch.Tensor:
    """The post-sampler distribution exactly as transformers' generate computes it; [V] float32.

    Greedy is one-hot on torch.argmax (first index on ties), like generate(do_sample=False). It sorts the whole
    vocabulary: the tests' oracle and a slow path, not what a decode step runs.
    """
    from transformers.generation.logits_process import (  # heavy import, only where the oracle is wanted
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = _scores(logits).unsqueeze(0)  # [1, V] float32
    if settings.is_greedy:
        return torch.nn.functional.one_hot(scores[0].argmax(), scores.shape[-1]).to(torch.float32)
    assert settings.temperature > 0, "temperature must be > 0 when sampling"
    scores = TemperatureLogitsWarper(settings.temperature)(None, scores)
    if settings.top_k > 0:
        scores = TopKLogitsWarper(settings.top_k)(None, scores)
    if settings.top_p < 1.0:
        scores = TopPLogitsWarper(settings.top_p)(None, scores)
    return torch.softmax(scores, dim=-1)[0]


# --------------------------------------------------------------------------------------------------------------
# Fast path.


def select(
    logits: torch.Tensor,
    settings: SamplerSettings,
    generator: torch.Generator | None,
    top_n: int = 10,
) -> Selection:
    """Pick the next token from the last position's scores ([V] or [1, V], any float dtype).

    Greedy: torch.argmax of the raw scores. Sampling: torch.multinomial over the kept tokens with `generator`
    (on the scores' device; None uses torch's global RNG), so a seeded generator replays a run.
    Raises GenerationError when the scores hold NaN or ±inf.
    """
    x = _scores(logits)  # [V] float32
    vocab = x.numel()
    n = max(0, min(int(top_n), vocab))
    if settings.is_greedy:
        return _unpack(_greedy(x, n), n, greedy=True)

    temperature = float(settings.temperature)
    assert temperature > 0, "temperature must be > 0 when sampling (0 means greedy)"
    top_k = settings.top_k if 0 < settings.top_k < vocab else 0  # top_k >= V keeps everything: off
    top_p = float(settings.top_p) if settings.top_p < 1.0 else 1.0
    xs = x if temperature == 1.0 else x / temperature  # [V] TemperatureLogitsWarper: scores / temperature
    p = torch.softmax(x, dim=-1)  # [V] raw probabilities
    ps = p if xs is x else torch.softmax(xs, dim=-1)  # [V] probabilities after temperature
    h = _entropy(x, p)  # [] nats; NaN unless every score is finite
    hs = h if xs is x else _entropy(xs, ps)  # [] nats, after temperature (before any cut)
    finite = torch.isfinite(h) & torch.isfinite(hs)  # [] bool: the NaN/inf check, read back with the rest

    if not top_k and top_p >= 1.0:  # nothing is cut: sample the whole vocabulary
        return _unpack(_sample_all(x, xs, p, ps, h, hs, finite, generator, n), n, greedy=False)

    if top_k:
        k = max(PREFIX_MIN, top_k + _TIE_MARGIN)
    elif x.device.type != "cpu":
        k = _DEVICE_PREFIX
    else:  # reading the entropy back is free on CPU; a flat distribution would miss PREFIX_MIN and pay twice
        k = PREFIX_MIN if math.exp(min(float(hs), 50.0)) <= _PEAKED_PERPLEXITY else max(PREFIX_MIN, vocab // 64 + 1)
    k = min(vocab, max(n, k))
    while True:
        packed = _sample_prefix(x, xs, p, ps, h, finite, generator, n, k, temperature, top_k, top_p)
        values = packed.tolist()  # the step's single host transfer
        if not values[_FINITE]:
            raise GenerationError(_NAN_MESSAGE)
        if values[_ENOUGH] or k == vocab:
            return _unpack(values, n, greedy=False)
        k = _wider(k, vocab, values, xs, top_k, top_p)


def sample_index(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw from `probs` ([m], non-negative, not necessarily normalised) with torch.multinomial, as [1].

    Over a whole vocabulary one torch.multinomial call costs ~4 ms on CPU. Drawing a block of _BLOCK entries by its
    mass, then an entry inside that block by its probability, is the same distribution (P(block) * P(entry | block)
    = P(entry)) for one O(m) sum and two draws over a few hundred entries.
    """
    m = probs.numel()
    if m <= 8 * _BLOCK:
        return torch.multinomial(probs, 1, generator=generator)
    blocks = torch.nn.functional.pad(probs, (0, -m % _BLOCK)).view(-1, _BLOCK)  # [ceil(m / _BLOCK), _BLOCK]
    b = torch.multinomial(blocks.sum(dim=-1), 1, generator=generator)  # [1] which block
    i = torch.multinomial(blocks[b][0], 1, generator=generator)  # [1] which entry in it
    return b * _BLOCK + i


def _scores(logits: torch.Tensor) -> torch.Tensor:
    """[V] or [1, V] scores of any float dtype -> [V] float32 (all arithmetic here is float32)."""
    assert logits.dim() == 1 or (logits.dim() == 2 and logits.shape[0] == 1), (
        f"select expects the last position's scores, shape [V] or [1, V]; got {tuple(logits.shape)}"
    )
    assert logits.is_floating_point(), f"scores must be a float tensor, got {logits.dtype}"
    assert 0 < logits.numel() <= 2**24, "vocabulary size out of range (ids travel to the host as float32)"
    return logits.reshape(-1).to(torch.float32)


def _entropy(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of p = softmax(x), as a [] tensor; NaN unless every score is finite.

    H = -log p_max + sum p * (max - x): two non-negative terms, so no cancellation, and two cheap O(V) passes on
    top of the softmax. Doubles as the NaN/inf check: NaN or +inf anywhere makes p NaN, and a -inf score gives
    p * (max - x) = 0 * inf = NaN.
    """
    return -torch.log(p.max()) + torch.dot(p, x.max() - x)


# Layout of the vector moved to the host: a header of scalars, then top_n ids, raw probs, post-sampler probs.
_FINITE, _ENOUGH, _TOKEN, _RANK, _RAW, _PROB, _KEPT, _MASS, _H, _HS, _PREFIX_MASS, _LAST_PROB = range(12)
_HEADER = 12


def _pack(header: list[torch.Tensor], ids: torch.Tensor, raw: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """One float32 vector (exact for ids and counts below 2**24) out of the step's small device tensors."""
    return torch.cat([t.reshape(-1) for t in header] + [ids, raw, post]).to(torch.float32)


def _unpack(values: list[float] | torch.Tensor, n: int, greedy: bool) -> Selection:
    if isinstance(values, torch.Tensor):
        values = values.tolist()  # the step's single host transfer (greedy and whole-vocabulary paths)
    if not values[_FINITE]:
        raise GenerationError(_NAN_MESSAGE)
    top = values[_HEADER:]
    return Selection(
        token_id=int(values[_TOKEN]),
        chosen_rank=int(values[_RANK]),
        chosen_raw_prob=values[_RAW],
        chosen_prob=values[_PROB],
        top_ids=[int(i) for i in top[:n]],
        top_raw_probs=top[n : 2 * n],
        top_probs=top[2 * n : 3 * n],
        kept_count=int(values[_KEPT]),
        kept_mass=values[_MASS],
        entropy_bits=max(values[_H], 0.0) / _LN2,
        sampled_entropy_bits=max(values[_HS], 0.0) / _LN2,
        greedy=greedy,
    )


def _greedy(x: torch.Tensor, n: int) -> torch.Tensor:
    """Argmax, as generate(do_sample=False): torch.argmax, first index on ties; one-hot post-sampler distribution."""
    p = torch.softmax(x, dim=-1)  # [V] raw probabilities
    h = _entropy(x, p)  # []
    top_vals, top_ids = torch.topk(x, min(x.numel(), max(n, 2)))  # [>= n] by raw score, descending
    token = _first_argmax(x, top_vals, top_ids)  # [1] (1-d: indexing with a 0-d tensor reads it back to the host)
    raw = p[token]  # [1]
    top_ids = top_ids[:n]
    one, zero = torch.ones_like(h), torch.zeros_like(h)
    header = [torch.isfinite(h), one, token, zero, raw, one, one, raw, h, zero, zero, zero]
    return _pack(header, top_ids, p[top_ids], (top_ids == token).to(torch.float32))


def _first_argmax(x: torch.Tensor, top_vals: torch.Tensor, top_ids: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x) as [1], reusing a descending topk of x on CPU (where argmax is a slow extra O(V) pass).

    topk orders ties arbitrarily, so take the smallest id among those equal to the maximum: argmax's answer unless
    the maximum is tied past the end of the topk. On other devices argmax is cheap and this would cost a sync.
    """
    if x.device.type == "cpu" and top_vals.numel() > 1 and bool(top_vals[-1] < top_vals[0]):
        return torch.where(top_vals == top_vals[0], top_ids, x.numel()).min().reshape(1)
    return x.argmax().reshape(1)


def _sample_all(
    x: torch.Tensor,
    xs: torch.Tensor,
    p: torch.Tensor,
    ps: torch.Tensor,
    h: torch.Tensor,
    hs: torch.Tensor,
    finite: torch.Tensor,
    generator: torch.Generator | None,
    n: int,
) -> torch.Tensor:
    """No top-k / top-p: sample the whole vocabulary from softmax(x / temperature)."""
    token = sample_index(torch.where(finite, ps, _one_hot(0, ps)), generator)  # [1]; NaN would make it raise
    nonzero = ps > 0  # [V] (at low temperature the far tail underflows to exactly 0)
    top_ids = torch.topk(x, n).indices  # [n]
    header = [
        finite,
        finite,  # "enough": always
        token,
        (x > x[token]).sum(),
        p[token],
        ps[token],
        nonzero.sum(),
        torch.where(nonzero, p, 0.0).sum(),
        h,
        hs,
        torch.ones_like(h),
        torch.zeros_like(h),
    ]
    return _pack(header, top_ids, p[top_ids], ps[top_ids])


def _sample_prefix(
    x: torch.Tensor,
    xs: torch.Tensor,
    p: torch.Tensor,
    ps: torch.Tensor,
    h: torch.Tensor,
    finite: torch.Tensor,
    generator: torch.Generator | None,
    n: int,
    k: int,
    temperature: float,
    top_k: int,
    top_p: float,
) -> torch.Tensor:
    """Apply top-k / top-p and sample inside the k highest raw scores; report whether the kept set ends inside.

    Dividing by a positive temperature never reorders scores (rounding is monotone), so the raw topk order is also
    the order after temperature, and the k-th largest scaled score is the k-th largest raw one, divided.
    """
    raw_vals, idx = torch.topk(x, k)  # [k] descending raw scores, their ids
    vals = raw_vals if xs is x else raw_vals / temperature  # [k] scaled exactly as xs = x / temperature
    shifted = vals - vals[:1]  # [k] <= 0: exponents relative to the top score, as softmax computes them
    unnorm = shifted.exp()  # [k]
    enough = torch.full((), k == x.numel(), dtype=torch.bool, device=x.device)  # []: kept set ends inside prefix
    if top_k:
        # TopKLogitsWarper: keep every score >= the k-th largest, ties included. All of them are in the prefix
        # iff the prefix's last score is already below it.
        kth = vals[top_k - 1]
        keep = vals >= kth  # [k]
        enough = enough | (vals[-1] < kth)
        q = torch.where(keep, unnorm, 0.0)
        q = q / q.sum()  # [k] probabilities after temperature and top-k
    else:
        keep = torch.ones(k, dtype=torch.bool, device=x.device)
        q = ps[idx]  # [k] probabilities after temperature, normalised over the whole vocabulary
    prefix_mass = q.sum()
    if top_p < 1.0:
        # TopPLogitsWarper, read in descending order: keep a token iff the mass of the tokens before it < top_p
        # (the top token always). Every token past the prefix has at least the prefix's whole mass before it.
        before = torch.cumsum(q, dim=-1) - q  # [k] exclusive cumulative mass
        nucleus = before < top_p
        nucleus[0] = True
        keep = keep & nucleus
        if not top_k:
            enough = enough | (prefix_mass >= top_p)
    kept = torch.where(keep, unnorm, 0.0)  # [k]
    z = kept.sum()  # [] >= 1: the top token is always kept
    probs = kept / z  # [k] post-sampler probabilities, 0 where cut
    j = sample_index(torch.where(finite, probs, _one_hot(0, probs)), generator)  # [1]; NaN would make it raise
    nonzero = probs > 0
    raw = p[idx]  # [k] raw probabilities
    header = [
        finite,
        enough,
        idx[j],
        (raw_vals > raw_vals[j]).sum(),  # every raw score above the chosen one is inside the prefix
        raw[j],
        probs[j],
        nonzero.sum(),
        torch.where(nonzero, raw, 0.0).sum(),
        h,
        torch.log(z) - torch.dot(probs, shifted),  # entropy of the kept set: -sum probs * (shifted - log z)
        prefix_mass,
        q[-1],
    ]
    return _pack(header, idx[:n], raw[:n], probs[:n])


def _wider(k: int, vocab: int, values: list[float], xs: torch.Tensor, top_k: int, top_p: float) -> int:
    """Next prefix size after one that did not hold the whole kept set (flat distributions, many ties).

    On CPU topk(k) is a heap pass while 64 * k <= V and an nth_element plus a sort of k above that, so past the
    first small prefix the next useful size is V / 64; from half the vocabulary on, a topk costs a full sort.
    """
    if top_k:
        kth = torch.topk(xs, top_k).values[-1]  # the warper's own threshold, after temperature
        return min(vocab, int((xs >= kth).sum()) + _TIE_MARGIN)  # extra syncs, only on this rare path
    # Every token past the prefix weighs at most the prefix's last one, so at least `need` more are needed; real
    # tails decay, so ask for several times that.
    missing, last = top_p - values[_PREFIX_MASS], values[_LAST_PROB]
    need = math.ceil(missing / last) if last > 0 else vocab
    k = max(4 * k, k + 8 * need, vocab // 64 + 1)
    return vocab if k >= vocab // 2 else k


def _one_hot(i: int, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    out[i] = 1.0
    return out
