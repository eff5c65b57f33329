"""The logit lens: at which depth the model settles on its next token.

For the current step, each decoder block's output (the residual stream after block i, at the last position) is put
through what the model itself does after its last block — its final norm (RMSNorm, LayerNorm, Gemma's (1 + weight)
RMSNorm: the model's own module is called), OPT's projection where it has one, the LM head (tied or not, with its
bias), then what the model does to the head's output (Gemma 2's soft-cap, Cohere's logit_scale, Granite's
logits_scaling: core/model/architecture.py `logits_ops`) — as if the model ended there; the top token of that
distribution and its probability are one row. The last row is therefore the model's own output distribution.

Which parts: core/model/architecture.py finds them in the module tree for any decoder family (the blocks' list,
the final norm under its many names, the output embeddings), and the block outputs are caught with forward hooks
on the blocks, last position only, so the lens does not depend on how a family fills `output_hidden_states`.

Checked as it runs: the first time the lens runs on a model, its last row is compared with the step's own logits
(`verify`); a model that does something after its last block that tokentui does not know (a multiplier, a cap)
fails that comparison, and the run goes on without the lens, saying so once (a Notice), instead of showing rows
that are not the model's. Also refused with a one-line reason: a model whose blocks or head are not where
`model_parts` looks (`lens_support`), and a run under --compile, whose compiled decode step returns no states.

Cost: one LM-head product per layer per step ([L, hidden] x [hidden, vocab], one matrix product for all layers), on
top of the forward; the engine computes it after the forward, so it counts in a step's `latency_ms`, not its
`forward_ms`. Measured in BENCHMARKS.md. Off by default (`RunOptions.logit_lens`).
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch

from ...runs.events import LensRow
from ..decode.adapter import call_model, forward_all_logits
from ..architecture import Parts, logits_ops, model_parts
from ..quant.ggml_linear import PRODUCT_ROWS

__all__ = ["LensRow", "forward_all_states", "forward_last_states", "lens_logits", "lens_support", "lens_top", "lens_unavailable",
           "logit_lens", "verify"]

# per model: None (the lens's last row reproduced the model's output), or why it did not
_VERDICTS: "weakref.WeakKeyDictionary[object, str | None]" = weakref.WeakKeyDictionary()


def _head_input(head) -> tuple[torch.device, torch.dtype]:
    """Where and in what dtype the LM head takes its input. A ggml head (core/model/quant/ggml_linear.py) takes
    float32 on the CPU, and its `weight` is a float32 copy made on demand, so it is not read."""
    if getattr(head, "matrix", None) is not None:
        return head.matrix.raw.device, torch.float32
    return head.weight.device, head.weight.dtype


def lens_support(model) -> str | None:
    """None when the logit lens can run on `model`, else the reason, as one line."""
    parts = model_parts(model)
    if isinstance(parts, str):
        return f"the logit lens needs the decoder blocks and the LM head, and {parts}"
    return _VERDICTS.get(model)


def lens_unavailable(model, compiled: bool) -> str | None:
    """Why a run asked for the lens runs without it (None: it runs with it); the text of the engine's Notice."""
    reason = lens_support(model)
    if reason is None and compiled:
        reason = "the logit lens is not available with --compile (the compiled decode step returns no hidden states)"
    return None if reason is None else f"{reason}: running without it"


