"""The logit lens: at which depth the model settles on its next token.

For the current step, each decoder layer's output (the residual stream after layer i) is put through the model's
own final norm and LM head, as if the model ended there; the top token of that distribution and its probability
are one row. The last row is the model's own output distribution (its top id and probability equal those of
softmax(the step's logits), which tests/unit/test_lens.py checks), so a reader sees at which layer the chosen token
first appears on top.

Which tensor each row uses (transformers' `output_hidden_states`, last position only; L = decoder layers):

    hidden_states[0]          the token embeddings (the input of layer 1): no row (with tied embeddings its lens
                              mostly names the input token itself, which says nothing about the next one)
    hidden_states[i], i < L   the output of decoder layer i (pre-norm residual)  ->  row `layer=i`: norm, LM head
    hidden_states[L]          transformers hands back `last_hidden_state` here, i.e. the output of layer L with the
                              final norm already applied (`tie_last_hidden_states`, on for these families)  ->  row
                              `layer=L`: the LM head alone, so the norm is not applied twice

Supported: the Llama, Qwen2 and Qwen3 families (`model.model.norm`, `model.model.layers`, the output embeddings;
tied or separate LM head alike, since the head is called as the module the model itself calls). Anything else is
refused with a one-line reason (`lens_support`), and the engine then runs without the lens and says so once per run
(a Notice); so does a run under --compile, whose compiled decode step returns no hidden states.

Cost: one LM-head product per layer per step ([L, hidden] x [hidden, vocab], one matrix product for all layers), on
top of the forward; the engine computes it after the forward, so it counts in a step's `latency_ms`, not its
`forward_ms`. Measured in BENCHMARKS.md. Off by default (`RunOptions.logit_lens`).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..runs.events import LensRow

__all__ = ["LensRow", "SUPPORTED", "forward_last_states", "last_position_states", "lens_support", "lens_top",
           "lens_unavailable", "logit_lens"]

SUPPORTED = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}  # config.model_type -> family


def lens_support(model) -> str | None:
    """None when the logit lens works for `model`, else the reason, as one line."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED:
        name = (getattr(config, "architectures", None) or [type(model).__name__])[0]
        return f"the logit lens supports Llama, Qwen2 and Qwen3 models, not {name}"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if getattr(inner, "norm", None) is None or not layers or model.get_output_embeddings() is None:
        return f"the logit lens needs a final norm and an LM head where {SUPPORTED[kind]} models keep them"
    return None


def lens_unavailable(model, compiled: bool) -> str | None:
    """Why a run asked for the lens runs without it (None: it runs with it); the text of the engine's Notice."""
    reason = lens_support(model)
    if reason is None and compiled:
        reason = "the logit lens is not available with --compile (the compiled decode step returns no hidden states)"
    return None if reason is None else f"{reason}: running without it"


@torch.inference_mode()
def forward_last_states(model, input_ids: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
    """core/model/adapter.py's `forward_last_logits` with the hidden states asked for; only the last position is kept.

    input_ids: [1, T] int64 on the model's input device  ->  (logits [V], states [L + 1, H] in the model's dtype)
    """
    out = model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1,
                output_hidden_states=True)
    return out.logits[0, -1], last_position_states(out.hidden_states)


def last_position_states(hidden_states) -> torch.Tensor:
    """transformers' hidden_states, a tuple of L + 1 tensors [1, T, H], -> [L + 1, H] at the last position (a copy
    of those rows only: the full per-layer states of a prefill chunk are not kept)."""
    return torch.stack([h[0, -1] for h in hidden_states])


def _last_is_normed(model) -> bool:
    """Whether hidden_states[L] already has the final norm applied: transformers replaces the last one with
    `last_hidden_state` unless a config sets `tie_last_hidden_states` to False."""
    return getattr(model.config, "tie_last_hidden_states", None) is not False


@torch.inference_mode()
def lens_top(model, states: torch.Tensor) -> tuple[list[int], list[float]]:
    """states [L + 1, H] (see `last_position_states`) -> (top id per layer 1..L, its probability), as Python lists.

    Row i < L: softmax(lm_head(norm(states[i]))); row L: softmax(lm_head(states[L])) when states[L] is already
    normed (module docstring). Probabilities in float32, as selection computes the step's own (core/steps/select.py).
    """
    layers = len(model.model.layers)
    if states.dim() != 2 or states.shape[0] != layers + 1:
        raise ValueError(f"the logit lens needs {layers + 1} hidden states [L + 1, H], got {tuple(states.shape)}")
    norm, head = model.model.norm, model.get_output_embeddings()
    x = states[1:].to(head.weight.device)  # [L, H]: the output of layers 1..L
    if _last_is_normed(model):
        x = torch.cat([norm(x[:-1]), x[-1:]])  # [L, H]
    else:
        x = norm(x)
    logits = head(x).float()  # [L, V]: one matrix product for every layer
    top = logits.max(dim=-1)  # values, indices: [L]
    probs = torch.exp(top.values - torch.logsumexp(logits, dim=-1))  # softmax at the top: [L]
    packed = torch.stack([top.indices.to(torch.float64), probs.to(torch.float64)])  # [2, L]: one device->host copy
    ids, ps = packed.tolist()
    return [int(i) for i in ids], ps


def logit_lens(model, states, piece: Callable[[int], str] = str) -> list[LensRow]:
    """One LensRow per decoder layer (layer 1..L, top token and probability), for the step whose hidden states are
    `states`: the stacked [L + 1, H] tensor from `forward_last_states`, or transformers' tuple of L + 1 [1, T, H].
    `piece(id)` gives each token's display text (the engine passes core/steps/detokenize.py's `display_piece`)."""
    if not isinstance(states, torch.Tensor):
        states = last_position_states(states)
    ids, probs = lens_top(model, states)
    return [LensRow(layer=n, id=i, piece=piece(i), prob=p) for n, (i, p) in enumerate(zip(ids, probs), 1)]
