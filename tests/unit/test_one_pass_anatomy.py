"""Issue 16, one pass taken apart: core/model/observe/anatomy.py's stages against the tensors a model really makes (forward hooks
on tiny Llama / Qwen2 / Qwen3 models), tied and untied LM heads read off the weights, and the per-step timing split
(core/model/observe/timing.py): its parts add up to the step's latency, the consumer's wait is measured, the bytes each way, the
CUDA-events path (with stand-in events on CPU), and `timing` and the sampler-shape fields through records and JSON."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch

import tokentui.core.model.step_loop as step_loop
import tokentui.core.model.observe.timing as timing_module
from tiny_models import REPO, tiny_model
from tokentui.core.model.decode.adapter import cache_layers
from tokentui.core.model.decode.steps import TorchForward
from tokentui.core.model.observe.anatomy import Stage, one_pass
from tokentui.core.steps.decode import decode_one_token
from tokentui.core.model.engine import Engine
from tokentui.core.runs.events import PromptEvent, StepEvent, StepTiming
from tokentui.core.runs.facts import ModelFacts
from tokentui.core.model.decode.kvcache import cache_tokens
from tokentui.core.model.load.loader import LoadedModel, load_model, model_facts
from tokentui.core.runs.record_reader import event_from_dict
from tokentui.core.runs.run import Run
from tokentui.core.steps.select import _HEADER, native_op, select
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.core.model.observe.timing import StepClock

KINDS = ["llama", "qwen2", "qwen3"]
SAMPLING = SamplerSettings(temperature=0.8, top_k=40, top_p=0.9, seed=3)


def loaded_tiny(kind: str, tokenizer, **overrides) -> LoadedModel:
    model = tiny_model(kind, tokenizer, **overrides)
    return LoadedModel(model, tokenizer, model_facts(model, tokenizer, name=f"tiny-{kind}"))


def steps_of(events) -> list[StepEvent]:
    return [e for e in events if isinstance(e, StepEvent)]


def by_name(stages: list[Stage]) -> dict[str, Stage]:
    return {s.name: s for s in stages}


# ---- the stages against the model's own tensors -----------------------------------------------------------------

def hooked_forward(model, run) -> dict[str, tuple[int, ...]]:
    """Shapes of what the embedding, a decoder layer, the final norm and the LM head output during `run()`."""
    seen: dict[str, tuple[int, ...]] = {}

    def keep(name):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            seen[name] = tuple(out.shape)
        return hook

    inner = model.model
    modules = {"embedding": inner.embed_tokens, "layer": inner.layers[-1], "norm": inner.norm,
               "lm_head": model.get_output_embeddings()}
    handles = [m.register_forward_hook(keep(name)) for name, m in modules.items()]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return seen


def check_stages_match(stages, seen, cache, facts) -> None:
    s = by_name(stages)
    assert s["embedding"].shape == seen["embedding"]
    assert s[f"{facts.layers} decoder blocks"].shape == seen["layer"]
    assert s["final RMSNorm"].shape == seen["norm"]
    last_row = (seen["lm_head"][0], seen["lm_head"][-1])  # logits_to_keep=1: [1, 1, V]; the sampler reads [1, V]
    assert s["LM head"].shape == last_row
    for keys, values in cache_layers(cache):
        assert tuple(keys.shape) == tuple(values.shape) == s["attention reads the KV cache"].shape
    assert s["temperature"].shape == s["softmax"].shape == (1, facts.vocab_rows)
    for stage in stages:
        assert stage.where in ("host", "device") and stage.part in ("forward", "select", "copy", "detok", None)
        if stage.shape is not None and stage.name != "to the host":
            assert "[" + ", ".join(map(str, stage.shape)) + "]" in stage.tensor


@pytest.mark.parametrize("kind", KINDS)
def test_stage_shapes_are_the_models_own_tensors_on_a_decode_step_and_a_prefill(kind, smol_tokenizer):
    loaded = loaded_tiny(kind, smol_tokenizer)
    model, facts = loaded.model, loaded.facts
    assert facts.architecture in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
    ids = smol_tokenizer("The apple is sweet")["input_ids"]
    run, _ = TorchForward(model).new_cache(len(ids), 4)
    cache = run.kv
    prompt = torch.tensor([ids])
    with torch.inference_mode():
        seen = hooked_forward(model, lambda: run.step.prefill(run, prompt, True))
    # the prefill as a run's first step: its forward read len(ids) ids (the step's timing says so)
    first = replace(fake_step(), timing=StepTiming(1.0, 0.1, 0.01, 0.1, 0.0, 8 * len(ids), 180))
    stages = one_pass(facts, cache_tokens(cache), first)
    assert by_name(stages)["id to the device"].shape == (1, len(ids))
    check_stages_match(stages, seen, cache, facts)
    seen = hooked_forward(model, lambda: decode_one_token(42, run))
    stages = one_pass(facts, cache_tokens(cache))
    assert cache_tokens(cache) == len(ids) + 1 and by_name(stages)["id to the device"].shape == (1, 1)
    check_stages_match(stages, seen, cache, facts)
    heads, kv = facts.attention_heads, facts.kv_heads
    assert (heads, kv) == (4, 2) and f"{heads} query heads share {kv} K/V heads" in by_name(stages)[
        "attention reads the KV cache"].note
    assert by_name(stages)["attention reads the KV cache"].shape[-1] == (32 if kind == "qwen3" else 16)


def test_facts_without_the_blocks_get_one_line_saying_what_is_not_shown(smol_tokenizer):
    """A record from before `anatomy`: its Llama / Qwen facts still describe the blocks; another family's do not."""
    facts = loaded_tiny("llama", smol_tokenizer).facts
    older = replace(facts, anatomy=None, kv_groups=None)
    assert [s.shape for s in one_pass(older, 10)] == [s.shape for s in one_pass(facts, 10)]
    text = one_pass(replace(older, architecture="GPT2LMHeadModel"), 10)
    assert isinstance(text, str) and "\n" not in text and "GPT2LMHeadModel" in text and "not shown" in text


