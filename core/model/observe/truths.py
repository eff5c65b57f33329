"""The small truths of core/runs/truths.py read off a loaded model: the embedding table as the model holds it (a
ggml table's format and blocks, or a tensor's dtype and bytes), the rotary embedding's base, scaling and first
inverse frequencies (its module's own buffer), the norms' epsilon (the final norm module's own). Called once at load
(core/model/load/model_facts.py); anything a model does not show is left None, never guessed."""

from __future__ import annotations

import torch
from torch import nn

from ...runs.truths import ROPE_PAIRS, ModelTruths
from ..architecture import decoder_config, model_parts

__all__ = ["model_truths"]

EPS_NAMES = ("variance_epsilon", "eps", "epsilon")  # where norm modules keep their epsilon (Llama's, Gemma's, torch's)


def model_truths(model, norm: str | None = None) -> ModelTruths:
    """What `model` itself says; `norm`: the blocks' norm kind as core/model/model_anatomy.py's anatomy names it."""
    rows, cols, fmt, nbytes = _embedding(model.get_input_embeddings())
    theta, rope_type, inv, dims = _rope(model)
    return ModelTruths(embed_rows=rows, embed_cols=cols, embed_format=fmt, embed_bytes=nbytes, rope_theta=theta,
                       rope_type=rope_type, rope_inv_freq=inv, rope_dims=dims, norm=norm or None,
                       norm_eps=_norm_eps(model))


def _embedding(module) -> tuple[int | None, int | None, str | None, int | None]:
    """(rows, columns, format, bytes) of the input embedding table as held; Nones where it is not a table."""
    matrix = getattr(module, "matrix", None)  # a GGMLEmbedding: the file's blocks (its `weight` is a copy)
    if matrix is not None and hasattr(matrix, "raw"):
        return int(matrix.rows), int(matrix.cols), str(matrix.type_name), int(matrix.raw.numel())
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.is_meta or weight.dim() != 2:
        return None, None, None, None
    rows, cols = weight.shape
    return int(rows), int(cols), str(weight.dtype).removeprefix("torch."), int(weight.numel() * weight.element_size())


def _rope(model) -> tuple[float | None, str | None, list[float], int | None]:
    """(base, scaling type, the first pairs' inverse frequencies, rotated dims) of the model's rotary embedding;
    a model with several (Gemma 3: one per layer type) gives its full-attention one."""
    parts = model_parts(model)
    if isinstance(parts, str):
        return None, None, [], None
    rotary = getattr(parts.parent, "rotary_emb", None)
    if not isinstance(rotary, nn.Module):
        return None, None, [], None
    cfg = decoder_config(model)
    params = getattr(cfg, "rope_parameters", None) or {}
    inv = getattr(rotary, "inv_freq", None)
    if not isinstance(inv, torch.Tensor):  # one buffer per layer type: the full-attention one, else the first
        kinds = [name.removesuffix("_inv_freq") for name, _ in rotary.named_buffers(recurse=False)
                 if name.endswith("_inv_freq") and not name.endswith("original_inv_freq")]
        kind = "full_attention" if "full_attention" in kinds else (kinds[0] if kinds else None)
        inv = getattr(rotary, f"{kind}_inv_freq", None) if kind else None
        if isinstance(params, dict) and isinstance(params.get(kind), dict):
            params = params[kind]
    if not isinstance(inv, torch.Tensor) or inv.is_meta:
        return None, None, [], None
    if not isinstance(params, dict):
        params = {}
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None))
    rope_type = params.get("rope_type") or getattr(rotary, "rope_type", None)
    first = inv.detach().reshape(-1)[:ROPE_PAIRS].to(device="cpu", dtype=torch.float32).tolist()
    return (float(theta) if isinstance(theta, (int, float)) and theta > 0 else None,
            str(rope_type) if rope_type else None, first, 2 * int(inv.numel()))


def _norm_eps(model) -> float | None:
    """The final norm module's epsilon (the blocks' norms are built with the same config value)."""
    parts = model_parts(model)
    if isinstance(parts, str) or parts.norm is None:
        return None
    for name in EPS_NAMES:
        value = getattr(parts.norm, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None
