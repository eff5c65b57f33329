"""What each sublayer adds to the residual stream at the step's query position (issue 39's second view).

Forward hooks, registered for the forwards a capture is active in (as the logit lens's, core/model/observe/lens.py):
on each decoder block, its input (the stream entering: `resid_before`) and its output (leaving: `resid_after`), and
on the module whose output the block adds to the stream for the MLP: the family's post-feed-forward norm where it has
one (Gemma 2 and 3, OLMo 2: it scales the MLP's output before the add), else the MLP (or mixture of experts) itself.
What attention added is the rest: after - before - MLP's. That holds for a sequential block (x + attn, then + mlp)
and for a parallel one (x + attn + mlp from the same input: GPT-J, Falcon, Cohere); every family transformers has adds
both into the stream, so no per-family table of where attention's output is normed. Each vector is taken at the last
position, as float32, at the moment its hook runs (Falcon adds attention's output into the MLP's tensor in place).

The logit lens's top token after each sublayer: the stream after attention (before + attention's) and after the
MLP (the block's output) through the final norm and head, as the lens reads it (core/model/observe/lens.py
`lens_top`); only when the lens is on (it costs one head product per row).

Checked: tests/unit/test_sublayers.py against forward hooks on the HF modules themselves (the attention module's
output, post-norm applied where the family has one); the last row's stream, normed and through the head, is the
step's logits (the lens's own check).
"""

from __future__ import annotations

from typing import Callable

import torch

from ...runs.attention import SublayerRow
from ...runs.events import LensRow
from ..architecture import MLPS, model_parts
from .attention import has_state_only
from .lens import lens_top

__all__ = ["SublayerCapture", "sublayer_rows", "sublayers_unavailable"]

_MLP_OUTPUT = ("post_feedforward_layernorm",) + MLPS  # the first a block has: the MLP's contribution


def _mlp_module(block):
    for name in _MLP_OUTPUT:
        module = getattr(block, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    return None


def sublayers_unavailable(model) -> str | None:
    """Why the sublayer norms of `model` cannot be shown (one line), None when they can."""
    if has_state_only(model):
        return "this model has no attention or MLP sublayers (a state-space model: one mixer per layer)"
    parts = model_parts(model)
    if isinstance(parts, str):
        return f"the sublayer view needs the decoder blocks, and {parts}"
    missing = [n for n, block in enumerate(parts.layers, 1) if _mlp_module(block) is None]
    if missing:
        return (f"decoder layer {missing[0]} has no MLP tokentui can find ({', '.join(_MLP_OUTPUT)}): "
                "the sublayer view cannot split its output")
    return None


def _last(tensor) -> torch.Tensor:
    hidden = tensor[0] if isinstance(tensor, (tuple, list)) else tensor  # [1, T, H]
    return hidden[0, -1].detach().float().clone()  # [H]: its own copy (see the module docstring)


class SublayerCapture:
    """While active (`with capture:`), every decoder block's stream before / after and its MLP's contribution at the
    last position of each forward (a later forward replaces them). `take()` gives the SublayerRows."""

    def __init__(self, model):
        self.model = model
        self._blocks = list(model_parts(model).layers)
        self._handles: list = []
        self._before: dict[int, torch.Tensor] = {}
        self._after: dict[int, torch.Tensor] = {}
        self._mlp: dict[int, torch.Tensor] = {}

    def __enter__(self) -> "SublayerCapture":
        for n, block in enumerate(self._blocks, 1):
            self._handles.append(block.register_forward_pre_hook(self._keep_input(n), with_kwargs=True))
            self._handles.append(block.register_forward_hook(self._keep(self._after, n)))
            self._handles.append(_mlp_module(block).register_forward_hook(self._keep(self._mlp, n)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _keep_input(self, n: int):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs.get("hidden_states")
            if hidden is not None:
                self._before[n] = _last(hidden)

        return hook

    def _keep(self, into: dict, n: int):
        def hook(module, args, output):
            into[n] = _last(output)

        return hook

    @property
    def caught(self) -> bool:
        return bool(self._after)

    def take(self, lens_rows: list[LensRow] | None = None,
             piece: Callable[[int], str] | None = None) -> list[SublayerRow] | None:
        """The caught forward's rows, layer 1..L (None when a block's input or output was not caught); clears
        them. With the lens's rows for this step (`lens_rows`, None: the lens is off) and `piece` (an id's
        display text), each row also gets the lens's top token after attention and after the MLP."""
        before, after, mlp = self._before, self._after, self._mlp
        self._before, self._after, self._mlp = {}, {}, {}
        layers = range(1, len(self._blocks) + 1)
        if any(n not in before or n not in after or n not in mlp for n in layers):
            return None
        b = torch.stack([before[n] for n in layers])  # [L, H]
        a = torch.stack([after[n] for n in layers])
        m = torch.stack([mlp[n] for n in layers])
        return sublayer_rows(self.model, b, a - m - b, m, a, lens_rows, piece)


def sublayer_rows(model, before: torch.Tensor, attn: torch.Tensor, mlp: torch.Tensor, after: torch.Tensor,
                  lens_rows: list[LensRow] | None, piece: Callable[[int], str] | None) -> list[SublayerRow]:
    """SublayerRows, layer 1..L, from each layer's stream entering it, attention's and the MLP's contributions and
    the stream leaving it (each [L, H] float32); with the lens's rows and `piece`, each row's lens tokens too
    (SublayerCapture.take says which)."""
    layers = range(1, before.shape[0] + 1)
    norms = torch.stack([before.norm(dim=-1), attn.norm(dim=-1), mlp.norm(dim=-1), after.norm(dim=-1)]).tolist()
    mid_rows: list[LensRow | None] = [None] * len(layers)
    if lens_rows is not None and piece is not None and len(lens_rows) == len(layers):
        ids, probs, _ = lens_top(model, after - mlp)  # the stream after attention, before the MLP
        mid_rows = [LensRow(layer=n, id=i, piece=piece(i), prob=p) for n, i, p in zip(layers, ids, probs)]
    return [SublayerRow(layer=n, resid_before=norms[0][k], attn_norm=norms[1][k], mlp_norm=norms[2][k],
                        resid_after=norms[3][k], after_attn=mid_rows[k],
                        after_mlp=lens_rows[k] if lens_rows is not None and mid_rows[k] is not None else None)
            for k, n in enumerate(layers)]
