"""core/model/native/rope.py's RopeTable against the families' own rotary modules: the same cos / sin, bit for bit, for
the default rope and the scaled types transformers computes once (linear, llama3, yarn), from the family's config
and from its values read back into transformers' base config class (as a GGUF's later start reads them:
core/model/load/gguf_direct.py's step_config); the types whose frequencies change with the positions seen are
refused in one line."""

from __future__ import annotations

import pytest
import torch
import transformers

from tokentui.core.model.load.gguf_direct import full_config, step_config
from tokentui.core.model.native.rope import RopeTable

FAMILIES = {
    "llama": (transformers.LlamaConfig, "transformers.models.llama.modeling_llama", "LlamaRotaryEmbedding"),
    "mistral": (transformers.MistralConfig, "transformers.models.mistral.modeling_mistral", "MistralRotaryEmbedding"),
    "qwen2": (transformers.Qwen2Config, "transformers.models.qwen2.modeling_qwen2", "Qwen2RotaryEmbedding"),
    "qwen3": (transformers.Qwen3Config, "transformers.models.qwen3.modeling_qwen3", "Qwen3RotaryEmbedding"),
}
ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
}


def config_of(family: str, rope: str, theta: float = 10000.0):
    config_cls = FAMILIES[family][0]
    parameters = {"rope_theta": theta, "rope_type": "default"} if ROPES[rope] is None \
        else {"rope_theta": theta, **ROPES[rope]}
    return config_cls(hidden_size=96, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                      num_hidden_layers=1, vocab_size=64, max_position_embeddings=1024, rope_parameters=parameters)


def module_of(family: str, config):
    import importlib

    _, module, name = FAMILIES[family]
    return getattr(importlib.import_module(module), name)(config)


@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_table_is_the_rotary_modules_bit_for_bit(family, rope):
    config = config_of(family, rope, theta=1_000_000.0 if family == "qwen3" else 10_000.0)
    module = module_of(family, config)
    positions = torch.tensor([[0, 1, 7, 100, 1023, 4095]])
    for x in (torch.zeros(1, 1, dtype=torch.float32), torch.zeros(1, 1, dtype=torch.bfloat16)):
        expected = module(x, positions)
        for table in (RopeTable(config), RopeTable(step_config(full_config(config)))):
            got = table(x, positions)
            assert got[0].dtype == x.dtype and got[0].shape == expected[0].shape
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    if rope != "default":  # the scaled types do move the frequencies: a table that ignored them would differ
        plain = RopeTable(config_of(family, "default"))(torch.zeros(1, 1), positions)
        assert not torch.equal(plain[0], expected[0])


def test_another_theta_moves_the_table():
    """A table that ignored the config's theta would pass the test above for one theta only."""
    positions = torch.arange(64).unsqueeze(0)
    a = RopeTable(config_of("qwen3", "default", theta=10_000.0))(torch.zeros(1, 1), positions)
    b = RopeTable(config_of("qwen3", "default", theta=1_000_000.0))(torch.zeros(1, 1), positions)
    assert not torch.equal(a[0], b[0])


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_a_rope_that_changes_with_the_positions_seen_is_refused_in_one_line(kind):
    config = config_of("llama", "default")
    config.rope_parameters = {"rope_theta": 10000.0, "rope_type": kind, "factor": 2.0}
    with pytest.raises(ValueError, match=f"its rope type '{kind}' changes with the positions seen") as err:
        RopeTable(config)
    assert "\n" not in str(err.value)
