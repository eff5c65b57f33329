"""The speed paths, each against an oracle: the preallocated KV cache against transformers' DynamicCache (bit for
bit), the thread policy against what torch reports, and the compiled decode step (`--compile`) against
`generate(do_sample=False)` token for token (on tiny models whose output depends on the context, so the ids vary)
and every step's raw logits against one full forward without a cache (teacher-forced, tests/tiny_models.py), with
truthful KV byte counts."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch
from transformers import DynamicCache

from tiny_models import INIT, assert_engine_is_the_oracle, cache_kwargs, generate_ids, tiny_model
from tokentui.core.model.decode.adapter import cache_allocated_nbytes, cache_nbytes, cache_tokens, new_cache
from tokentui.core.model.decode.hf_layers import GrowableLayer
from tokentui.core.model.decode.compiled import MAX_COMPILED_TOKENS, CompiledDecoder, bucket_for
from tokentui.core.model.engine import Engine
from tokentui.core.errors import SettingsError
from tokentui.core.runs.events import DoneEvent, Notice, PrefillEvent, PromptEvent, StepEvent
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.core.model.speed import SpeedOptions, cpu_cores


@pytest.fixture(scope="module")
def tiny(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer, initializer_range=INIT)
    return LoadedModel(model=model, tokenizer=smol_tokenizer, facts=model_facts(model, smol_tokenizer, name="tiny"))


def run(engine, prompt="Is OpenAI open?"):
    events = list(engine.run(prompt))
    return events, [e for e in events if isinstance(e, StepEvent)]


# ---------------------------------------------------------------------------------------------------------------
# The preallocated (growable) cache of the default path.


@pytest.mark.parametrize("capacity", [0, 3, 64])
def test_growable_cache_gives_bit_identical_scores_and_keys(tiny, capacity):
    model = tiny.model
    ids = torch.tensor([list(range(200, 216))])
    ours, theirs = new_cache(model, capacity), DynamicCache(config=model.config)
    assert all(isinstance(layer, GrowableLayer) for layer in ours.layers)
    with torch.inference_mode():
        a = model(input_ids=ids, use_cache=True, **cache_kwargs(model, ours)).logits
        b = model(input_ids=ids, use_cache=True, **cache_kwargs(model, theirs)).logits
        assert torch.equal(a, b)
        for token in range(300, 320):  # grows past every capacity above
            x = torch.tensor([[token]])
            a = model(input_ids=x, use_cache=True, **cache_kwargs(model, ours)).logits
            b = model(input_ids=x, use_cache=True, **cache_kwargs(model, theirs)).logits
            assert torch.equal(a, b)
    assert cache_tokens(ours) == cache_tokens(theirs) == 36
    for mine, ref in zip(ours.layers, theirs.layers):
        assert torch.equal(mine.keys, ref.keys) and torch.equal(mine.values, ref.values)
    assert cache_nbytes(ours) == sum(l.keys.nbytes + l.values.nbytes for l in theirs.layers)
    assert cache_allocated_nbytes(ours) >= cache_nbytes(ours)


def test_growable_cache_crop_and_unsupported_batch_ops(tiny):
    cache = new_cache(tiny.model, 8)
    with torch.inference_mode():
        tiny.model(input_ids=torch.tensor([list(range(100, 110))]), use_cache=True, **cache_kwargs(tiny.model, cache))
    layer = cache.layers[0]
    layer.crop(-4)
    assert layer.get_seq_length() == 6 and layer.keys.shape[-2] == 6
    with pytest.raises(NotImplementedError):
        layer.batch_repeat_interleave(2)


def test_default_engine_matches_generate_with_the_growable_cache(tiny):
    engine = Engine(tiny, SamplerSettings(temperature=0), RunOptions(max_new_tokens=40, ignore_eos=True))
    events, steps = run(engine)
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    assert_engine_is_the_oracle(tiny.model, prompt.ids, steps)
    per_token = tiny.facts.kv_bytes_per_token
    assert all(s.kv_bytes == per_token * s.kv_tokens for s in steps)


# ---------------------------------------------------------------------------------------------------------------
# Threads.


def test_speed_options_validate():
    for bad in (dict(threads=0), dict(threads=-2), dict(prefill_threads=0), dict(threads=True)):
        with pytest.raises(SettingsError):
            SpeedOptions(**bad)
    assert SpeedOptions(threads=3).decode_threads() == 3


def test_thread_policy():
    auto = SpeedOptions()
    assert auto.decode_threads() == max(1, cpu_cores() - 1)
    assert auto.prefill_thread_count(4000) == auto.prefill_thread_count(10) == auto.decode_threads()
    assert SpeedOptions(threads=2).prefill_thread_count(4000) == 2
    assert SpeedOptions(threads=1, prefill_threads=2).prefill_thread_count(10) == 2


def test_decode_runs_with_the_chosen_thread_count(tiny):
    before = torch.get_num_threads()
    try:
        engine = Engine(tiny, SamplerSettings(temperature=0), RunOptions(max_new_tokens=4, ignore_eos=True),
                        speed=SpeedOptions(threads=1))
        seen = [torch.get_num_threads() for e in engine.run("Hi") if isinstance(e, StepEvent)]
        assert seen == [1] * 4
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------------------------
# The compiled path (--compile).


def test_buckets():
    assert bucket_for(1) == 256 and bucket_for(256) == 256 and bucket_for(257) == 512
    assert bucket_for(3000) == 4096 and bucket_for(MAX_COMPILED_TOKENS + 1) is None
    assert bucket_for(300, max_context=400) == 400 and bucket_for(500, max_context=400) is None


@pytest.fixture(scope="module")
def compiled_tiny(tiny):
    before = torch.get_num_threads()
    stages = []
    engine = Engine(tiny, SamplerSettings(temperature=0), RunOptions(max_new_tokens=40, ignore_eos=True),
                    speed=SpeedOptions(compile=True), progress=stages.append)
    yield engine, stages
    torch.set_num_threads(before)


def test_compiled_tiny_matches_generate_and_reports_kv_truthfully(tiny, compiled_tiny):
    engine, stages = compiled_tiny
    assert any("compiling the decode step" in s.stage for s in stages) and stages[-1].fraction == 1.0
    for prompt in ("Is OpenAI open?", "Write a haiku about the sea."):
        events, steps = run(engine, prompt)
        prompt_event = next(e for e in events if isinstance(e, PromptEvent))
        assert_engine_is_the_oracle(tiny.model, prompt_event.ids, steps)
        notices = [e.message for e in events if isinstance(e, Notice)]
        allocated = cache_allocated_nbytes(engine.compiled.cache(256))
        said = f"static KV cache: {allocated / 2**10:.1f} KiB allocated for 256 tokens"  # the real allocation
        assert any(n.startswith(said) for n in notices)
        assert not any("compiling" in n for n in notices)  # compiled at construction
        per_token = tiny.facts.kv_bytes_per_token
        prefill = next(e for e in events if isinstance(e, PrefillEvent))
        assert prefill.kv_tokens == len(prompt_event.ids) and prefill.kv_bytes == per_token * prefill.kv_tokens
        assert all(s.kv_tokens == len(prompt_event.ids) + s.index for s in steps)
        assert all(s.kv_bytes == per_token * s.kv_tokens for s in steps)
        done = events[-1]
        assert isinstance(done, DoneEvent) and done.kv_bytes == per_token * done.kv_tokens


def test_compiled_sampling_is_seeded_like_the_default_path(tiny, compiled_tiny):
    engine, _ = compiled_tiny
    settings = SamplerSettings(temperature=1.0, top_p=0.9, seed=5)
    engine.update_sampler(**settings.to_dict())
    try:
        ours = [s.id for s in run(engine)[1]]
    finally:
        engine.update_sampler(temperature=0.0)
    default = Engine(tiny, settings, RunOptions(max_new_tokens=40, ignore_eos=True))
    assert ours == [s.id for s in run(default)[1]]


def test_compiled_run_beyond_its_reach_decodes_eagerly(tiny, compiled_tiny):
    engine, _ = compiled_tiny
    engine.options = RunOptions(max_new_tokens=600, ignore_eos=True)  # the tiny model's context is 512
    try:
        events, steps = run(engine)
    finally:
        engine.options = RunOptions(max_new_tokens=40, ignore_eos=True)
    assert any("decoding eagerly" in e.message for e in events if isinstance(e, Notice))
    assert events[-1].reason == "context" and steps[-1].kv_tokens == 512  # positions 0..511: the whole context


def test_a_second_compiled_engine_on_the_same_model_gives_the_right_tokens(tiny, compiled_tiny):
    """Dynamo's guards do not tell two static caches apart: a second decoder on the same model reused the first
    one's compiled graph, which read and wrote the first decoder's cache, and chose wrong tokens. Engines on one
    model now share its decoder (and take turns on its caches)."""
    first, _ = compiled_tiny
    before = torch.get_num_threads()
    try:
        second = Engine(tiny, SamplerSettings(temperature=0), RunOptions(max_new_tokens=40, ignore_eos=True),
                        speed=SpeedOptions(compile=True))
        for engine, prompt in ((second, "Is OpenAI open?"), (first, "Name three colours."), (second, "Why?")):
            events, steps = run(engine, prompt)
            prompt_ids = next(e for e in events if isinstance(e, PromptEvent)).ids
            assert_engine_is_the_oracle(tiny.model, prompt_ids, steps)
        assert second.compiled is first.compiled
        # Runs on the two engines take turns: the second waits while the first holds the shared caches.
        held = first.run("Is OpenAI open?")
        next(held)  # the first run has started (its PromptEvent)
        seen = []
        waiting = threading.Thread(target=lambda: seen.extend(second.run("Why?")))
        waiting.start()
        waiting.join(0.5)
        assert seen == []  # not even its PromptEvent (milliseconds) while the first run holds the caches
        held.close()
        waiting.join(60)
        assert isinstance(seen[-1], DoneEvent) and seen[-1].tokens == 40
    finally:
        torch.set_num_threads(before)


def test_the_shared_compiled_decoder_does_not_keep_a_dropped_model_alive(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer)
    loaded = LoadedModel(model=model, tokenizer=smol_tokenizer, facts=model_facts(model, smol_tokenizer, name="t"))
    before = torch.get_num_threads()
    try:
        engine = Engine(loaded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=4, ignore_eos=True),
                        speed=SpeedOptions(compile=True))
        assert len(run(engine)[1]) == 4
    finally:
        torch.set_num_threads(before)
    gone = weakref.ref(model)
    del engine, loaded, model
    gc.collect()
    assert gone() is None


@pytest.mark.slow
def test_compiled_embedded_128_tokens_identical_to_generate(embedded, embedded_stock):
    """The real model: compile (a minute or two on 2 cores), then 128 greedy tokens, token for token."""
    before = torch.get_num_threads()
    try:
        engine = Engine(embedded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=128, ignore_eos=True),
                        speed=SpeedOptions(compile=True))
        events, steps = run(engine)
    finally:
        torch.set_num_threads(before)
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    assert [s.id for s in steps] == generate_ids(embedded_stock.model, prompt.ids, 128, stop_at_eos=False)
    assert steps[-1].kv_bytes == embedded.facts.kv_bytes_per_token * steps[-1].kv_tokens


# ---------------------------------------------------------------------------------------------------------------
# --compile on architectures beyond Llama (issue 24): sliding windows, hybrids, the recompile guard.


def _compiled_run(name, tokenizer, n=12, **speed):
    from arch_matrix import build

    model = build(name, tokenizer)
    loaded = LoadedModel(model=model, tokenizer=tokenizer, facts=model_facts(model, tokenizer, name=name))
    before = torch.get_num_threads()
    try:
        engine = Engine(loaded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=n, ignore_eos=True),
                        speed=SpeedOptions(compile=True, **speed))
        events = list(engine.run("Hi"))
    finally:
        torch.set_num_threads(before)
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    steps = [e for e in events if isinstance(e, StepEvent)]
    return model, events, prompt, steps


def test_compile_on_a_sliding_window_model_says_so_before_the_run_and_decodes_eagerly(smol_tokenizer):
    """Mistral's static sliding layer counts its positions in a Python int: compiled, every step compiled again
    (~580 ms each) until dynamo's limit raised a traceback. Now nothing is compiled and the run says why first."""
    model, events, prompt, steps = _compiled_run("mistral", smol_tokenizer, n=24)
    first = events.index(prompt)
    notices = [e.message for e in events[:first] if isinstance(e, Notice)]
    assert len(notices) == 1 and "sliding-window attention layers" in notices[0]
    assert notices[0].endswith("decoding eagerly") and "\n" not in notices[0]
    assert_engine_is_the_oracle(model, prompt.ids, steps)
    assert isinstance(events[-1], DoneEvent) and not any("static KV cache" in e.message for e in events
                                                          if isinstance(e, Notice))


