"""Step 4 of generation, selection: turn the last position's scores into the next token, and say why.

The post-sampler distribution is, by definition, what transformers' `generate(do_sample=True)` samples from:

    softmax(TopP(top_p)(TopK(top_k)(Temperature(temperature)(logits))))

`reference_probs` computes exactly that with transformers' own warpers, over the whole vocabulary. `select` gets
the same distribution without sorting the vocabulary (a full sort of 151,936 scores costs ~15 ms on two CPU cores,
a quarter of a decode step): only the highest-scoring prefix can survive top-k / top-p, so it takes `torch.topk` of
a small prefix, normalises with an O(V) log-softmax, and widens the prefix only when the kept set does not end
inside it. Sampling inside the kept prefix (renormalised) is the same distribution as sampling the full vocabulary
after the warpers, since every token outside the prefix has probability 0 there.

Everything runs on the scores' device; all the numbers a step reports are packed into one small vector and moved to
the host with a single `.tolist()` (one device sync per step on CUDA; a second one only when the prefix had to be
widened). Nothing here imports textual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import GenerationError
from .settings import SamplerSettings

__all__ = ["Selection", "select", "reference_probs", "entropy_bits", "PREFIX_MIN"]

PREFIX_MIN = 64  # first prefix tried: topk(64) over 151,936 scores costs about as much as topk(10)
_TIE_MARGIN = 8  # extra prefix slots past top_k, so a few ties at the k-th score need no widening
_LN2 = math.log(2.0)
_NAN_MESSAGE = (
    "the model produced NaN/inf scores (numerical overflow: try another dtype, e.g. --dtype float32, or another model)"
)


@dataclass(frozen=True, slots=True)
class Selection:
    """What step 4 chose and what it looked like, as plain Python numbers (already on the host)."""

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
# Reference (slow path, the oracle): transformers' warpers over the whole vocabulary.


def reference_probs(logits: torch.Tensor, settings: SamplerSettings) -> torch.Tensor:
    """The post-sampler distribution exactly as transformers' generate computes it; [V] float32.

    Greedy is one-hot on torch.argmax (first index on ties), like generate(do_sample=False). Sorts the whole
    vocabulary, so it is the tests' oracle and a slow path, not what a decode step runs.
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


def entropy_bits(logits: torch.Tensor) -> float:
    """Entropy of softmax(logits) in bits (a convenience; `select` reports it without an extra sync)."""
    _, h = _log_softmax_entropy(_scores(logits))
    return float(h) / _LN2


# --------------------------------------------------------------------------------------------------------------
# Fast path.


def select(
    logits: torch.Tensor,
    settings: SamplerSettings,
    generator: torch.Generator | None,
    top_n: int = 10,
) -> Selection:
    """Pick the next token from the last position's scores ([V] or [1, V], any float dtype).

    Greedy: torch.argmax of the raw scores. Sampling: torch.multinomial over the kept prefix with `generator`
    (which must live on the scores' device; None uses torch's global RNG), so a seeded generator replays a run.
    Raises GenerationError when the scores hold NaN or inf.
    """
    x = _scores(logits)  # [V] float32
    vocab = x.numel()
    n = max(0, min(int(top_n), vocab))
    lsm, h = _log_softmax_entropy(x)  # [V], [] — raw log-probs and entropy (nats); h is NaN if x is not finite
    finite = torch.isfinite(h)  # [] bool: NaN / ±inf anywhere in x makes h NaN (see _log_softmax_entropy)

    if settings.is_greedy:
        return _unpack(_greedy(x, lsm, h, finite, n), n, greedy=True)

    temperature = float(settings.temperature)
    assert temperature > 0, "temperature must be > 0 when sampling (0 means greedy)"
    xs = x if temperature == 1.0 else x / temperature  # [V] — TemperatureLogitsWarper: scores / temperature
    lsm_s = lsm if xs is x else torch.log_softmax(xs, dim=-1)  # [V] log-probs after temperature
    top_k = settings.top_k if 0 < settings.top_k < vocab else 0  # top_k >= V keeps everything: off
    top_p = float(settings.top_p) if settings.top_p < 1.0 else 1.0

    if not top_k and top_p >= 1.0:  # nothing is cut: sample the whole vocabulary
        return _unpack(_sample_all(x, xs, lsm, lsm_s, h, finite, generator, n), n, greedy=False)

    k = min(vocab, max(n, PREFIX_MIN, top_k + _TIE_MARGIN if top_k else 0))
    while True:
        packed, kth = _sample_prefix(x, xs, lsm, lsm_s, h, finite, generator, n, k, temperature, top_k, top_p)
        values = packed.tolist()  # the step's single host transfer
        if not values[_FINITE]:
            raise GenerationError(_NAN_MESSAGE)
        if values[_ENOUGH] or k == vocab:
            return _unpack(values, n, greedy=False)
        k = _wider(k, vocab, values, xs, kth, top_k, top_p)


