"""Other architectures end to end: tiny random-weight Llama, Qwen2 and Qwen3 models built from configs here,
saved as a folder (safetensors + the embedded tokenizer) and loaded the way a user's model is; at an init where their
output depends on the context, so `generate`'s ids vary and every step's logits are checked against one full
forward (tests/tiny_models.py's oracles)."""

from __future__ import annotations

import pytest

from tiny_models import INIT, assert_engine_is_the_oracle, tiny_model
from tokentui.core.model.engine import Engine
from tokentui.core.runs.events import DoneEvent, PrefillEvent, PromptEvent, StepEvent
from tokentui.core.model.load.loader import load_model
from tokentui.core.settings import RunOptions, SamplerSettings


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny_folder(request, smol_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    model = tiny_model(request.param, smol_tokenizer, initializer_range=INIT)
    model.save_pretrained(folder)
    smol_tokenizer.save_pretrained(folder)
    return request.param, folder


def test_tiny_models_run_end_to_end(tiny_folder):
    kind, folder = tiny_folder
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    facts = loaded.facts
    assert facts.source == "folder" and facts.layers == 2 and facts.kv_heads == 2
    assert facts.head_dim == (32 if kind == "qwen3" else 16)
    engine = Engine(loaded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=24, ignore_eos=True))
    events = list(engine.run("Is OpenAI open?"))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    prefill = next(e for e in events if isinstance(e, PrefillEvent))
    steps = [e for e in events if isinstance(e, StepEvent)]
    ids = [s.id for s in steps]
    assert_engine_is_the_oracle(loaded.model, prompt.ids, steps)
    per_token = 2 * 2 * 2 * facts.head_dim * 4
    assert facts.kv_bytes_per_token == per_token
    assert prefill.kv_bytes == per_token * len(prompt.ids)
    assert steps[-1].kv_bytes == per_token * (len(prompt.ids) + 23)
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.runs == 24 and done.scores == 24 * facts.vocab_rows
    assert done.text == loaded.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_bfloat16_kv_bytes_use_two_byte_elements(tiny_folder):
    kind, folder = tiny_folder
    loaded = load_model(str(folder), device="cpu", dtype="bfloat16")
    assert loaded.facts.dtype == "bfloat16"
    engine = Engine(loaded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=3, ignore_eos=True))
    steps = [e for e in engine.run("Hi") if isinstance(e, StepEvent)]
    per_token = 2 * 2 * 2 * loaded.facts.head_dim * 2
    assert loaded.facts.kv_bytes_per_token == per_token
    assert steps[-1].kv_bytes == per_token * steps[-1].kv_tokens
