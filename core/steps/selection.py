"""What step 4 (core/steps/select.py) hands back, and the pieces every selection path shares: the `Selection`, the
packed vector a step's numbers travel to the host in (one copy per step; its layout below, read back by `unpack`:
the torch paths', the native call's and the compiled whole step's), the step's per-id random draw, and the
entropy and softmax helpers. Split from select.py, which chooses the path; nothing here imports textual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import GenerationError
from ..samplers import STAGES

__all__ = ["Selection", "draw_noise", "draw_uniforms", "exp_noise", "race_index", "unpack"]

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
    top_sampled_probs: list[float]  # post-sampler probability for those ids (0.0 where a stage of the chain cut them)
    kept_count: int  # tokens with non-zero post-sampler probability (1 for greedy)
    kept_mass: float  # raw probability mass (softmax at temperature 1) of those tokens
    entropy_bits: float  # entropy of softmax(raw logits), bits
    sampled_entropy_bits: float  # entropy of the post-sampler distribution, bits (0 for greedy)
    greedy: bool
    # The sampler's shape (all None for greedy, which applies no temperature and no cut; StepEvent says the same):
    temp_entropy_bits: float | None = None  # entropy of softmax(logits / T), before top-k / top-p, bits
    top_k_kept: int | None = None  # entries TopKLogitsWarper leaves (ties at the k-th included); None: top-k off
    top_p_kept: int | None = None  # entries left after TopPLogitsWarper (applied after top-k); None: top-p off
    mirostat_mu: float | None = None  # Mirostat 2.0's mu after this step (the next step's ChainInput.mu); None: off

    @property
    def kept_by_stage(self) -> dict[str, int | None]:
        """The per-stage counts by their StepEvent field names (core/samplers.py `Stage.kept`; the last stage's
        count is kept_count), for the step's event."""
        return {stage.kept: getattr(self, stage.kept) for stage in STAGES if stage.kept}


