"""The decode plan (core/model/decode/plan.py): which decode step an engine chooses, once, for a model, and why (the
model facts' `decode_plan`, which the model panel shows); that the chosen step's greedy ids are `generate`'s; and
that no run leaves attributes of tokentui's on transformers' cache object (what a run knows about its cache lives
on its RunCache, core/model/decode/run_cache.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, StaticCache

from arch_matrix import build
from test_native_step import quantized_tiny
from tiny_models import INIT, assert_engine_is_the_oracle, generate_ids, tiny_model
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.model.native import native_step as native
from tokentui.core.model.native.q4_native import NativeQ4
from tokentui.core.model.speed import SpeedOptions
from tokentui.core.runs.events import PromptEvent, StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings

GREEDY = SamplerSettings(temperature=0)
PROMPT = "Is OpenAI open?"
NATIVE_BUILDS = NativeQ4.unavailable() is None

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _engine(model, tokenizer, steps: int = 12, **speed) -> Engine:
    loaded = LoadedModel(model=model, tokenizer=tokenizer, facts=model_facts(model, tokenizer, name="tiny"))
    return Engine(loaded, GREEDY, RunOptions(max_new_tokens=steps, ignore_eos=True), speed=SpeedOptions(**speed))


def _run(engine: Engine) -> tuple[list[int], list[StepEvent]]:
    events = list(engine.run(PROMPT))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    return prompt.ids, [e for e in events if isinstance(e, StepEvent)]


def _fresh_keys(kv, model) -> set[str]:
    """The attributes transformers' own cache of that class has, made as tokentui makes it."""
    if isinstance(kv, StaticCache):
        return set(StaticCache(config=model.config, max_cache_len=256).__dict__)
    return set(DynamicCache(config=model.config).__dict__)


def _held_kv(engine: Engine):
    held = engine.take_held_cache()
    assert held is not None
    return held.cache.kv


# --------------------------------------------------------------------------------------------- which plan
@pytest.mark.skipif(not NATIVE_BUILDS, reason=f"tokentui's native library: {NativeQ4.unavailable()}")
def test_the_embedded_4bit_gguf_decodes_natively_and_says_so(embedded_quantized):
    engine = Engine(embedded_quantized, GREEDY, RunOptions(max_new_tokens=3, ignore_eos=True),
                    speed=SpeedOptions(threads=1))
    blocks = embedded_quantized.facts.quantization.blocks
    assert engine.plan.step.name == "native step"
    assert engine.facts.decode_plan == f"native step: {blocks} weights as stored; lens via torch"


def test_a_float_tiny_llama_decodes_through_transformers_forward(smol_tokenizer):
    engine = _engine(tiny_model("llama", smol_tokenizer), smol_tokenizer, kv_shapes="dynamic")
    assert engine.plan.step.name == "transformers' forward"
    assert engine.facts.decode_plan == "transformers' forward: float weights; dynamic cache; lens via torch"
    bucketed = _engine(tiny_model("llama", smol_tokenizer), smol_tokenizer, kv_shapes="bucketed")
    assert bucketed.facts.decode_plan == "transformers' forward: float weights; bucketed cache; lens via torch"


def test_a_mamba_decodes_eagerly_on_a_dynamic_cache_and_says_why(smol_tokenizer):
    engine = _engine(build("mamba", smol_tokenizer), smol_tokenizer, kv_shapes="bucketed")
    assert engine.plan.step.name == "transformers' forward"
    assert engine.facts.decode_plan == (
        "transformers' forward: float weights; dynamic cache (not bucketed: this model keeps only a recurrent state "
        "(the Mamba family), which has one shape already); lens via torch")
    ids, steps = _run(engine)  # and it decodes as generate does
    assert [s.id for s in steps] == generate_ids(engine.model, ids, len(steps), stop_at_eos=False)


@pytest.fixture
def eager_backend():
    """--compile's whole step compiled with dynamo's eager backend (tests/arch_matrix.py does the same): the plan,
    the static cache and the fallback are the real ones, in seconds instead of minutes."""
    import tokentui.core.model.decode.compiled as compiled

    settings = compiled.compile_settings
    compiled.compile_settings = lambda device: (dict(fullgraph=True, dynamic=False, backend="eager"), {})
    torch.compiler.reset()
    try:
        yield
    finally:
        compiled.compile_settings = settings