def test_the_recompile_guard_falls_back_to_eager_instead_of_a_storm(smol_tokenizer, monkeypatch):
    """What no check foresees: were a sliding layer compiled after all, the warm-up's second call would compile
    again; under fail_on_recompile it raises at once, and the model decodes eagerly, said before the run."""
    import tokentui.core.model.architecture as architecture
    import tokentui.core.model.decode.compiled as compiled

    monkeypatch.setattr(architecture, "compile_problem", lambda model: None)  # the engine asks it there
    monkeypatch.setattr(compiled, "compile_settings",
                        lambda device: (dict(fullgraph=True, dynamic=False, backend="eager"), {}))
    torch.compiler.reset()
    model, events, prompt, steps = _compiled_run("mistral", smol_tokenizer, n=24)
    notices = [e.message for e in events[:events.index(prompt)] if isinstance(e, Notice)]
    assert notices == ["--compile stopped (the decode step would compile again at every step): decoding eagerly"]
    assert_engine_is_the_oracle(model, prompt.ids, steps)
    assert isinstance(events[-1], DoneEvent)


def test_a_compile_failure_mid_run_goes_on_eagerly_on_the_same_cache(smol_tokenizer, monkeypatch):
    import tokentui.core.model.decode.compiled as compiled

    monkeypatch.setattr(compiled, "compile_settings",
                        lambda device: (dict(fullgraph=True, dynamic=False, backend="eager"), {}))
    torch.compiler.reset()
    calls = []
    real = compiled.CompiledDecoder._compiled_step

    def flaky(self, cache):
        calls.append(1)
        if len(calls) == 6:  # the warm-up made three; the run's third decode step fails
            raise RuntimeError("simulated compile failure")
        return real(self, cache)

    monkeypatch.setattr(compiled.CompiledDecoder, "_compiled_step", flaky)
    model, events, prompt, steps = _compiled_run("llama", smol_tokenizer, n=12)
    notices = [(i, e.message) for i, e in enumerate(events) if isinstance(e, Notice)]
    failed = [(i, m) for i, m in notices if m.startswith("--compile stopped")]
    assert len(failed) == 1 and "RuntimeError: simulated compile failure" in failed[0][1]
    assert events.index(steps[3]) > failed[0][0] > events.index(steps[2])  # said with the step that fell back
    assert_engine_is_the_oracle(model, prompt.ids, steps)
    assert all(s.kv_tokens == len(prompt.ids) + s.index for s in steps) and isinstance(events[-1], DoneEvent)