def test_the_module_imports_without_torch():
    code = ("import sys; import tokentui.core.model.observe.anatomy; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---- tied and untied LM heads ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tied", [True, False])
def test_tied_or_untied_head_is_read_off_the_loaded_weights(kind, tied, smol_tokenizer, tmp_path):
    model = tiny_model(kind, smol_tokenizer, tie_word_embeddings=tied)
    model.save_pretrained(tmp_path)
    smol_tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu", dtype="float32")
    shared = loaded.model.get_output_embeddings().weight is loaded.model.get_input_embeddings().weight
    assert shared is tied and loaded.facts.tied_lm_head is tied
    note = by_name(one_pass(loaded.facts, 5))["LM head"].note
    assert ("tied: the embedding table itself" in note) is tied and ("untied" in note) is not tied


def test_the_truth_is_the_shared_weight_not_the_config(smol_tokenizer):
    model = tiny_model("qwen2", smol_tokenizer, tie_word_embeddings=True)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # same values, own tensor
    assert model.config.tie_word_embeddings and model_facts(model, smol_tokenizer, name="t").tied_lm_head is False
    model = tiny_model("llama", smol_tokenizer, tie_word_embeddings=False)
    model.lm_head.weight = model.model.embed_tokens.weight  # shared by hand, whatever the config says
    assert model_facts(model, smol_tokenizer, name="t").tied_lm_head is True
    unknown = replace(model_facts(model, smol_tokenizer, name="t"), tied_lm_head=None)
    assert "not known" in by_name(one_pass(unknown, 5))["LM head"].note


# ---- the timing split --------------------------------------------------------------------------------------------

def parts(t: StepTiming) -> float:
    return t.forward_ms + t.select_ms + t.copy_ms + t.detok_ms


def check_split(steps: list[StepEvent]) -> None:
    """Each step's parts add up to its latency within 10 % (by construction they tile it, so noise cannot move
    this; an untimed stretch of work in the loop would), each part is a real time, the wait is outside."""
    assert steps and all(s.timing is not None for s in steps)
    for s in steps:
        t = s.timing
        assert abs(parts(t) - s.latency_ms) <= 0.10 * s.latency_ms, (s.index, t, s.latency_ms)
        assert min(t.forward_ms, t.select_ms, t.copy_ms, t.detok_ms, t.wait_ms) >= 0.0
        assert t.select_ms > 0 and t.copy_ms > 0 and t.detok_ms > 0
    assert statistics.median(abs(parts(s.timing) - s.latency_ms) / s.latency_ms for s in steps) < 0.02


