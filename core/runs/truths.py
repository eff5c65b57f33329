"""Small truths about a model's parts that the seeds name (issue 39, item 3), torch-free: the embedding table's shape,
format and bytes as the model holds it, RoPE's base and scaling and the first pairs' inverse frequencies, the
norms' epsilon. core/model/observe/truths.py reads them off a loaded model (its modules' own tensors and buffers,
not the config's claims where a module says otherwise); the one-pass panel shows them (tui/panels/truths_text.py).

A field left None (a list left empty) is not known: a served model's facts carry no truths at all, an older
record's neither, and a model without rotary positions has no RoPE figures. Nothing here is estimated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["ModelTruths", "rope_angles"]

ROPE_PAIRS = 3  # inverse frequencies kept: the first pairs of dimensions the panel shows


@dataclass(frozen=True, slots=True)
class ModelTruths:
    """What the one-pass panel adds to the stages' shapes. `embed_format`: the table's dtype as torch names it
    ("float32", "bfloat16") or the ggml format its rows are held in ("Q8_0", "Q6_K"); `embed_bytes`: the bytes of
    the table as held (a ggml table's blocks, a tensor's nbytes). `rope_theta`: the rotary base of the model's
    (first) rotary embedding; `rope_type`: its scaling ("default" for none); `rope_inv_freq`: the inverse
    frequencies of its first pairs of dimensions, the module's own float32 buffer (scaling included), so that
    pair i turns by position × rope_inv_freq[i] radians, as transformers' rotary embedding computes it;
    `rope_dims`: the dimensions of a head it rotates. `norm`: the blocks' norm ("RMSNorm", "LayerNorm"), `norm_eps`
    the epsilon its modules add to the variance."""

    embed_rows: int | None = None
    embed_cols: int | None = None
    embed_format: str | None = None
    embed_bytes: int | None = None
    rope_theta: float | None = None
    rope_type: str | None = None
    rope_inv_freq: list[float] = field(default_factory=list)
    rope_dims: int | None = None
    norm: str | None = None
    norm_eps: float | None = None

    def __post_init__(self) -> None:
        for name in ("embed_rows", "embed_cols", "embed_bytes", "rope_dims"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"ModelTruths.{name} must be a positive integer or None, got {value!r}")
        if self.rope_theta is not None and not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ValueError(f"ModelTruths.rope_theta must be a positive number or None, got {self.rope_theta!r}")
        if self.norm_eps is not None and not (math.isfinite(self.norm_eps) and self.norm_eps >= 0):
            raise ValueError(f"ModelTruths.norm_eps must be a number >= 0 or None, got {self.norm_eps!r}")
        if any(not (math.isfinite(f) and f >= 0) for f in self.rope_inv_freq):
            raise ValueError(f"ModelTruths.rope_inv_freq must hold finite numbers >= 0, got {self.rope_inv_freq}")


def rope_angles(truths: ModelTruths, position: int) -> list[float]:
    """The rotation angle, in radians (not reduced), of each of the first pairs at `position`: position × the
    pair's inverse frequency (position_ids × inv_freq in transformers' rotary embedding). Empty: not known."""
    if position < 0:
        raise ValueError(f"a position is >= 0, got {position}")
    return [position * f for f in truths.rope_inv_freq]
