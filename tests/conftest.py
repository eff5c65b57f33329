"""Shared fixtures. The embedded model is converted once per test session into a private cache folder (the
conversion itself is under test), then shared read-only by the tests that need a real model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from llama_server_fixture import llama_server, llama_server_factory  # noqa: F401

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def isolated_dirs(tmp_path_factory) -> dict[str, Path]:
    """Cache/state/config dirs for this test session; exported so CLI subprocesses use them too."""
    base = tmp_path_factory.mktemp("tokentui-home")
    dirs = {"TOKENTUI_CACHE_DIR": base / "cache", "TOKENTUI_STATE_DIR": base / "state",
            "TOKENTUI_CONFIG_DIR": base / "config"}
    for key, value in dirs.items():
        os.environ[key] = str(value)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return dirs


@pytest.fixture(scope="session")
def embedded_cold(isolated_dirs):
    """The embedded model loaded the first time: de-quantized from the GGUF (and cached as safetensors)."""
    from tokentui.core.loader import load_model

    stages = []
    loaded = load_model(None, device="cpu", dtype="float32", progress=stages.append)
    return loaded, stages


@pytest.fixture(scope="session")
def embedded(embedded_cold):
    """The embedded model as every later start loads it: from the safetensors cache."""
    from tokentui.core.loader import load_model

    return load_model(None, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def embedded_stock(embedded_cold):
    """A second copy that no Engine is ever given: engines store wide weights transposed (core/layout.py), so
    oracles that must run on the model exactly as transformers loads it use this one."""
    from tokentui.core.loader import load_model

    return load_model(None, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def smol_tokenizer(embedded):
    return embedded.tokenizer


def tiny_model(kind: str, tokenizer, **overrides):
    """A random-weight causal LM of a given architecture, sized to run in milliseconds, sharing the
    embedded model's tokenizer (vocab 49,152) so prompts and chat templates are real."""
    import torch
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    common.update(overrides)
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[kind]
    if kind == "qwen3":
        common.setdefault("head_dim", 32)
    model = model_cls(config_cls(**common)).eval()
    model.config.architectures = [model_cls.__name__]
    return model


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread: on a shared two-core box a second thread that gets descheduled stalls every O(V) op.
    (Modules that time or compare O(V) work use it: `pytestmark = pytest.mark.usefixtures("one_torch_thread")`.)"""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_gpt2(tokenizer):
    """A random-weight GPT-2: an architecture the logit lens does not support (core/lens.py: Llama, Qwen2,
    Qwen3), with the embedded model's tokenizer."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(tokenizer), n_positions=256,
                                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.config.architectures = ["GPT2LMHeadModel"]
    return model
