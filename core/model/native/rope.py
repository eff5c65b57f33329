"""The rotation's cos / sin for a Llama / Mistral / Qwen2 / Qwen3 model from its config alone (`RopeTable`), as the
family's rotary module computes them, without that module.

Why not the module: it lives in the family's modeling file, whose import (transformers' modeling_utils and what it
pulls in) was most of a later start's time to its first token on a GGUF kept as stored (issue 37, BENCHMARKS.md:
"A later start without transformers' model"). The scaled rope types' frequencies come from
transformers' own ROPE_INIT_FUNCTIONS (modeling_rope_utils: transformers imported for them); the default
type's two lines are the four families' `compute_default_rope_parameters` (no transformers import: a later start
of a default-rope model imports none), and the forward is theirs, op for op.
tests/unit/test_rope_table.py holds both to the modules, bit for bit, for the default and the scaled types.
"""

from __future__ import annotations

import torch

__all__ = ["RopeTable"]

# the types whose frequencies change with the positions seen (transformers' dynamic_rope_update): not served here
DYNAMIC = ("dynamic", "longrope")


class RopeTable:
    """`table(x, position_ids) -> (cos, sin)`, each [*position_ids.shape, D] in x's dtype, as the rotary module's
    forward. ValueError (one line) for a config it cannot serve (a dynamic rope type, no rope parameters)."""

    def __init__(self, config):
        params = getattr(config, "rope_parameters", None)
        if not isinstance(params, dict) or "rope_type" not in params:
            raise ValueError("its config has no rope parameters")
        rope_type = params["rope_type"]
        if rope_type in DYNAMIC:
            raise ValueError(f"its rope type {rope_type!r} changes with the positions seen")
        if rope_type == "default":
            base = params["rope_theta"]
            dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            scaling = 1.0
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            from ..decode.adapter import transformers_config

            if rope_type not in ROPE_INIT_FUNCTIONS:
                raise ValueError(f"its rope type {rope_type!r} is not one transformers knows")
            # (a later start's StoredConfig made transformers' own: the init functions call its config's methods)
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](transformers_config(config))
        self.rope_type = rope_type
        self.inv_freq = inv_freq.to(torch.float)  # [D / 2]
        self.attention_scaling = scaling

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)