def _scores(logits: torch.Tensor) -> torch.Tensor:
    """[V] or [1, V] scores of any float dtype -> [V] float32 (all arithmetic here is float32)."""
    assert logits.dim() == 1 or (logits.dim() == 2 and logits.shape[0] == 1), (
        f"select expects the last position's scores, shape [V] or [1, V]; got {tuple(logits.shape)}"
    )
    assert logits.is_floating_point(), f"scores must be a float tensor, got {logits.dtype}"
    assert logits.numel() > 0, "empty scores"
    return logits.reshape(-1).to(torch.float32)


def _log_softmax_entropy(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(x) [V] and its entropy in nats [].

    Doubles as the NaN/inf check at no extra pass: NaN or +inf anywhere makes every log-prob NaN, and a -inf score
    gives p * log p = 0 * -inf = NaN, so the entropy is finite iff every score is.
    """
    lsm = torch.log_softmax(x, dim=-1)  # [V]
    h = -(lsm.exp() * lsm).sum()  # []
    return lsm, h


# Layout of the vector moved to the host: a header of scalars, then top_n ids, raw probs, post-sampler probs.
_FINITE, _ENOUGH, _TOKEN, _RANK, _RAW, _PROB, _KEPT, _MASS, _H, _HS, _PREFIX_MASS, _LAST_PROB = range(12)
_HEADER = 12


def _pack(header: list, ids: torch.Tensor, raw: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """Stack the step's small results into one float vector (float64: exact for any id; float32 on MPS)."""
    dtype = torch.float32 if ids.device.type == "mps" else torch.float64
    device = ids.device
    # torch.full, not torch.tensor: a Python constant must not cost a host-to-device copy (a sync on CUDA).
    head = torch.stack(
        [
            v.to(dtype).reshape(()) if isinstance(v, torch.Tensor) else torch.full((), float(v), dtype=dtype, device=device)
            for v in header
        ]
    )
    return torch.cat([head, ids.to(dtype), raw.to(dtype), post.to(dtype)])


def _unpack(values: list[float] | torch.Tensor, n: int, greedy: bool) -> Selection:
    if isinstance(values, torch.Tensor):
        values = values.tolist()  # the step's single host transfer (greedy / whole-vocabulary paths)
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
        entropy_bits=values[_H] / _LN2,
        sampled_entropy_bits=values[_HS] / _LN2,
        greedy=greedy,
    )


def _greedy(x: torch.Tensor, lsm: torch.Tensor, h: torch.Tensor, finite: torch.Tensor, n: int) -> torch.Tensor:
    """Argmax, as generate(do_sample=False): torch.argmax, first index on ties; one-hot post-sampler distribution."""
    top_vals, top_ids = torch.topk(x, min(x.numel(), max(n, 2)))  # [>=n] by raw score, descending
    token = _first_argmax(x, top_vals, top_ids)  # [1] (1-d: indexing with a 0-d tensor reads it back to the host)
    raw = lsm[token].exp()  # [1]
    top_ids = top_ids[:n]
    zero = torch.zeros((), device=x.device)
    header = [finite, True, token, 0, raw, 1.0, 1, raw, h, zero, zero, zero]
    return _pack(header, top_ids, lsm[top_ids].exp(), (top_ids == token).to(torch.float32))


