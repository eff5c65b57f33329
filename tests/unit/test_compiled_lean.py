"""`--compile` on the 4-bit embedded model: its lean decode step compiled whole (core/model/decode/compiled_lean.py),
checked against the float32 de-quantized reference (as the eager 4-bit path is, tests/unit/test_quantized_embedded.py)
and against the eager lean step on the same cache."""

from __future__ import annotations

import os

import pytest
import torch

from tokentui.core.model.decode.adapter import forward_last_logits, new_cache
from tokentui.core.model.decode.compiled_lean import CompiledLeanStep
from tokentui.core.model.decode.plan import NATIVE_INSTEAD
from tokentui.core.model.engine import Engine
from tokentui.core.model.observe.fidelity import agreement, first_divergence, teacher_forced_logits
from tokentui.core.model.decode.lean_step import lean_decoder
from tokentui.core.model.native.native_step import native_step
from tokentui.core.model.native.native_step import disabled as native_step_disabled
from tokentui.core.model.quant.qlinear import kernel_available
from tokentui.core.model.speed import SpeedOptions
from tokentui.core.runs.events import Notice, StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings
from test_quantized_embedded import LLAMA_SERVER, PROMPT, STEPS, greedy_ids

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not kernel_available(), reason="no int4 CPU kernel"),
              pytest.mark.usefixtures("one_torch_thread")]
PREFIX = [1, 504, 2113, 30, 28, 1562]  # a short prompt for the cache checks
GREEDY = SamplerSettings(temperature=0.0)


@pytest.fixture(scope="module")
def compiled_engine(embedded_quantized):
    """An engine with --compile on the 4-bit model made while the native step does not serve it (where it does,
    --compile keeps that step: test_compile_keeps_the_native_step_where_it_serves): it compiles the lean step while
    it is made (minutes cold)."""
    stages = []
    with native_step_disabled(embedded_quantized.model):
        engine = Engine(embedded_quantized, GREEDY, RunOptions(max_new_tokens=40, ignore_eos=True),
                        speed=SpeedOptions(compile=True, threads=1), progress=stages.append)
    return engine, [s.stage for s in stages]


def test_compile_keeps_the_native_step_where_it_serves(embedded_quantized):
    model = embedded_quantized.model
    if native_step(model) is None:  # it serves it wherever the native library builds (test.sh requires that)
        if os.environ.get("TOKENTUI_REQUIRE_NATIVE") == "1":
            pytest.fail("the native step does not serve the embedded model", pytrace=False)
        pytest.skip("the native step does not serve this model here (the native library does not build)")
    stages = []
    engine = Engine(embedded_quantized, GREEDY, RunOptions(max_new_tokens=3, ignore_eos=True),
                    speed=SpeedOptions(compile=True, threads=1), progress=stages.append)
    assert not any(s.stage.startswith("compiling") for s in stages)
    assert engine.plan.step.name == "native step"
    events = list(engine.run(PROMPT))
    assert [e.message for e in events if isinstance(e, Notice)] == [NATIVE_INSTEAD]
    assert len([e for e in events if isinstance(e, StepEvent)]) == 3


@pytest.fixture(scope="module")
def step(compiled_engine, embedded_quantized):
    found = CompiledLeanStep.for_model(embedded_quantized.model, 1)
    assert found is not None and found.failure is None
    return found


@pytest.fixture(scope="module")
def reference_run(embedded):
    return greedy_ids(embedded)


def prefilled(model, capacity: int):
    cache = new_cache(model, capacity)
    forward_last_logits(model, torch.tensor([PREFIX]), cache)
    return cache


def probs(logits: torch.Tensor) -> torch.Tensor:
    return logits.float().softmax(-1)


def assert_close_scores(ours: torch.Tensor, eager: torch.Tensor) -> None:
    """The same top candidates, probabilities within bfloat16-activation rounding (the eager 4-bit path's own
    distance from the float32 reference is up to ~0.024)."""
    p, q = probs(ours), probs(eager)
    top = q.topk(10).indices
    assert (p[top] - q[top]).abs().max() < 0.02
    if q[top[0]] - q[top[1]] > 0.05:  # not a near-tie: the same pick
        assert int(p.argmax()) == int(top[0])


def test_the_engine_compiles_the_lean_step_and_decodes_with_it(compiled_engine, step, embedded_quantized):
    engine, stages = compiled_engine
    assert any(s.startswith("compiling the 4-bit decode step") for s in stages), stages
    assert engine.plan.step.name == "compiled lean step"
    assert engine.facts.decode_plan.startswith("compiled lean step: --compile; ")
    # an engine without --compile keeps the eager step (the native one where it serves)
    model = embedded_quantized.model
    plain = Engine(embedded_quantized, GREEDY, RunOptions(max_new_tokens=4))
    assert plain.plan.step.name == ("native step" if native_step(model) is not None else "lean torch step")
    # the compiled step reads the layers' weights stacked, and the modules now hold rows of those stacks: the
    # weights are held once, and the eager lean step still gives the forward's scores bit for bit
    storages = {layer.self_attn.q_proj.fused.packed.untyped_storage().data_ptr() for layer in model.model.layers}
    assert len(storages) == 1
    a, b = prefilled(model, 16), prefilled(model, 16)
    for token in (314, 253):
        assert torch.equal(lean_decoder(model).step(token, a), forward_last_logits(model, torch.tensor([[token]]), b))