def test_the_parts_add_up_to_the_latency_on_the_embedded_model(embedded):
    engine = Engine(embedded, SAMPLING, RunOptions(max_new_tokens=30, ignore_eos=True))
    events = list(engine.run("Is OpenAI open?"))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    steps = steps_of(events)
    assert len(steps) == 30
    check_split(steps)
    # no lens: the split's forward part is the model run and the engine's microseconds around it (timing.py)
    assert all(s.forward_ms <= s.timing.forward_ms for s in steps)
    assert statistics.median(s.timing.forward_ms - s.forward_ms for s in steps) < 0.5
    assert steps[0].timing.wait_ms == 0.0  # nothing came before the first step
    # the ids in: the prompt's for the prefill, one per decode step; out: the packed selection, float32
    assert steps[0].timing.h2d_bytes == 8 * len(prompt.ids)
    assert all(s.timing.h2d_bytes == 8 for s in steps[1:])
    assert all(s.timing.d2h_bytes == 4 * (_HEADER + 3 * 10) for s in steps)
    median_forward = statistics.median(s.timing.forward_ms for s in steps[1:])
    assert median_forward > statistics.median(s.timing.select_ms for s in steps[1:])  # the model dominates


def test_the_wait_is_the_time_the_consumer_held_the_engine(smol_tokenizer):
    engine = Engine(loaded_tiny("llama", smol_tokenizer), SAMPLING, RunOptions(max_new_tokens=6, ignore_eos=True))
    steps, received, released = [], [], []  # per step: when it reached us, when we handed the engine back (ms)
    events = engine.run("Hi")
    while (event := next(events, None)) is not None:
        if isinstance(event, StepEvent):
            steps.append(event)
            received.append(time.perf_counter() * 1000.0)
            time.sleep(0.03)  # a slow UI
            released.append(time.perf_counter() * 1000.0)
    check_split(steps)
    # Orderings on one clock, not thresholds: step k's wait runs from handing over step k - 1 to starting step k, so
    # it holds our 30 ms hold; its latency starts after we let go of step k - 1; and step k - 1's latency, step k's
    # wait and its latency are three disjoint spans between letting go of step k - 2 and receiving step k.
    for k in range(1, len(steps)):
        assert steps[k].timing.wait_ms >= 30.0, k
        assert steps[k].latency_ms <= received[k] - released[k - 1], k  # the wait is not in the step's latency
    for k in range(2, len(steps)):
        spans = steps[k - 1].latency_ms + steps[k].timing.wait_ms + steps[k].latency_ms
        assert spans <= received[k] - released[k - 2], k  # the wait is the hold, not more


def test_a_pause_is_not_a_wait(smol_tokenizer):
    engine = Engine(loaded_tiny("llama", smol_tokenizer), SAMPLING, RunOptions(max_new_tokens=4, ignore_eos=True))
    steps, stamps = [], {}

    def resume():
        stamps["resumed"] = time.perf_counter() * 1000.0
        engine.resume()

    events = engine.run("Hi")
    while (event := next(events, None)) is not None:
        if isinstance(event, StepEvent):
            steps.append(event)
            if len(steps) == 2:
                engine.pause()
                timer = __import__("threading").Timer(0.1, resume)
                timer.start()
                stamps["released"] = time.perf_counter() * 1000.0
    timer.join()
    # From letting go of step 2 to the resume, the engine stood paused at the gate (100 ms or more): step 3's wait
    # would hold all of it if the pause counted; it holds the time outside it, less than the pause (one clock)
    assert steps[2].timing.wait_ms < stamps["resumed"] - stamps["released"]


def test_with_the_logit_lens_the_lens_counts_as_forward(smol_tokenizer):
    engine = Engine(loaded_tiny("qwen3", smol_tokenizer), SAMPLING,
                    RunOptions(max_new_tokens=8, ignore_eos=True, logit_lens=True))
    steps = steps_of(engine.run("Hi"))
    assert all(s.lens for s in steps)
    check_split(steps)
    assert all(s.timing.forward_ms > s.forward_ms for s in steps)


def test_a_branch_that_reuses_the_cache_sends_one_id(smol_tokenizer):
    from tokentui.core.model.branch import BranchPoint

    engine = Engine(loaded_tiny("llama", smol_tokenizer), SamplerSettings(temperature=0),
                    RunOptions(max_new_tokens=6, ignore_eos=True))
    events = list(engine.run("Hi"))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    steps = steps_of(events)
    point = BranchPoint(prompt_ids=tuple(prompt.ids), tokens=tuple(s.id for s in steps[:3]), at=3,
                        token=steps[3].candidates[1].id)
    branch = steps_of(engine.branch(point))
    assert branch[0].forced and branch[0].timing.h2d_bytes == 8
    check_split(branch)


