"""Step 4 of generation, selection: turn the last position's scores into the next token, and say why.

The post-sampler distribution is, by definition, what transformers' `generate(do_sample=True)` samples from:

    softmax(MinP(min_p)(TopP(top_p)(TopK(top_k)(Temperature(temperature)(logits)))))

(the chain of core/samplers.py, in its order; a stage that is off is left out).

`reference_probs` computes exactly that with transformers' own warpers over the whole vocabulary. `select` gets the
same distribution without sorting the vocabulary (a full sort of a 151,936-entry vocabulary on one CPU core costs
a good part of a decode step: docs/design-record.md, "Selection without a sort"): only the highest-scoring tokens
can survive top-k / top-p / min-p, so it takes `torch.topk` of a prefix, normalises with one O(V) softmax, and widens the prefix only when the kept set does not end inside it.
Sampling inside the kept prefix, renormalised, is the same distribution as sampling the whole vocabulary after the
warpers: every token past the prefix has probability 0 there.

The topk of a prefix and of the reported candidates goes through core/steps/topn.py, exact and cheaper on CPU.

On a CPU where tokentui's native library builds, `select` is one C++ call instead (core/model/native/select.cpp,
`native_op`): the same distribution, report and packed vector, the same noise from the same generator stream, the
kept set found by a histogram of the scores instead of topk passes. The torch operations below run everywhere
else (accelerators, no compiler, and a step with a stage the C++ call lacks: min-p) and are held to the same oracles
(tests/unit/test_select.py runs both paths; tests/unit/test_sampler_chain.py all three backends).

Everything runs on the scores' device. The numbers a step reports are packed into one small vector and moved to the
host with a single `.tolist()` (one device sync per step on CUDA; more only when the prefix has to be widened),
through the caller's `to_host` when given (the engine's core/model/observe/timing.py times that copy and counts its bytes).
The sampler's shape rides in the same vector: the entropy after temperature and before any cut, and how many
entries top-k and then top-p kept. Nothing here imports textual.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from ..errors import GenerationError
from ..samplers import ChainInput, backend_gaps
from ..settings import SamplerSettings
from .select_chain import select_chain
from .selection import (_ENOUGH, _FINITE, _HEADER, _LAST_PROB, _NAN_MESSAGE, _PREFIX_MASS, Selection,  # noqa: F401
                        _entropy, _pack, _scaled_entropy, _scores, _shape, _softmax, _unpack, draw_noise,
                        draw_uniforms, exp_noise, race_index, unpack)
from .stages import chain
from .topn import PREFIX_MIN, TIE_MARGIN, first_prefix, best_prefix, top_scores, wider_prefix

__all__ = ["Selection", "candidate_logits", "select", "reference_probs", "draw_noise", "draw_uniforms", "exp_noise",
           "race_index", "unpack"]

# --------------------------------------------------------------------------------------------------------------
# The oracle: transformers' warpers over the whole vocabulary.


def reference_probs(logits: torch.Tensor, settings: SamplerSettings, given: ChainInput | None = None) -> torch.Tensor:
    """The post-sampler distribution exactly as transformers' generate computes it (the stages it lacks: as
    llama.cpp does, core/steps/penalties.py); [V] float32. `given`: the run's tokens so far and stage state.

    Greedy is one-hot on torch.argmax (first index on ties), like generate(do_sample=False). It sorts the whole
    vocabulary: the tests' oracle and a slow path, not what a decode step runs.
    """
    return chain(_scores(logits), settings, report=False, given=given)[0]  # each stage, in order


# --------------------------------------------------------------------------------------------------------------
# Fast path.


def select(
    logits: torch.Tensor,
    settings: SamplerSettings,
    generator: torch.Generator | None,
    top_n: int = 10,
    to_host: Callable[[torch.Tensor], list] | None = None,
    native: bool | None = None,
    given: ChainInput | None = None,
) -> Selection:
    """Pick the next token from the last position's scores ([V] or [1, V], any float dtype).

    Greedy: torch.argmax of the raw scores. Sampling: an exponential race over the kept tokens (`race_index`) with
    noise drawn from `generator` (on the scores' device; None uses torch's global RNG), so a seeded generator
    replays a run, and the compiled whole step (core/model/decode/fused_step.py) draws the same token from the same noise.
    `to_host(packed)`: the device-to-host copy of the packed numbers (default `packed.tolist()`).
    On CPU one C++ call does it all (`native_op`) where tokentui's library builds; `native=False` runs the torch
    operations below instead (the same distribution and report: tests compare both with the warpers), `native=True`
    insists on the C++ call. A step with a stage or an order the prefix path below lacks (the penalties, DRY,
    XTC ... : `backend_gaps(settings, "fused")`) runs the whole chain (core/steps/select_chain.py: one C++ call of
    its own on CPU, core/model/native/select_chain.cpp, else core/steps/stages.py `run_chain`), reading `given`
    (the run's tokens so far, Mirostat's state), and draws from the same per-id noise. A step whose settings use a
    stage neither C++ call takes (core/samplers.py `backend_gaps`: min-p beside the classic stages alone, where the
    chain's C++ call would run top-p over the whole vocabulary) runs the torch prefix path.
    Raises GenerationError when the scores hold NaN or ±inf.
    """
    with torch.inference_mode():  # no autograd bookkeeping: a step is ~60 small ops, each cheaper this way
        on_cpu = logits.device.type == "cpu" and (generator is None or generator.device.type == "cpu")
        gaps = backend_gaps(settings, "native")  # a stage the C++ calls lack: this step runs the torch operations
        op = native_op() if native is not False and on_cpu and not gaps else None
        if native and op is None:
            raise RuntimeError("select(native=True): " + (f"the native selection has no {', '.join(gaps)}" if gaps
                               else "tokentui's native library is not available here"))
        if backend_gaps(settings, "fused"):  # what only the whole chain has: its C++ call, or torch's
            return select_chain(logits, settings, generator, top_n, to_host or _tolist, given or ChainInput(),
                                op=None if op is None else torch.ops.tokentui_q4.select_chain)
        if op is not None:
            return _select_native(op, logits, settings, generator, top_n, to_host or _tolist)
        return _select(logits, settings, generator, top_n, to_host or _tolist)


def candidate_logits(logits: torch.Tensor, ids: list[int]) -> list[float]:
    """The raw scores the chain read (`_scores`: float32, before temperature) of the reported candidates `ids`: a
    gather of a few entries and one small copy to the host, after the selection's own (kept out of the packed
    vector, which the native and compiled selections write too)."""
    with torch.inference_mode():
        x = logits.reshape(-1)
        at = torch.tensor(ids, dtype=torch.long, device=x.device)
        return x.index_select(0, at).to(torch.float32).tolist()


@functools.cache
def native_op() -> Callable | None:
    """The one-call CPU selection (core/model/native/select.cpp), or None where tokentui's native library does not
    build (no compiler, no AVX2); the torch path below is then the only one. Loading it builds the library the first
    time (the model's load does that first, as a stage of its own: core/model/load/loader.py)."""
    from ..model.native.q4_native import NativeQ4  # the library's one owner

    return None if NativeQ4.unavailable() else torch.ops.tokentui_q4.select


def _select_native(op: Callable, logits: torch.Tensor, settings: SamplerSettings, generator: torch.Generator | None,
                   top_n: int, to_host: Callable[[torch.Tensor], list]) -> Selection:
    """`_select`'s result from one C++ call: the same packed vector, the same noise per token id from the same
    generator stream (core/model/native/select.cpp says how it finds the kept set without sorting)."""
    x = _scores(logits).contiguous()  # [V] float32
    vocab = x.numel()
    n = max(0, min(int(top_n), vocab))
    greedy = settings.is_greedy
    top_k, all_k, top_p = _cuts(settings, vocab)
    packed = op(x, 1.0 if greedy else float(settings.temperature), top_k, top_p, n, greedy, generator)
    return _unpack(to_host(packed), n, greedy=greedy, all_k=None if greedy else all_k)


def _cuts(settings: SamplerSettings, vocab: int) -> tuple[int, int | None, float]:
    """(top_k, all_k, top_p) as both paths apply them: top_k 0 when off, and top_k >= V keeps everything, so it is
    off too, with all_k = V (what top-k reports it kept; None otherwise); top_p 1.0 when off."""
    top_k = settings.top_k if 0 < settings.top_k < vocab else 0
    all_k = vocab if settings.top_k >= vocab else None
    top_p = float(settings.top_p) if settings.top_p < 1.0 else 1.0
    return top_k, all_k, top_p


def _tolist(packed: torch.Tensor) -> list:
    return packed.tolist()


def _select(logits: torch.Tensor, settings: SamplerSettings, generator: torch.Generator | None, top_n: int,
            to_host: Callable[[torch.Tensor], list]):
    x = _scores(logits)  # [V] float32
    vocab = x.numel()
    n = max(0, min(int(top_n), vocab))
    if settings.is_greedy:
        return _unpack(to_host(_greedy(x, n)), n, greedy=True)

    temperature = float(settings.temperature)
    assert temperature > 0, "temperature must be > 0 when sampling (0 means greedy)"
    top_k, all_k, top_p = _cuts(settings, vocab)
    min_p = float(settings.min_p)  # 0: off
    uniforms = draw_uniforms(generator, vocab, x.device)  # [V] the step's one draw (exp_noise makes it Exp(1))
    xs = x if temperature == 1.0 else x / temperature  # [V] TemperatureLogitsWarper: scores / temperature
    gap = x.amax() - x  # [V] >= 0, shared by both entropies
    p = _softmax(x)  # [V] raw probabilities
    h = _entropy(p, gap)  # [] nats; NaN unless every score is finite: the NaN/inf check, read back with the rest
    if top_k:  # the top-k set is renormalised on its own: no full-vocabulary softmax after temperature needed
        ps = None
        hs = h if xs is x else _scaled_entropy(gap, temperature)  # the shape reported, not needed to sample
        k = max(PREFIX_MIN, top_k + TIE_MARGIN)
    else:
        ps = p if xs is x else _softmax(xs)  # [V] probabilities after temperature
        hs = h if xs is x else _entropy(ps, gap, temperature)  # [] nats, after temperature, before any cut
        if top_p >= 1.0 and not min_p:  # nothing is cut: sample the whole vocabulary
            return _unpack(to_host(_sample_all(x, p, ps, h, hs, exp_noise(uniforms), n)), n, greedy=False,
                           all_k=all_k)
        if top_p >= 1.0:  # min-p alone keeps every entry within a factor min_p of the top one: count them
            k = max(PREFIX_MIN, int((ps >= min_p * ps.amax()).sum()) + TIE_MARGIN)
        else:
            k = first_prefix(x, hs, top_p)
    k = min(vocab, max(n, k))
    while True:  # a widened prefix draws from the same noise: one draw per step, whatever the prefix
        packed = _sample_prefix(x, xs, p, ps, h, hs, uniforms, n, k, temperature, top_k, top_p, min_p)
        values = to_host(packed)  # the step's single host transfer
        if not values[_FINITE]:
            raise GenerationError(_NAN_MESSAGE)
        if values[_ENOUGH] or k == vocab:
            return _unpack(values, n, greedy=False, all_k=all_k)
        if not top_k and top_p >= 1.0:  # min-p alone, its count off by rounding: rare, take four times as many
            k = min(vocab, 4 * k)
            continue
        k = wider_prefix(k, vocab, values[_PREFIX_MASS], values[_LAST_PROB], xs, top_k, top_p)


def _greedy(x: torch.Tensor, n: int) -> torch.Tensor:
    """Argmax, as generate(do_sample=False): torch.argmax, first index on ties; one-hot post-sampler distribution."""
    p = _softmax(x)  # [V] raw probabilities
    h = _entropy(p, x.amax() - x)  # []
    top_vals, top_ids = top_scores(x, min(x.numel(), max(n, 2)))  # [>= n] by raw score, descending
    token = _first_argmax(x, top_vals, top_ids)  # [1]
    top_ids = top_ids[:n]
    raw = p.index_select(0, torch.cat([token, top_ids]))  # [1 + n]
    zero, one = torch.zeros_like(h), torch.ones_like(h)
    flags = torch.stack([torch.isfinite(h), one.bool()])
    ints = torch.cat([token, torch.zeros_like(token), torch.ones_like(token)])  # rank 0, kept count 1
    floats = torch.cat([raw[:1], one[None], raw[:1], torch.stack([h, zero, zero, zero])])
    post = (top_ids == token).to(torch.float32)
    return _pack(flags, ints, floats, _shape(zero, None, None), top_ids, raw[1:], post)


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
    p: torch.Tensor,
    ps: torch.Tensor,
    h: torch.Tensor,
    hs: torch.Tensor,
    noise: torch.Tensor,  # [V] Exp(1), per token id (draw_noise)
    n: int,
) -> torch.Tensor:
    """No top-k / top-p: sample the whole vocabulary from softmax(x / temperature).

    On CPU, reading a flag back costs nothing, and two checks save whole-vocabulary passes (docs/design-record.md, "Selection without a sort"): the
    NaN/inf check before
    sampling instead of masking the probabilities, and, when no probability underflowed to 0 (the usual case),
    every token is kept, with mass sum(p). On accelerators everything stays on the device until the one transfer.
    """
    finite = torch.isfinite(h + hs)  # [] the NaN/inf check (either entropy is NaN for non-finite scores)
    on_cpu = x.device.type == "cpu"
    if on_cpu and not bool(finite):
        raise GenerationError(_NAN_MESSAGE)
    token = race_index(ps if on_cpu else torch.where(finite, ps, 1.0), noise)  # [1]
    top_ids = top_scores(x, n)[1]  # [n]
    at = torch.cat([token, top_ids])  # [1 + n]
    raw, post = p.index_select(0, at), ps.index_select(0, at)
    flags = torch.stack([finite, finite])  # the kept set (everything) always "ends inside"
    rank = torch.count_nonzero(x > x.index_select(0, token))  # []
    if on_cpu and bool(ps.min() > 0):
        kept, mass = torch.tensor(x.numel()), p.sum()
    else:  # at low temperature the far tail underflows to exactly 0: those tokens cannot be drawn
        nonzero = ps > 0  # [V]
        kept, mass = nonzero.sum(), torch.where(nonzero, p, 0.0).sum()  # (sum reduces pairwise; a dot drifts)
    ints = torch.cat([token, torch.stack([rank, kept])])
    floats = torch.cat([raw[:1], post[:1], torch.stack([mass, h, hs, torch.ones_like(h), torch.zeros_like(h)])])
    return _pack(flags, ints, floats, _shape(hs, None, None), top_ids, raw[1:], post[1:])


