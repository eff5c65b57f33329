"""Weight layout for CPU decode: wide projections stored transposed, so a decode step reads them faster.

Why: a decode step multiplies one activation row by every weight matrix, and on CPU PyTorch hands that to MKL's
sgemm with the weight as stored by `nn.Linear`, [out, in] row-major. For *wide* matrices (out >= 2 * in: the MLP's
gate and up projections and the vocabulary head) MKL streams them much faster when the same numbers are stored
[in, out] row-major; narrow or square matrices gain nothing or lose, so they keep the stock layout. Prefill (many
rows at once) measured the same either way. The figures per matrix shape and for a whole step: docs/design-record.md,
"The weight layout".

How: the same values, only the storage order changes. `weight.data` becomes the transpose of a contiguous [in, out]
tensor, i.e. a non-contiguous [out, in] view, so every caller — `F.linear`, transformers' own forward, `generate`,
a tied input embedding that shares the Parameter — still sees the same [out, in] weight. `F.linear` then multiplies
by the contiguous [in, out] storage directly. Nothing is copied twice: the old storage is freed (except while one
matrix is being copied).

Cost: a copy of those matrices once per load (the engine uses every core for it). In a fresh process it also pays
the first touch of the loaded weights and page faults on the new memory, which makes a warm launch slower than
with `--weight-layout stock` (same section of BENCHMARKS.md). It is done at load, not after the first token, so
that every run, prefill included, computes with one layout and a seed replays exactly.

What it changes: MKL sums in another order, so scores differ from the stock layout by float rounding; greedy IDs are checked against `generate` on a stock-layout copy in tests/unit/test_weight_layout.py and by the
benchmark. Only float32 CPU weights are touched (what was measured); CUDA, half precision and quantized or
offloaded weights keep their layout. `--weight-layout stock` turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WIDE_RATIO = 2  # out_features >= WIDE_RATIO * in_features counts as wide (see the table above)
LAYOUTS = ("auto", "stock")


@dataclass(frozen=True)
class LayoutReport:
    """What `transpose_wide_weights` did: matrices re-laid and their bytes."""

    matrices: int = 0
    bytes: int = 0

    def describe_work(self) -> str:
        """The progress line while re-laying (reads after the dashboard's "loading")."""
        return (f"re-laying {self.matrices} wide matrices ({self.bytes / 2**20:.0f} MiB) for a faster CPU decode "
                "(same values)")

    def describe(self) -> str:
        if not self.matrices:
            return "weights: stock layout"
        return (f"weights: {self.matrices} wide matrices ({self.bytes / 2**20:.0f} MiB) stored transposed "
                "for a faster CPU decode (same values)")


def is_wide_cpu_linear(module: torch.nn.Module) -> bool:
    """An nn.Linear whose float32 CPU weight is wide and still in the stock [out, in] row-major layout."""
    if not isinstance(module, torch.nn.Linear):
        return False
    weight = module.weight
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
            and weight.shape[0] >= WIDE_RATIO * weight.shape[1] and weight.is_contiguous())


def _wide_weights(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The wide float32 CPU weights still in the stock layout, each once (a tied weight is one Parameter)."""
    found: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        if is_wide_cpu_linear(module):
            found.setdefault(id(module.weight), module.weight)
    return list(found.values())


def plan_wide_weights(model: torch.nn.Module) -> LayoutReport:
    """What `transpose_wide_weights` would re-lay, without touching the model (for a progress line before it)."""
    weights = _wide_weights(model)
    return LayoutReport(len(weights), sum(w.nbytes for w in weights))


def transpose_wide_weights(model: torch.nn.Module) -> LayoutReport:
    """Store every wide float32 CPU nn.Linear weight of `model` as the transpose of a contiguous [in, out] tensor,
    in place; tied weights (one Parameter) stay tied. Idempotent: an already re-laid weight is not contiguous."""
    matrices = size = 0
    seen: set[int] = set()
    for module in model.modules():
        if not is_wide_cpu_linear(module) or id(module.weight) in seen:
            continue
        weight = module.weight
        seen.add(id(weight))
        with torch.no_grad():
            weight.data = weight.data.t().contiguous().t()  # [out, in] view of [in, out] storage
        matrices += 1
        size += weight.nbytes
    return LayoutReport(matrices, size)