def draw_noise(generator: torch.Generator | None, vocab: int, device: torch.device,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """The step's random draw: [vocab] float32 Exp(1) noise, one value per token id (into `out` when given)."""
    return exp_noise(draw_uniforms(generator, vocab, device, out))


def draw_uniforms(generator: torch.Generator | None, vocab: int, device: torch.device,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """The step's random draw before `exp_noise`: [vocab] float32 uniforms, one per token id. A prefix of the
    vocabulary needs the noise of its own ids only: exp_noise(uniforms[ids]) is draw_noise's value for those ids
    (the same elementwise ops), for a few hundred logarithms instead of a whole vocabulary's."""
    out = torch.empty(vocab, dtype=torch.float32, device=device) if out is None else out
    return out.uniform_(generator=generator)


def exp_noise(uniforms: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise from uniforms, in place: -log(U) (the inverse of Exp(1)'s distribution function). Written out
    instead of Tensor.exponential_, which draws the same distribution ~5x slower on CPU (docs/design-record.md,
    "The draw's noise"): at a 49,152-entry vocabulary that alone was half of a sampled step's selection."""
    # a 0 (U = 1, which a GPU's uniform_ can return) would make a cut token's 0 / 0 a NaN, which argmax would pick
    return uniforms.log_().neg_().clamp_min_(torch.finfo(torch.float32).tiny)


def race_index(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One draw from `probs` ([m], non-negative, not necessarily normalised) given each entry's Exp(1) `noise` [m],
    as [1]: argmax(probs / noise), the exponential race (P(entry i wins) = probs[i] / sum(probs); torch.multinomial
    draws one sample the same way). Hand-written instead of torch.multinomial so that the noise belongs to the
    token id, not to the position in whatever subset is sampled: the eager prefix and the compiled whole-vocabulary
    step (core/model/decode/fused_step.py) then pick the same token from the same seed, and the draw is one O(m) pass
    (one torch.multinomial over a whole vocabulary is slow on CPU: docs/design-record.md, "Selection without a sort").
    The index comes from `max(dim=0)` (the first maximal entry, as argmax gives it), which on CPU is one vectorised
    pass where torch.argmax is several times slower (same section)."""
    return (probs / noise).max(dim=0).indices.reshape(1)


def _scores(logits: torch.Tensor) -> torch.Tensor:
    """[V] or [1, V] scores of any float dtype -> [V] float32 (all arithmetic here is float32)."""
    assert logits.dim() == 1 or (logits.dim() == 2 and logits.shape[0] == 1), (
        f"select expects the last position's scores, shape [V] or [1, V]; got {tuple(logits.shape)}"
    )
    assert logits.is_floating_point(), f"scores must be a float tensor, got {logits.dtype}"
    assert 0 < logits.numel() <= 2**24, "vocabulary size out of range (ids travel to the host as float32)"
    return logits.reshape(-1).to(torch.float32)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    """softmax(x) [V], renormalised by its own sum.

    torch's float32 softmax over one long row accumulates its normaliser lane by lane: at V = 151,936 the
    probabilities come out ~1e-5 too large or small, all by the same factor, enough to move the top-p boundary by
    a token. torch.sum reduces pairwise (~1e-7), so one more pass puts the mass back at 1.
    """
    p = torch.softmax(x, dim=-1)
    return p.div_(p.sum())


def _entropy(p: torch.Tensor, gap: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy in nats of p = softmax(x / temperature), given gap = max(x) - x; a [] tensor, NaN unless x is finite.

    H = -log p_max + sum p * gap / temperature: two non-negative terms, so no cancellation, and two cheap O(V)
    passes on top of the softmax. Doubles as the NaN/inf check: NaN or +inf anywhere makes p NaN, and a -inf score
    gives p * gap = 0 * inf = NaN.
    """
    spread = torch.dot(p, gap)
    return (spread if temperature == 1.0 else spread / temperature) - torch.log(p.amax())


def _scaled_entropy(gap: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy in nats of softmax(x / temperature) from gap = max(x) - x, without keeping the probabilities:
    with e = exp(-gap / T) and Z = sum e, H = log Z + sum e * gap / (T Z) (both terms >= 0). NaN unless x is
    finite, like `_entropy`."""
    e = torch.exp(gap * (-1.0 / temperature))  # [V] in (0, 1], the top score's 1
    z = e.sum()
    return torch.log(z) + torch.dot(e, gap) / (temperature * z)


# Layout of the vector moved to the host: 2 flags, 3 integers, 7 floats, the shape (3), then top_n ids, raw probs,
# post probs.
_FINITE, _ENOUGH, _TOKEN, _RANK, _KEPT, _RAW, _PROB, _MASS, _H, _HS, _PREFIX_MASS, _LAST_PROB = range(12)
_TEMP_H, _K_KEPT, _P_KEPT = 12, 13, 14  # entropy after temperature (nats); kept by top-k, by top-p (-1: off)
_HEADER = 15


def _pack(
    flags: torch.Tensor,  # [2] bool: scores finite, kept set ends inside the prefix
    ints: torch.Tensor,  # [3] int64: token, chosen rank, kept count
    floats: torch.Tensor,  # [7] float32: chosen raw prob, chosen prob, kept raw mass, H, H after sampler, M, q_last
    shape: torch.Tensor,  # [3] float32: H after temperature, top-k kept, top-p kept (-1: that cut is off)
    ids: torch.Tensor,  # [n] int64
    raw: torch.Tensor,  # [n] float32
    post: torch.Tensor,  # [n] float32
) -> torch.Tensor:
    """One float32 vector (exact for ids and counts below 2**24) out of the step's small device tensors."""
    return torch.cat([flags, ints, floats, shape, ids, raw, post]).to(torch.float32)


def _shape(hs: torch.Tensor, k_kept: torch.Tensor | None, p_kept: torch.Tensor | None) -> torch.Tensor:
    """The `shape` part of the packed vector; a count of None (that cut is off) travels as -1."""
    off = torch.full_like(hs, -1.0)
    return torch.stack([hs, off if k_kept is None else k_kept.to(hs.dtype), off if p_kept is None else
                        p_kept.to(hs.dtype)])


def _count(value: float) -> int | None:
    return None if value < 0 else int(value)


def unpack(values: list[float], n: int, greedy: bool) -> Selection:
    """The Selection in a packed vector (the layout above) moved to the host: `select`'s own, or the compiled whole
    step's (core/model/decode/fused_step.py). Raises GenerationError for non-finite scores."""
    return _unpack(values, n, greedy)


def _unpack(values: list[float], n: int, greedy: bool, all_k: int | None = None) -> Selection:
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
        top_sampled_probs=top[2 * n : 3 * n],
        kept_count=int(values[_KEPT]),
        kept_mass=values[_MASS],
        entropy_bits=max(values[_H], 0.0) / _LN2,
        sampled_entropy_bits=max(values[_HS], 0.0) / _LN2,
        greedy=greedy,
        temp_entropy_bits=None if greedy else max(values[_TEMP_H], 0.0) / _LN2,
        top_k_kept=None if greedy else all_k or _count(values[_K_KEPT]),
        top_p_kept=None if greedy else _count(values[_P_KEPT]),
    )