def _sample_prefix(
    x: torch.Tensor,
    xs: torch.Tensor,
    p: torch.Tensor,
    ps: torch.Tensor | None,
    h: torch.Tensor,
    hs: torch.Tensor,
    uniforms: torch.Tensor,  # [V] per token id (draw_uniforms), left as they are
    n: int,
    k: int,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float = 0.0,
) -> torch.Tensor:
    """Apply top-k / top-p / min-p and sample inside the k highest raw scores; report whether the kept set ends
    inside.

    Dividing by a positive temperature never reorders scores (rounding is monotone), so the raw topk order is also
    the order after temperature, and the k-th largest scaled score is the k-th largest raw one, divided.
    """
    raw_vals, idx = best_prefix(x, k)  # [k] descending raw scores, their ids
    vals = raw_vals if xs is x else raw_vals / temperature  # [k] scaled exactly as xs = x / temperature
    shifted = vals - vals[0]  # [k] <= 0: exponents relative to the top score, as softmax computes them
    unnorm = shifted.exp()  # [k]
    keep = enough = k_kept = p_kept = None  # [k] bool, [] bool (whether the kept set ends inside the prefix; k == V:
    # the loop knows), the entries top-k keeps and top-p then keeps: [] int64, or None for a cut that is off
    if top_k:
        # TopKLogitsWarper: keep every score >= the k-th largest, ties included. All of them are in the prefix
        # iff the prefix's last score is already below it.
        kth = vals[top_k - 1]
        keep = vals >= kth
        k_kept = keep.sum()
        enough = vals[-1] < kth
        q = torch.where(keep, unnorm, 0.0)
        q = q / q.sum()  # [k] probabilities after temperature and top-k
    else:
        q = ps.index_select(0, idx)  # [k] probabilities after temperature, normalised over the whole vocabulary
    prefix_mass = q.sum()
    if top_p < 1.0:
        # TopPLogitsWarper, read in descending order: keep a token iff the mass of the tokens before it < top_p;
        # the top token has 0 before it, so it always stays. Every token past the prefix has at least the
        # prefix's whole mass before it.
        nucleus = torch.cumsum(q, dim=-1) - q < top_p  # exclusive cumulative mass < top_p
        keep = nucleus if keep is None else keep & nucleus
        p_kept = keep.sum()
        if enough is None:
            enough = prefix_mass >= top_p
    kept = torch.where(keep, unnorm, 0.0) if keep is not None else unnorm  # [k]
    z = kept.sum()  # [] >= 1: the top token is always kept
    probs = kept / z  # [k] post-sampler probabilities, 0 where cut
    if min_p:
        # MinPLogitsWarper, on what top-k / top-p left: keep a token iff its probability >= min_p times the top
        # one's (the top token always stays). Alone, it keeps a set of the highest scores, all inside the prefix
        # iff the prefix's last entry is already cut.
        floor = probs >= min_p * probs[0]
        if enough is None:
            enough = ~floor[-1]
        kept = torch.where(floor, kept, 0.0)
        z = kept.sum()
        probs = kept / z
    # The NaN/inf check: h is NaN unless the scores are finite; z also catches scores that overflow once divided
    # by a tiny temperature.
    ok = torch.isfinite(h + z)
    j = race_index(torch.where(ok, probs, 1.0), exp_noise(uniforms.index_select(0, idx)))  # [1] in the prefix
    nonzero = probs > 0
    raw = p.index_select(0, idx)  # [k] raw probabilities
    chosen = torch.stack([raw_vals, raw, probs]).index_select(1, j)[:, 0]  # [3] raw score, raw prob, prob
    rank = (raw_vals > chosen[0]).sum()  # every raw score above the chosen one is inside the prefix
    flags = torch.stack([ok, enough])
    ints = torch.cat([idx.index_select(0, j), torch.stack([rank, nonzero.sum()])])
    h_post = z.log() - torch.dot(probs, shifted)  # entropy of the kept set: -sum probs * (shifted - log z)
    mass = torch.where(nonzero, raw, 0.0).sum()
    floats = torch.cat([chosen[1:], torch.stack([mass, h, h_post, prefix_mass, q[-1]])])
    return _pack(flags, ints, floats, _shape(hs, k_kept, p_kept), idx[:n], raw[:n], probs[:n])