@pytest.mark.slow
def test_compiled_hybrid_lfm2_with_inductor_matches_generate(smol_tokenizer):
    """A hybrid (LFM2: short-conv layers with a fixed-size state, attention layers with a static KV cache) compiled
    for real, as --compile does it on a CPU (inductor, freezing, autotuning: ~45 s on 2 cores)."""
    torch.compiler.reset()
    model, events, prompt, steps = _compiled_run("lfm2", smol_tokenizer, n=24)
    notices = [e.message for e in events if isinstance(e, Notice)]
    assert len(notices) == 1 and notices[0].startswith("static KV cache")
    assert_engine_is_the_oracle(model, prompt.ids, steps)
    facts = model_facts(model, smol_tokenizer, name="lfm2")
    from tokentui.core.runs.architecture import kv_bytes_at

    assert all(s.kv_bytes == kv_bytes_at(facts.kv_groups, s.kv_tokens, 4) for s in steps)


def test_a_model_whose_forward_refuses_the_static_cache_decodes_eagerly_with_a_notice(smol_tokenizer, monkeypatch):
    """Bloom's ALiBi forward raised on a static cache in transformers 5.15, at load: a traceback then, a notice now."""
    import tokentui.core.model.decode.compiled as compiled

    def refuse(self, ids, cache, first=True):
        raise RuntimeError("The expanded size of the tensor (256) must match the existing size (8)")

    monkeypatch.setattr(compiled.CompiledDecoder, "prefill", refuse)
    monkeypatch.setattr(compiled, "compile_settings",
                        lambda device: (dict(fullgraph=True, dynamic=False, backend="eager"), {}))
    torch.compiler.reset()
    model, events, prompt, steps = _compiled_run("bloom", smol_tokenizer, n=8)
    notices = [e.message for e in events[:events.index(prompt)] if isinstance(e, Notice)]
    assert len(notices) == 1 and "does not take a static KV cache" in notices[0]
    assert notices[0].endswith("decoding eagerly")
    assert_engine_is_the_oracle(model, prompt.ids, steps)