def test_compile_chooses_the_whole_step_and_it_is_generates(smol_tokenizer, eager_backend):
    model = tiny_model("llama", smol_tokenizer, initializer_range=INIT)
    engine = _engine(model, smol_tokenizer, steps=16, compile=True, kv_shapes="dynamic")
    assert engine.plan.step.name == "compiled whole step"
    assert engine.facts.decode_plan == ("compiled whole step: --compile, static cache; longer runs: transformers' "
                                        "forward; no lens")
    ids, steps = _run(engine)
    assert_engine_is_the_oracle(model, ids, steps)
    kv = _held_kv(engine)
    assert isinstance(kv, StaticCache) and set(kv.__dict__) == _fresh_keys(kv, model)


@pytest.mark.skipif(not NATIVE_BUILDS, reason=f"tokentui's native library: {NativeQ4.unavailable()}")
def test_compile_keeps_the_native_step(smol_tokenizer, monkeypatch):
    model = quantized_tiny("llama", smol_tokenizer, NativeQ4.name, monkeypatch, initializer_range=INIT)
    engine = _engine(model, smol_tokenizer, compile=True)
    assert engine.plan.step.name == "native step" and engine.plan.notice.startswith("--compile: this 4-bit model")
    assert engine.facts.decode_plan == "native step: 4-bit weights; --compile keeps it (faster); lens via torch"


# --------------------------------------------------------------------------------------------- the plan's steps
@pytest.mark.skipif(not NATIVE_BUILDS, reason=f"tokentui's native library: {NativeQ4.unavailable()}")
@pytest.mark.parametrize("native_on", [True, False])
def test_the_4bit_steps_give_generates_greedy_ids(smol_tokenizer, monkeypatch, native_on):
    model = quantized_tiny("llama", smol_tokenizer, NativeQ4.name, monkeypatch, initializer_range=INIT)
    if native_on:
        engine = _engine(model, smol_tokenizer, steps=24)
    else:
        with native.disabled(model):
            engine = _engine(model, smol_tokenizer, steps=24)
    assert engine.plan.step.name == ("native step" if native_on else "lean torch step")
    if not native_on:
        assert engine.facts.decode_plan.startswith("lean torch step: 4-bit weights; the native step does not serve it")
    ids, steps = _run(engine)
    assert [s.id for s in steps] == generate_ids(model, ids, len(steps), stop_at_eos=False, vary=True)


@pytest.mark.parametrize("kv_shapes", ["dynamic", "bucketed"])
def test_the_eager_step_gives_generates_greedy_ids(smol_tokenizer, kv_shapes):
    model = tiny_model("qwen2", smol_tokenizer, initializer_range=INIT)
    engine = _engine(model, smol_tokenizer, steps=16, kv_shapes=kv_shapes)
    ids, steps = _run(engine)
    assert_engine_is_the_oracle(model, ids, steps)


# --------------------------------------------------------------------------------------------- the cache object
@pytest.mark.parametrize("name", ["llama", "mamba", "native"])
def test_a_run_sets_no_attributes_on_transformers_cache(smol_tokenizer, monkeypatch, name):
    if name == "native":
        if not NATIVE_BUILDS:
            pytest.skip(f"tokentui's native library: {NativeQ4.unavailable()}")
        model = quantized_tiny("llama", smol_tokenizer, NativeQ4.name, monkeypatch)
    else:
        model = build(name, smol_tokenizer)
    engine = _engine(model, smol_tokenizer, steps=4)
    _run(engine)
    kv = _held_kv(engine)
    assert set(kv.__dict__) == _fresh_keys(kv, model), set(kv.__dict__) - _fresh_keys(kv, model)


# --------------------------------------------------------------------------------------------- the record
def test_the_plan_is_written_to_the_model_event_and_records_without_it_still_read(smol_tokenizer):
    from tokentui.core.runs.facts import ModelFacts
    from tokentui.core.runs.record_reader import event_from_dict

    facts = _engine(tiny_model("llama", smol_tokenizer), smol_tokenizer, kv_shapes="dynamic").facts
    data = facts.to_dict()
    assert data["decode_plan"] == facts.decode_plan
    assert event_from_dict(data).decode_plan == facts.decode_plan
    del data["decode_plan"]  # a record written before the plan was
    old = event_from_dict(data)
    assert isinstance(old, ModelFacts) and old.decode_plan is None
