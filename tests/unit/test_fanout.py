"""Fan-out (core/model/fanout.py through `Engine.fanout`): each sample against a teacher-forced forward over prefix +
sample (fp32); sample i against a single-sequence run from the same step with the same seed; the first tokens'
frequencies against the step's post-sampler probabilities (a statistical test, fixed seeds, a stated tolerance);
one batched decode over the prefix's one KV cache; bad requests one line."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from run_checks import failure_of
from tiny_models import tiny_model
from tokentui.core.errors import ErrorKind, SettingsError
from tokentui.core.model.decode.steps import TorchForward
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.runs.events import BranchEvent, DoneEvent, ErrorEvent, Notice, PrefillEvent, PromptEvent, StepEvent
from tokentui.core.runs.explore_events import FanoutEvent, SampleEvent
from tokentui.core.runs.requests import MAX_SAMPLES, FanoutRequest
from tokentui.core.runs.run import Run
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.core.steps.decode import decode_one_token
from tokentui.core.steps.detokenize import oneshot_text
from tokentui.core.steps.prefill import prefill
from tokentui.core.steps.select import reference_probs, select

PROMPT = "Is OpenAI open?"
AT = 3
SAMPLING = SamplerSettings(temperature=0.8, top_p=0.95, seed=11)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, smol_tokenizer):
    model = tiny_model(request.param, smol_tokenizer, initializer_range=0.2)
    return LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name=f"tiny-{request.param}"))


def of(kind, events):
    return [e for e in events if isinstance(e, kind)]


def engine_with_parent(loaded, sampler=SAMPLING, n=8):
    engine = Engine(loaded, sampler, RunOptions(max_new_tokens=n, ignore_eos=True))
    events = list(engine.run(PROMPT))
    return engine, of(PromptEvent, events)[0].ids, of(StepEvent, events)


def request_of(prompt_ids, steps, n=6, m=7, seed=40, at=AT) -> FanoutRequest:
    return FanoutRequest(tuple(prompt_ids), tuple(s.id for s in steps[:at]), at, n, m, seed, "p",
                         steps[at].id if at < len(steps) else None)


def replay_draws(model, prefix: list[int], sample: SampleEvent, settings: SamplerSettings, top_n: int = 10) -> int:
    """A single-sequence run from the fan-out's step forced through the sample's draws: a generator seeded with the
    sample's seed, `select` on the unbatched model's scores at each step, then the sample's token fed. Each draw must
    be the sample's token, or — the two forwards round differently — one exactly as likely (a tie whose order the
    rounding decided); returns how many ties there were."""
    generator = torch.Generator().manual_seed(sample.seed)
    cache, _ = TorchForward(model).new_cache(len(prefix), len(sample.ids))
    logits, _ = prefill(model, prefix, cache)
    ties = 0
    for token, prob in zip(sample.ids, sample.probs):
        sel = select(logits, settings, generator, top_n)
        if sel.token_id != token:
            assert sel.chosen_prob == pytest.approx(float(reference_probs(logits, settings)[token]), rel=1e-4)
            ties += 1
        else:
            assert sel.chosen_prob == pytest.approx(prob, rel=1e-4, abs=1e-7)
        logits, _ = decode_one_token(token, cache)
    return ties


def test_samples_equal_a_teacher_forced_forward_and_a_single_sequence_run_with_their_seed(tiny):
    engine, prompt_ids, steps = engine_with_parent(tiny)
    request = request_of(prompt_ids, steps)
    shapes = []
    hook = tiny.model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        events = list(engine.fanout(request))
    finally:
        hook.remove()
    start, prefilled, samples, done = (of(FanoutEvent, events)[0], of(PrefillEvent, events)[0],
                                       of(SampleEvent, events), events[-1])
    assert events[0] is start and isinstance(done, DoneEvent) and done.reason == "length"
    assert (start.at, start.n, start.m, start.seed, start.parent_id) == (AT, 6, 7, 40, steps[AT].id)
    assert start.tokens == [s.id for s in steps[:AT]] and start.settings == SAMPLING
    # the prefix's KV cache once (the parent's, cut back: one token fed), then one [N, 1] forward per step
    reused = len(prompt_ids) + AT - 1
    assert start.kv_reused_tokens == prefilled.reused_tokens == reused and prefilled.tokens == 1
    assert shapes == [(1, 1)] + [(6, 1)] * 6
    assert done.kv_tokens == reused + 1 + 6 and done.kv_bytes == 6 * done.kv_tokens * tiny.facts.kv_bytes_per_token
    assert [s.n for s in samples] == list(range(6)) and [s.seed for s in samples] == list(range(40, 46))
    prefix = list(prompt_ids) + list(request.tokens)
    ties = 0
    for sample in samples:
        assert len(sample.ids) == 7 and sample.reason == "length"
        # raw probabilities: one teacher-forced forward over prefix + sample
        with torch.inference_mode():
            logp = torch.log_softmax(tiny.model(input_ids=torch.tensor([prefix + sample.ids])).logits[0].float(), -1)
        expected = [float(logp[len(prefix) - 1 + j, t].exp()) for j, t in enumerate(sample.ids)]
        assert sample.raw_probs == pytest.approx(expected, rel=1e-4, abs=1e-7)
        assert sample.logprob == pytest.approx(sum(math.log(p) for p in sample.probs), rel=1e-9)
        # its text goes on from the prefix's: together, a one-shot decode (less bytes of a character left unfinished)
        whole = oneshot_text(tiny.tokenizer, list(request.tokens) + sample.ids)
        assert start.prefix_text + sample.text == whole.rstrip("\ufffd")
        ties += replay_draws(tiny.model, prefix, sample, SAMPLING)
    assert ties <= 2  # 42 draws; a tie is rare (a flat tail of equally likely tokens)
    assert len({tuple(s.ids) for s in samples}) > 1  # at temperature 0.8 the samples differ


def test_first_tokens_converge_to_the_steps_post_sampler_probabilities(tiny):
    engine, prompt_ids, steps = engine_with_parent(tiny, SamplerSettings(temperature=1.3, top_k=6, top_p=1.0, seed=0))
    counts: Counter = Counter()
    candidates = None
    for k in range(16):  # 16 fan-outs × 64 samples = 1,024 first tokens, every seed its own
        events = list(engine.fanout(request_of(prompt_ids, steps, n=MAX_SAMPLES, m=1, seed=k * MAX_SAMPLES)))
        candidates = candidates or of(FanoutEvent, events)[0].candidates
        counts.update(s.ids[0] for s in of(SampleEvent, events))
    draws = sum(counts.values())
    assert draws == 1024
    kept = [c for c in candidates if c.prob > 0]
    assert len(kept) == 6 and set(counts) <= {c.id for c in kept}  # top-k 6: nothing else is ever drawn
    for c in kept:
        # 4.5 standard errors of a binomial frequency: a false alarm about 1 in 100,000 per token
        tolerance = 4.5 * math.sqrt(c.prob * (1 - c.prob) / draws)
        assert abs(counts[c.id] / draws - c.prob) <= tolerance, (c.piece, counts[c.id] / draws, c.prob)


def test_an_adopted_sample_is_a_phrase_branch_that_reuses_the_prefix_cache(tiny):
    engine, prompt_ids, steps = engine_with_parent(tiny)
    request = request_of(prompt_ids, steps, n=3, m=5)
    samples = of(SampleEvent, engine.fanout(request))
    chosen = samples[1]
    point = BranchPoint(request.prompt_ids, request.tokens, AT, chosen.ids[0], phrase=tuple(chosen.ids),
                        sample=chosen.n)
    events = list(engine.branch(point))
    branch = of(BranchEvent, events)[0]
    assert branch.sample == 1 and branch.kv_reused_tokens == len(prompt_ids) + AT - 1
    forced = [s for s in of(StepEvent, events) if s.forced]
    assert [s.id for s in forced] == chosen.ids
    assert [s.chosen_raw_prob for s in forced] == pytest.approx(chosen.raw_probs, rel=1e-4, abs=1e-7)


def test_greedy_says_all_samples_are_the_same_and_a_stop_keeps_what_was_drawn(tiny):
    engine, prompt_ids, steps = engine_with_parent(tiny, SamplerSettings(temperature=0.0))
    events = list(engine.fanout(request_of(prompt_ids, steps, n=4, m=4)))
    assert any("all 4 samples are the same" in e.message for e in of(Notice, events))
    assert len({tuple(s.ids) for s in of(SampleEvent, events)}) == 1
    assert all(s.probs == [1.0] * 4 and s.logprob == 0.0 for s in of(SampleEvent, events))
    engine, prompt_ids, steps = engine_with_parent(tiny)
    seen = []
    for event in engine.fanout(request_of(prompt_ids, steps, n=2, m=50)):
        seen.append(event)
        if isinstance(event, PrefillEvent):
            engine.stop()  # before the second step
    samples = of(SampleEvent, seen)
    assert seen[-1].reason == "stopped" and all(len(s.ids) == 1 and s.reason == "stopped" for s in samples)


def test_bad_fanouts_are_one_line_and_the_record_round_trips(tiny, tmp_path):
    for bad in (dict(n=0), dict(n=MAX_SAMPLES + 1), dict(m=0), dict(m=5000), dict(n=True), dict(seed=-1)):
        with pytest.raises(SettingsError) as err:
            FanoutRequest((1, 2), (), 0, **bad)
        assert "\n" not in str(err.value)
    engine, prompt_ids, steps = engine_with_parent(tiny)
    held = engine.held_ids
    error = failure_of(engine.fanout(request_of(prompt_ids, steps, n=2, m=1000)))
    assert error.kind == ErrorKind.PROMPT and "context" in error.message and "\n" not in error.message
    assert engine.held_ids == held  # nothing ran: the parent's cache is still there
    run = Run(engine.facts)
    for event in engine.fanout(request_of(prompt_ids, steps, n=2, m=3)):
        run.apply(event)
    assert run.fanout is not None and len(run.samples) == 2 and len(run) == 0
    back = Run.from_record(run.save(tmp_path / "fanout.jsonl"))
    assert back.fanout == run.fanout and back.samples == run.samples


@pytest.mark.parametrize("name", ["mistral", "gemma2", "gpt2", "deepseek_v3", "mamba", "qwen3_next"])
def test_every_cache_kind_fans_out(name, smol_tokenizer):
    """Sliding windows, learned positions, MLA's latent, a recurrent state, a hybrid: each sample's raw
    probabilities against a teacher-forced forward (the rows' copies of the cache are each the prefix's)."""
    from arch_matrix import build

    model = build(name, smol_tokenizer)
    loaded = LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name=name))
    engine, prompt_ids, steps = engine_with_parent(loaded)
    events = list(engine.fanout(request_of(prompt_ids, steps, n=3, m=5)))
    assert not of(ErrorEvent, events), of(ErrorEvent, events)
    prefix = list(prompt_ids) + [s.id for s in steps[:AT]]
    samples = of(SampleEvent, events)
    assert len(samples) == 3 and all(len(s.ids) == 5 for s in samples)
    for sample in samples:
        with torch.inference_mode():
            logp = torch.log_softmax(model(input_ids=torch.tensor([prefix + sample.ids])).logits[0].float(), -1)
        expected = [float(logp[len(prefix) - 1 + j, t].exp()) for j, t in enumerate(sample.ids)]
        assert sample.raw_probs == pytest.approx(expected, rel=1e-4, abs=1e-7), name