@torch.inference_mode()
def forward_last_states(model, input_ids: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
    """core/model/decode/adapter.py's `forward_last_logits`, with each decoder block's output caught at the last position
    by a forward hook (registered for this forward only).

    input_ids: [1, T] int64 on the model's input device  ->  (logits [V], states [L, H] in the model's dtype)
    """
    rows, logits = _with_block_outputs(model, lambda hidden: hidden[0, -1],  # [H] of [1, T, H]
                                       lambda: call_model(model, input_ids, cache).logits[0, -1])
    return logits, torch.stack(rows)  # the stack copies the rows: the blocks' outputs are not kept


@torch.inference_mode()
def forward_all_states(model, input_ids: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
    """core/model/decode/adapter.py's `forward_all_logits` (every position's scores: a scored text's one forward), with each
    decoder block's output caught at every position.

    input_ids: [1, T] int64 on the model's input device  ->  (logits [T, V], states [T, L, H] in the model's dtype)
    """
    rows, logits = _with_block_outputs(model, lambda hidden: hidden[0],  # [T, H] of [1, T, H]
                                       lambda: forward_all_logits(model, input_ids, cache))
    return logits, torch.stack(rows, dim=1)  # [T, L, H]


def _with_block_outputs(model, pick, forward):
    """(what `pick` takes of each decoder block's output during `forward()`, in block order; forward's result)."""
    parts = model_parts(model)
    if isinstance(parts, str):
        raise ValueError(parts)
    rows: list[torch.Tensor] = []

    def keep(module, args, output):
        hidden = output[0] if isinstance(output, (tuple, list)) else output  # [1, T, H]
        rows.append(pick(hidden))

    handles = [block.register_forward_hook(keep) for block in parts.layers]
    try:
        result = forward()
    finally:
        for handle in handles:
            handle.remove()
    return rows, result


@torch.inference_mode()
def lens_logits(model, states: torch.Tensor) -> torch.Tensor:
    """states [L, H] (block outputs, `forward_last_states`) -> float32 logits [L, V]: each row through the final
    norm, the projection, the LM head and the logits' post-processing (the module docstring)."""
    parts: Parts = model_parts(model)  # type: ignore[assignment]  (lens_support said it is one)
    layers = len(parts.layers)
    if states.dim() != 2 or states.shape[0] != layers:
        raise ValueError(f"the logit lens needs {layers} block outputs [L, H], got {tuple(states.shape)}")
    device, dtype = _head_input(parts.head)
    x = states.to(device)[None]  # [1, L, H]: the batch, positions shape the modules expect
    if parts.norm is not None:
        x = parts.norm(x)
    if parts.project is not None:
        x = parts.project(x)
    x = x.to(dtype)
    if getattr(parts.head, "matrix", None) is None:
        logits = parts.head(x)[0].float()  # [L, V]: one matrix product for every layer
    else:  # ggml rows: a few rows at a time, so each row's scores are the step's own (the same 8-bit product)
        logits = torch.cat([parts.head(rows)[0] for rows in x.split(PRODUCT_ROWS, dim=1)]).float()
    for _, op in logits_ops(model):
        logits = op(logits)
    return logits


@torch.inference_mode()
def lens_top(model, states: torch.Tensor) -> tuple[list[int], list[float], torch.Tensor]:
    """states [L, H] -> (top id per layer 1..L, its probability, as Python lists; the last row's log-probabilities
    [V], for `verify`). Probabilities in float32, as selection computes the step's own (core/steps/select.py)."""
    logits = lens_logits(model, states)  # [L, V]
    top = logits.max(dim=-1)  # values, indices: [L]
    norm = torch.logsumexp(logits, dim=-1)  # [L]
    probs = torch.exp(top.values - norm)  # softmax at the top: [L]
    packed = torch.stack([top.indices.to(torch.float64), probs.to(torch.float64)])  # [2, L]: one device->host copy
    ids, ps = packed.tolist()
    return [int(i) for i in ids], ps, logits[-1] - norm[-1]


def verify(model, last_logprobs: torch.Tensor, logits: torch.Tensor) -> str | None:
    """Compare the lens's last row (log-probabilities [V]) with the step's own logits [V]: None when they are the
    same distribution, else the reason. The measure is KL(model ‖ lens) in nats, which a scale or a cap on the
    logits moves even where the distribution is near-uniform (where probabilities barely change); within rounding
    it is ~1e-12 in float32 and below ~1e-2 in 16-bit floats, so the bounds are 1e-5 and 3e-2."""
    ours = last_logprobs.double()
    theirs = torch.log_softmax(logits.double().to(ours.device), dim=-1)
    kl = float((theirs.exp() * (theirs - ours)).sum())
    tol = 1e-5 if logits.dtype == torch.float32 else 3e-2
    if kl <= tol:
        return None
    name = (getattr(model.config, "architectures", None) or [type(model).__name__])[0]
    return (f"the logit lens could not reproduce {name}'s own output from its final norm and LM head (KL "
            f"{kl:.2g} nats: the model does something after them that tokentui does not know)")


def logit_lens(model, states: torch.Tensor, piece: Callable[[int], str] = str,
               logits: torch.Tensor | None = None) -> list[LensRow] | None:
    """One LensRow per decoder layer (layer 1..L, top token and probability) for the step whose block outputs are
    `states` [L, H] (`forward_last_states`). `piece(id)` gives each token's display text (the engine passes
    core/steps/detokenize.py's `display_piece`). With the step's own `logits`, the first call on a model checks the
    last row against them (`verify`); None when that fails (and `lens_support` says why from then on)."""
    ids, probs, last = lens_top(model, states)
    if logits is not None and model not in _VERDICTS:
        _VERDICTS[model] = verify(model, last, logits)
    if _VERDICTS.get(model) is not None:
        return None
    return [LensRow(layer=n, id=i, piece=piece(i), prob=p) for n, (i, p) in enumerate(zip(ids, probs), 1)]