@pytest.mark.parametrize("native", [False, True], ids=["torch operations", "one C++ call"])
def test_a_widened_selection_copies_twice_and_counts_both(native):
    """The torch path (accelerators, no compiler) widens a prefix that did not hold the kept set and copies its
    packed vector again: both copies are timed and counted. The one C++ call finds the kept set first: one copy."""
    if native and native_op() is None:
        pytest.skip("tokentui's native library does not build here")
    clock = StepClock(torch.device("cpu"), torch.device("cpu"))
    clock.first(forward_ms=5.0, fed=3, exact=False)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2000, generator=g) - 10.0  # 3 leaders, then 300 ties at 4th place: top-k 5 keeps 303, more
    x[:3] = torch.tensor([5.0, 4.5, 4.0])      # than the first prefix holds, so the torch path widens it
    x[torch.randperm(1997, generator=g)[:300] + 3] = 1.0
    copies = []

    def to_host(packed):
        copies.append(packed.numel())
        return clock.to_host(packed)

    sel = select(x, SamplerSettings(temperature=1.0, top_k=5, top_p=1.0), torch.Generator().manual_seed(0), 10,
                 to_host, native=native)
    clock.selected()
    timing = clock.finish(time.perf_counter())
    assert len(copies) == (1 if native else 2) and timing.d2h_bytes == 4 * sum(copies) and timing.h2d_bytes == 24
    assert sel.top_k_kept == sel.kept_count == 303 and sel.top_p_kept is None
    assert timing.forward_ms == 5.0 and timing.copy_ms > 0


class _StandInEvent:
    """A CUDA event's interface on the host clock: `record` stamps perf_counter (on CPU the device's timeline is the
    host's), `query` says it completed."""

    def __init__(self) -> None:
        self.at = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end) -> float:
        return (end.at - self.at) * 1000.0


