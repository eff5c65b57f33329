"""Step 4 as fixed-shape tensor code, for `--compile`'s whole step (core/model/decode/compiled.py): forward, selection and
the packing of the step's small result in one compiled function, so that on CUDA one captured graph runs the whole
step and the one host sync is the copy of that small vector.

What it computes is core/steps/select.py's `select`, number for number (the same packed layout, read back by
`select.unpack`), but with shapes that never depend on the data or on the sampler: select.py takes a topk of a
prefix and widens it while the kept set does not end inside (a host round trip, data-dependent shapes); here the
whole vocabulary is sorted once (stable, descending: ties in id order, so position 0 is torch.argmax's first index,
generate's greedy pick) and every cut is a mask over it. The sampler arrives as a tensor (`sampler_tensor`:
temperature, top-k, top-p, greedy, min-p: the stages of core/samplers.py it implements), never as Python numbers, so changing it does not compile again: greedy and
every cut being on or off are `torch.where`s, not branches.

The draw is select.py's exponential race (`race_index`) over noise drawn per token id from the run's seeded
generator outside the graph (dynamo cannot trace a torch.Generator; on CUDA that is one more kernel, no sync): the
same seed gives the same token as the eager path, whose prefix holds the same ids with the same noise.
"""

from __future__ import annotations

import torch

from ...settings import SamplerSettings

__all__ = ["fused_select", "sampler_tensor", "write_sampler"]


def sampler_tensor(device: torch.device) -> torch.Tensor:
    """[5] float32: temperature, top_k (0: off), top_p (1: off), greedy (1 or 0), min_p (0: off); fill with
    `write_sampler`."""
    return torch.zeros(5, dtype=torch.float32, device=device)


def write_sampler(out: torch.Tensor, settings: SamplerSettings) -> None:
    """Put `settings` into a `sampler_tensor` in place (same shape, same address: a compiled graph reads the new
    values without compiling again)."""
    greedy = settings.is_greedy
    values = [1.0 if greedy else float(settings.temperature), float(max(0, settings.top_k)),
              float(settings.top_p) if settings.top_p < 1.0 else 1.0, 1.0 if greedy else 0.0, float(settings.min_p)]
    out.copy_(torch.tensor(values, dtype=torch.float32))


def fused_select(logits: torch.Tensor, sampler: torch.Tensor, noise: torch.Tensor, n: int) -> torch.Tensor:
    """The step's selection, packed: logits [V] (any float dtype), sampler [5] (`sampler_tensor`), noise [V] Exp(1)
    per token id (ignored for greedy) -> [15 + 3n] float32 in select.py's layout (`select.unpack` reads it)."""
    x = logits.reshape(-1).to(torch.float32)  # [V]
    vocab = x.shape[0]
    temperature, top_k, top_p = sampler[0], sampler[1], sampler[2]
    greedy = sampler[3] > 0.5  # []
    min_p = sampler[4]  # [] 0: off
    # The raw distribution (as select.py: renormalised by its own pairwise sum) and its entropy.
    p = torch.softmax(x, dim=-1)
    p = p / p.sum()  # [V]
    gap = x.max() - x
    h = torch.dot(p, gap) - torch.log(p.max())  # [] nats; NaN unless every score is finite
    vals, idx = torch.sort(x, descending=True, stable=True)  # [V] raw scores, ids: ties in id order
    scaled = vals / temperature  # [V] TemperatureLogitsWarper (greedy's temperature is 1: a no-op)
    shifted = scaled - scaled[0]  # [V] <= 0
    e = torch.exp(shifted)  # [V]
    z_t = e.sum()
    h_t = torch.log(z_t) - torch.dot(e / z_t, shifted)  # [] entropy after temperature, before any cut
    # TopKLogitsWarper: every score >= the k-th largest (ties included); off (0) or k >= V keeps everything.
    positions = torch.arange(vocab, device=x.device)
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, float(vocab)).to(torch.long)  # [] in 1..V
    keep_k = scaled >= scaled.gather(0, (k - 1).reshape(1))  # [V]
    q = torch.where(keep_k, e, 0.0)
    q = q / q.sum()  # [V] after temperature and top-k
    # TopPLogitsWarper, read in descending order: a token stays iff the mass before it < top_p (select.py's form).
    nucleus = (torch.cumsum(q, dim=-1) - q < top_p) | (top_p >= 1.0)
    keep = torch.where(greedy, positions == 0, keep_k & nucleus)  # [V]
    kept = torch.where(keep, e, 0.0)
    z = kept.sum()  # [] >= 1: the top token always stays
    probs = kept / z  # [V] post-sampler, in sorted order
    # MinPLogitsWarper on what is left: a token stays iff its probability >= min_p times the top one's (position 0,
    # which always stays); min_p 0 keeps everything, so this is a no-op when off.
    kept = torch.where(probs >= min_p * probs[0], kept, 0.0)
    z = kept.sum()
    probs = kept / z
    ok = torch.isfinite(h + z)
    j = torch.argmax(torch.where(ok, probs, 1.0) / noise.index_select(0, idx))  # the race (select.race_index)
    j = torch.where(greedy, 0, j).reshape(1)  # [1] position in the sorted order
    token = idx.index_select(0, j)  # [1]
    raw_sorted = p.index_select(0, idx)  # [V]
    nonzero = probs > 0
    rank = (vals > vals.index_select(0, j)).sum()  # [] raw scores strictly above the chosen one
    h_post = torch.log(z) - torch.dot(probs, shifted)  # [] entropy of the kept set (0 for greedy)
    mass = torch.where(nonzero, raw_sorted, 0.0).sum()
    off = torch.full_like(h, -1.0)
    k_kept = torch.where(top_k > 0, keep_k.sum().to(torch.float32), off)
    p_kept = torch.where(top_p < 1.0, (keep_k & nucleus).sum().to(torch.float32), off)
    one = torch.ones_like(h)
    header = torch.stack([
        ok.to(torch.float32), one,  # finite; the kept set "ends inside" (the whole vocabulary is looked at)
        token[0].to(torch.float32), rank.to(torch.float32), nonzero.sum().to(torch.float32),
        raw_sorted.index_select(0, j)[0], probs.index_select(0, j)[0], mass, h, h_post, one, torch.zeros_like(h),
        h_t, k_kept, p_kept,
    ])  # [15]
    return torch.cat([header, idx[:n].to(torch.float32), raw_sorted[:n], probs[:n]])