def test_closer_to_the_reference_than_llama_server(step, embedded_quantized, embedded, reference_run):
    """The oracle the eager 4-bit path meets, teacher-forced on the float32 reference's own 128 greedy tokens."""
    prompt_ids, steps = reference_run
    tokens = [s.id for s in steps]
    reference = teacher_forced_logits(embedded.model, prompt_ids, tokens)
    ours = agreement(reference, teacher_forced_logits(embedded_quantized.model, prompt_ids, tokens, lean_step=step))
    assert ours.positions == STEPS
    assert ours.agree > LLAMA_SERVER["agree"], ours
    assert ours.dp_max < LLAMA_SERVER["dp_max"] and ours.dp_mean < LLAMA_SERVER["dp_mean"], ours
    assert all(margin < 0.05 for _, margin in ours.disagreements)  # any disagreement is a near-tie


def test_a_compiled_run_follows_the_eager_one_until_a_near_tie(compiled_engine, embedded_quantized):
    engine, _ = compiled_engine
    events = list(engine.run(PROMPT))
    assert not [e for e in events if isinstance(e, Notice)]  # compiled, no fallback
    ours = [e for e in events if isinstance(e, StepEvent)]
    _, eager = greedy_ids(embedded_quantized, 40)
    assert len(ours) == 40
    at = first_divergence([s.id for s in ours], [s.id for s in eager])
    if at is not None:  # rounding may flip a near-tie of the eager run, nothing else
        raw = sorted((c.raw_prob for c in eager[at].candidates), reverse=True)
        assert raw[0] - raw[1] < 0.05, f"step {at}: eager margin {raw[0] - raw[1]:.4f}"
    assert at is None or at >= 8


def test_it_writes_the_cache_the_eager_step_would_and_follows_a_crop(step, embedded_quantized):
    model = embedded_quantized.model
    eager = lean_decoder(model)
    ours, theirs = prefilled(model, 64), prefilled(model, 64)
    for token in (314, 253, 5549, 28):
        assert_close_scores(step.step(token, ours), eager.step(token, theirs))
    assert ours.get_seq_length() == theirs.get_seq_length() == len(PREFIX) + 4
    for mine, other in zip(ours.layers, theirs.layers):
        assert mine.keys.shape == other.keys.shape and mine.values.shape == other.values.shape
        for ours_, theirs_ in ((mine.keys, other.keys), (mine.values, other.values)):  # bfloat16-rounding apart
            assert (ours_ - theirs_).norm() < 0.02 * theirs_.norm()
        assert torch.equal(mine.keys[:, :, :len(PREFIX)], other.keys[:, :, :len(PREFIX)])  # the prefill's rows kept
    # a branch crops the cache; the compiled step goes on from the cropped length
    ours.crop(-2)
    theirs.crop(-2)
    for token in (1562, 30):
        assert_close_scores(step.step(token, ours), eager.step(token, theirs))
    assert ours.get_seq_length() == theirs.get_seq_length() == len(PREFIX) + 4
    assert step.failure is None


def test_the_cache_grows_under_it_without_a_recompile(step, embedded_quantized):
    model = embedded_quantized.model
    eager = lean_decoder(model)
    ours, theirs = prefilled(model, len(PREFIX) + 1), prefilled(model, len(PREFIX) + 1)
    before = ours.layers[0].allocated_nbytes
    for token in (314, 253, 5549, 28, 1562, 30, 504, 2113, 11, 12):
        assert_close_scores(step.step(token, ours), eager.step(token, theirs))
    assert ours.layers[0].allocated_nbytes > before  # the buffers doubled, twice
    assert step.failure is None  # every call ran under fail_on_recompile


def test_a_cache_it_cannot_write_goes_through_the_eager_step(step, embedded_quantized):
    """A cache whose layers hold no growable buffers (here: never prefilled) gets the eager lean step's scores."""
    model = embedded_quantized.model
    eager = lean_decoder(model)
    ours, theirs = new_cache(model), new_cache(model)
    assert torch.equal(step.step(5, ours), eager.step(5, theirs))
    assert step.failure is None


def test_the_logit_lens_works_with_compile_on_the_4bit_path(compiled_engine, embedded_quantized):
    with native_step_disabled(embedded_quantized.model):
        engine = Engine(embedded_quantized, GREEDY, RunOptions(max_new_tokens=3, ignore_eos=True, logit_lens=True),
                        speed=SpeedOptions(compile=True, threads=1))
    steps = [e for e in engine.run(PROMPT) if isinstance(e, StepEvent)]
    assert len(steps) == 3 and all(s.lens for s in steps)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_q_k_v_biases_and_per_head_norms_compile_too(kind, smol_tokenizer):
    """Qwen2's q/k/v biases and Qwen3's per-head norms, on tiny models quantized here (--quantize int4): the
    compiled step against the eager lean step, with a buffer growth on the way."""
    from tiny_models import tiny_model
    from tokentui.core.model.quant.quantize import quantize_model

    model = tiny_model(kind, smol_tokenizer, tie_word_embeddings=False)
    quantize_model(model)
    eager = lean_decoder(model)
    assert eager is not None
    step = CompiledLeanStep.for_model(model, 1)
    step.warm_up(model)
    assert step.failure is None
    with torch.inference_mode():
        ours, theirs = prefilled(model, len(PREFIX) + 1), prefilled(model, len(PREFIX) + 1)
        for token in (314, 253, 5549, 28, 1562, 30):
            got, want = step.step(token, ours), eager.step(token, theirs)
            assert (probs(got) - probs(want)).abs().max() < 1e-3
    assert step.failure is None