def test_the_cuda_events_path_tiles_the_step_and_skips_the_forward_sync(smol_tokenizer, monkeypatch):
    """The events path (CUDA without time_stages) run on CPU with stand-in events: decode is asked not to sync, the
    forward is read off the events, and the parts still tile the step. With time_stages the forward syncs."""

    class EventsClock(StepClock):
        def __init__(self, model_device, logits_device):
            super().__init__(model_device, logits_device)
            self._events_possible = True

    monkeypatch.setattr(timing_module, "_event", lambda device: _StandInEvent())
    monkeypatch.setattr(step_loop, "StepClock", EventsClock)
    syncs = []
    real = step_loop.decode_one_token

    def decode(*args, **kwargs):
        syncs.append(kwargs.get("sync", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(step_loop, "decode_one_token", decode)
    engine = Engine(loaded_tiny("qwen2", smol_tokenizer), SAMPLING, RunOptions(max_new_tokens=8, ignore_eos=True))
    steps = steps_of(engine.run("Hi"))
    assert syncs == [False] * 7
    check_split(steps)
    assert all(s.timing.forward_ms == pytest.approx(s.forward_ms) for s in steps)
    syncs.clear()
    engine.options = RunOptions(max_new_tokens=4, ignore_eos=True, time_stages=True)
    check_split(steps_of(engine.run("Hi")))
    assert syncs == [True] * 3


# ---- records and JSON --------------------------------------------------------------------------------------------

def fake_step(**changes) -> StepEvent:
    base = StepEvent(index=0, id=1, piece="a", special=False, text="a", pending_hex="", pending_needed=0,
                     completed_chars=[], candidates=[], chosen_rank=0, chosen_raw_prob=0.5, chosen_prob=0.6,
                     kept_count=2, kept_mass=0.9, entropy_bits=1.0, sampled_entropy_bits=0.9, greedy=False,
                     settings=SamplerSettings(), settings_changed=False, latency_ms=10.0, forward_ms=9.0,
                     kv_tokens=5, kv_bytes=50)
    return replace(base, **changes)


def test_timing_and_the_sampler_shape_go_through_records_and_json(smol_tokenizer, tmp_path):
    loaded = loaded_tiny("llama", smol_tokenizer)
    settings = [SAMPLING, SamplerSettings(temperature=0), SamplerSettings(temperature=1.0, top_p=1.0)]
    for n, sampler in enumerate(settings):
        engine = Engine(loaded, sampler, RunOptions(max_new_tokens=5, ignore_eos=True))
        events = [loaded.facts, *engine.run("Hi")]
        run = Run()
        for event in events:
            run.apply(event)
        steps = steps_of(events)
        assert list(run) == steps and run[0] == steps[0]  # rebuilt from the columns, equal
        again = Run.from_record(run.save(tmp_path / f"run{n}.jsonl"))
        assert list(again) == steps and again.facts.tied_lm_head is True
        for step in steps:
            line = json.loads(json.dumps(step.to_dict()))  # what --headless --json prints
            assert set(line["timing"]) == {"forward_ms", "select_ms", "copy_ms", "detok_ms", "wait_ms", "h2d_bytes",
                                           "d2h_bytes"}
            assert {"temp_entropy_bits", "top_k_kept", "top_p_kept"} <= line.keys()
            assert event_from_dict(line) == step
        assert run.values("timing.copy_ms") == [s.timing.copy_ms for s in steps]
        assert run.values("top_k_kept") == [s.top_k_kept for s in steps]
        assert run.values("temp_entropy_bits") == [s.temp_entropy_bits for s in steps]
        if n == 0:  # T 0.8, top-k 40, top-p 0.9
            assert all(s.top_k_kept >= 40 and 1 <= s.top_p_kept <= s.top_k_kept and s.temp_entropy_bits is not None
                       for s in steps)
        elif n == 1:  # greedy: no temperature, no cut
            assert all(s.top_k_kept is s.top_p_kept is s.temp_entropy_bits is None for s in steps)
        else:  # T = 1 and no cut
            assert all(s.top_k_kept is None and s.top_p_kept is None and s.temp_entropy_bits == s.entropy_bits
                       for s in steps)


def test_old_records_without_the_new_fields_still_read(smol_tokenizer):
    step = fake_step()
    line = step.to_dict()
    assert "timing" not in line  # an untimed step writes no timing
    for key in ("temp_entropy_bits", "top_k_kept", "top_p_kept"):
        del line[key]
    old = event_from_dict(line)
    assert old.timing is None and old.top_k_kept is None and old.temp_entropy_bits is None and old == step
    facts = loaded_tiny("llama", smol_tokenizer).facts.to_dict()
    del facts["tied_lm_head"]
    assert event_from_dict(facts).tied_lm_head is None
    run = Run(event_from_dict(facts))
    run.apply(old)
    run.apply(replace(old, index=1, timing=StepTiming(1.0, 2.0, 0.5, 0.25, 3.0, 8, 180), top_p_kept=7))
    assert run[0] == old and run[1].timing.d2h_bytes == 180 and run[1].top_p_kept == 7
    assert run.values("timing.wait_ms") == [None, 3.0] and run.values("top_p_kept") == [None, 7]
    assert isinstance(event_from_dict(json.loads(json.dumps(facts))), ModelFacts)


def test_a_model_mixing_sliding_and_global_layers_shows_both_kv_shapes(smol_tokenizer):
    """Issue 40 item 10: Gemma 2 alternates sliding-window and global layers; the one-pass stages give each kind its
    own block group and its own K/V shape, each equal to its layers' real cache tensors (the sliding layers' holding
    only their window)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
                          max_position_embeddings=256, pad_token_id=0)
    model = Gemma2ForCausalLM(config).eval()
    facts = model_facts(model, smol_tokenizer, name="tiny-gemma2")
    ids = smol_tokenizer("The apple is sweet and the pear is sour")["input_ids"]
    run, _ = TorchForward(model).new_cache(len(ids), 4)
    with torch.inference_mode():
        run.step.prefill(run, torch.tensor([ids]), True)
    stages = one_pass(facts, cache_tokens(run.kv))
    reads = [s for s in stages if s.name == "attention reads the KV cache"]
    real = {tuple(keys.shape) for keys, _ in cache_layers(run.kv)}
    assert len(real) == 2 and {s.shape for s in reads} == real, ([s.shape for s in reads], real)
    blocks = [s.name for s in stages if s.name.endswith(" blocks")]
    assert blocks == ["2 sliding blocks", "2 full blocks"]
    sliding = next(s for s in reads if s.shape[2] < len(ids))
    assert f"of {len(ids)} positions (a sliding window of 4" in sliding.note
