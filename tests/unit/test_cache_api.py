"""The engine's calls into transformers' cache API on whatever transformers is installed (core/model/decode/
adapter.py adapts to it: the forward's cache keyword became `cache` in 5.24, and the old names draw a FutureWarning
on every call, which in headless mode lands among the user's output and must never reach the dashboard's screen).
scripts/try_newest.py runs these against other releases."""

from __future__ import annotations

import warnings

import pytest
import torch

from arch_matrix import build
from tokentui.core.model.decode.adapter import forward_all_logits, new_cache
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.runs.events import StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _deprecations(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))
            and "deprecated" in str(w.message)]


# attention, a state-space model (its keyword was `cache_params`), Falcon's new decoder, a linear-attention hybrid
@pytest.mark.parametrize("name", ["llama", "mamba", "falcon_new", "qwen3_next"])
def test_a_greedy_decode_and_a_scored_forward_draw_no_deprecation_warning(name, smol_tokenizer):
    model = build(name, smol_tokenizer)
    loaded = LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name="tiny"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        events = list(Engine(loaded, SamplerSettings(temperature=0),
                             RunOptions(max_new_tokens=4, ignore_eos=True)).run("Hi"))
        with torch.inference_mode():
            forward_all_logits(model, torch.tensor([[100, 101, 102]]), new_cache(model))
    assert len([e for e in events if isinstance(e, StepEvent)]) == 4
    assert _deprecations(caught) == []