def _first_argmax(x: torch.Tensor, top_vals: torch.Tensor, top_ids: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x) as [1], reusing a descending topk of x on CPU (saves an O(V) pass there).

    topk orders ties arbitrarily, so take the smallest id among those equal to the maximum; that is argmax's
    answer unless the maximum is tied past the end of the topk. On other devices argmax is cheap and needs no sync.
    """
    if x.device.type == "cpu" and top_vals.numel() > 1 and bool(top_vals[-1] < top_vals[0]):
        return torch.where(top_vals == top_vals[0], top_ids, x.numel()).min().reshape(1)
    return x.argmax().reshape(1)


def _sample_all(
    x: torch.Tensor,
    xs: torch.Tensor,
    lsm: torch.Tensor,
    lsm_s: torch.Tensor,
    h: torch.Tensor,
    finite: torch.Tensor,
    generator: torch.Generator | None,
    n: int,
) -> torch.Tensor:
    """No top-k / top-p: sample the whole vocabulary (two-level multinomial, see _multinomial)."""
    probs = lsm_s.exp()  # [V] post-sampler probabilities
    safe = torch.where(finite, probs, _one_hot(0, probs))  # NaN would make multinomial raise before our check
    token = _multinomial(safe, generator)  # [1]
    nonzero = probs > 0  # [V] bool (at low temperature the far tail underflows to exactly 0)
    h_s = h if xs is x else -torch.where(nonzero, probs * lsm_s, 0.0).sum()
    top_ids = torch.topk(x, n).indices  # [n]
    header = [
        finite,
        True,
        token,
        (x > x[token]).sum(),
        lsm[token].exp(),
        probs[token],
        nonzero.sum(),
        torch.where(nonzero, lsm.exp(), 0.0).sum(),
        h,
        h_s,
        1.0,
        0.0,
    ]
    return _pack(header, top_ids, lsm[top_ids].exp(), probs[top_ids])


def _sample_prefix(
    x: torch.Tensor,
    xs: torch.Tensor,
    lsm: torch.Tensor,
    lsm_s: torch.Tensor,
    h: torch.Tensor,
    finite: torch.Tensor,
    generator: torch.Generator | None,
    n: int,
    k: int,
    temperature: float,
    top_k: int,
    top_p: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Apply top-k / top-p and sample inside the k highest raw scores; report whether the kept set ends inside.

    Dividing by a positive temperature never reorders scores (rounding is monotone), so the raw top-k order is
    also the order after temperature, and the k-th largest scaled score is the k-th largest raw one divided.
    """
    raw_vals, idx = torch.topk(x, k)  # [k] descending raw scores, their ids
    vals = raw_vals if xs is x else raw_vals / temperature  # [k] scaled exactly as xs = x / temperature
    keep = torch.ones(k, dtype=torch.bool, device=x.device)  # [k]
    kth = None
    # [] bool: the kept set ends inside the prefix
    enough = torch.full((), k == x.numel(), dtype=torch.bool, device=x.device)
    # Exponents relative to the top score, as softmax computes them: exact differences, no cancellation error.
    shifted = vals - vals[:1]  # [k] <= 0
    unnorm = shifted.exp()  # [k]
    if top_k:
        # TopKLogitsWarper: keep every score >= the k-th largest, ties included. All of them are in the prefix
        # iff the prefix's last score is already below it.
        kth = vals[top_k - 1]
        keep = vals >= kth
        enough = enough | (vals[-1] < kth)
        q = torch.where(keep, unnorm, 0.0)
        q = q / q.sum()  # [k] probabilities after temperature and top-k
    else:
        q = lsm_s[idx].exp()  # [k] probabilities after temperature, normalised over the whole vocabulary
    prefix_mass = q.sum()
    if top_p < 1.0:
        # TopPLogitsWarper, read in descending order: keep a token iff the mass of the tokens before it < top_p
        # (the top token always). Tokens past the prefix each come after all of its mass.
        before = torch.cat([q.new_zeros(1), torch.cumsum(q, dim=-1)[:-1]])  # [k] exclusive cumulative mass
        nucleus = before < top_p
        nucleus[0] = True
        keep = keep & nucleus
        if not top_k:
            enough = enough | (prefix_mass >= top_p)
    kept = torch.where(keep, unnorm, 0.0)  # [k]
    z = kept.sum()  # [] normaliser of the kept set (relative to the top score)
    probs = kept / z  # [k] post-sampler probabilities, 0 where cut
    logpf = shifted - z.log()  # [k] their logs (used where probs > 0)
    safe = torch.where(finite, probs, _one_hot(0, probs))  # NaN would make multinomial raise before our check
    j = _multinomial(safe, generator)  # [1] position in the prefix
    nonzero = probs > 0
    raw = lsm[idx].exp()  # [k] raw probabilities
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
        -torch.where(nonzero, probs * logpf, 0.0).sum(),
        prefix_mass,
        q[-1],
    ]
    return _pack(header, idx[:n], raw[:n], probs[:n]), kth


def _wider(k: int, vocab: int, values: list[float], xs: torch.Tensor, kth, top_k: int, top_p: float) -> int:
    """Next prefix size after one that did not contain the whole kept set (flat scores, many ties).

    On CPU, topk(k) costs a heap pass while 64 * k <= V and an nth_element plus a sort of k above that, so past
    the first small prefix the next useful size is V / 64; past half the vocabulary a topk costs a full sort.
    """
    if top_k:
        ties = int((xs >= kth).sum())  # a second sync, only on this rare path
        return min(vocab, ties + _TIE_MARGIN)
    # Every token past the prefix weighs at most the prefix's last one, so at least `need` more are needed
    # (a lower bound: real tails decay, hence the factor).
    missing, last = top_p - values[_PREFIX_MASS], values[_LAST_PROB]
    need = math.ceil(missing / last) if last > 0 else vocab
    k = max(4 * k, k + 8 * need, vocab // 64 + 1)
    return vocab if k >= vocab // 2 else k


_BLOCK = 512  # two-level multinomial: blocks of this many probabilities


def _multinomial(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw from `probs` ([m], non-negative, not necessarily normalised) as [1], with torch.multinomial.

    Over a whole vocabulary torch.multinomial costs ~4 ms on CPU. Drawing a block of _BLOCK entries by its mass,
    then an entry inside the block by its probability, is the same distribution (P(block) * P(entry | block) =
    P(entry)) for one O(m) sum and two draws over a few hundred entries.
    """
    m = probs.numel()
    if m <= 8 * _BLOCK:
        return torch.multinomial(probs, 1, generator=generator)
    blocks = torch.nn.functional.pad(probs, (0, -m % _BLOCK)).view(-1, _BLOCK)  # [m / _BLOCK, _BLOCK]
    b = torch.multinomial(blocks.sum(dim=-1), 1, generator=generator)  # [1] which block
    i = torch.multinomial(blocks[b][0], 1, generator=generator)  # [1] which entry in it
    return b * _BLOCK + i


def _one_hot(i: int, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    out[i] = 1.0
    return out
