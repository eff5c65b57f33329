"""Scoring a text (core/model/scoring.py through `Engine.score`): every step against a teacher-forced forward
(fp32), and the same numbers by a second route — the live engine generating the same tokens greedily; the summary
from the steps; the lens, a branch and the record over a scored run."""

from __future__ import annotations

import math

import pytest
import torch

from run_checks import failure_of
from tiny_models import generate_ids, tiny_model
from tokentui.core.errors import ErrorKind, PromptError
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.runs.events import BranchEvent, DoneEvent, PromptEvent, StepEvent
from tokentui.core.runs.explore_events import ScoreEvent, ScoreSummary
from tokentui.core.runs.requests import ScoreRequest
from tokentui.core.runs.run import Run
from tokentui.core.runs.scoring import score_summary
from tokentui.core.settings import RunOptions, SamplerSettings

PROMPT = "Is OpenAI open?"
N = 9


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny(request, smol_tokenizer):
    model = tiny_model(request.param, smol_tokenizer, initializer_range=0.2)
    return LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name=f"tiny-{request.param}"))


def of(kind, events):
    return [e for e in events if isinstance(e, kind)]


def engine_for(loaded, lens=False, **sampler) -> Engine:
    return Engine(loaded, SamplerSettings(**({"temperature": 0.0} | sampler)),
                  RunOptions(max_new_tokens=N, ignore_eos=True, logit_lens=lens))


def test_every_scored_step_equals_a_teacher_forced_forward(tiny):
    engine = engine_for(tiny, temperature=0.8, top_p=0.9)
    answer = " Partly. Some weights are open, the rest is not."
    events = list(engine.score(ScoreRequest(PROMPT, answer)))
    prompt, score = of(PromptEvent, events)[0], of(ScoreEvent, events)[0]
    ids = tiny.tokenizer(answer, add_special_tokens=False)["input_ids"]
    assert score.ids == ids and score.answer == answer and [p.id for p in score.pieces] == ids
    steps = of(StepEvent, events)
    assert [s.id for s in steps] == ids and all(s.forced for s in steps)
    assert [s.index for s in steps] == list(range(len(ids)))
    with torch.inference_mode():
        logits = tiny.model(input_ids=torch.tensor([prompt.ids + ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    for i, step in enumerate(steps):
        row = logp[len(prompt.ids) - 1 + i]
        assert step.chosen_raw_prob == pytest.approx(float(row[ids[i]].exp()), rel=1e-4, abs=1e-7)
        assert step.chosen_rank == int((row > row[ids[i]]).sum())
        top = torch.topk(row, len(step.candidates))
        assert [c.id for c in step.candidates] == top.indices.tolist()
        for c, p in zip(step.candidates, top.values.exp().tolist()):
            assert c.raw_prob == pytest.approx(p, rel=1e-4, abs=1e-7)
        assert step.settings.temperature == 0.8  # the post-sampler numbers under the settings in force
    summary, done = events[-2], events[-1]
    assert isinstance(summary, ScoreSummary) and isinstance(done, DoneEvent)
    expected = sum(float(logp[len(prompt.ids) - 1 + i, t]) for i, t in enumerate(ids))
    assert summary.tokens == len(ids) and summary.logprob == pytest.approx(expected, rel=1e-4)
    assert summary.perplexity == pytest.approx(math.exp(-expected / len(ids)), rel=1e-4)
    least = [t.raw_prob for t in summary.least_likely]
    assert least == sorted(least) and least[0] == min(s.chosen_raw_prob for s in steps)
    assert done.reason == "scored" and done.tokens == len(ids) and done.runs == 2 and done.decode_tok_s is None
    assert done.text == answer
    # the one forward over the answer: step 2 carries it (the ids it read), the steps after had none of their own
    assert steps[1].timing.h2d_bytes == 8 * (len(ids) - 1) and steps[1].forward_ms > 0
    assert all(s.forward_ms == 0.0 and s.timing.h2d_bytes == 8 * (len(ids) - 1) for s in steps[2:])
    assert steps[0].kv_tokens == len(prompt.ids) and steps[1].kv_tokens == len(prompt.ids) + len(ids) - 1
    assert summary.forward_ms == pytest.approx(steps[1].forward_ms, rel=1e-6)  # (the split's part also holds the
    # engine's microseconds around the forward: core/model/observe/timing.py)
    assert steps[1].forward_ms <= steps[1].timing.forward_ms


@pytest.mark.parametrize("lens", [False, True])
def test_scoring_a_greedy_answer_reports_what_the_engine_reported_generating_it(tiny, lens):
    engine = engine_for(tiny, lens=lens)
    generated = list(engine.run(PROMPT))
    made = of(StepEvent, generated)
    ids = [s.id for s in made]
    scored = of(StepEvent, engine.score(ScoreRequest(PROMPT, "", answer_ids=tuple(ids))))
    assert len(scored) == len(made) == N
    for a, b in zip(made, scored):
        assert (a.index, a.id, a.chosen_rank, a.kept_count, a.greedy) == (b.index, b.id, b.chosen_rank, b.kept_count,
                                                                          b.greedy)
        assert [c.id for c in a.candidates] == [c.id for c in b.candidates]
        for ca, cb in zip(a.candidates, b.candidates):
            assert cb.raw_prob == pytest.approx(ca.raw_prob, rel=1e-4, abs=1e-7)
            assert cb.prob == pytest.approx(ca.prob, rel=1e-4, abs=1e-7)
        assert b.chosen_raw_prob == pytest.approx(a.chosen_raw_prob, rel=1e-4)
        assert b.entropy_bits == pytest.approx(a.entropy_bits, rel=1e-4, abs=1e-6)
        assert (a.text, a.pending_hex) == (b.text, b.pending_hex)
        if lens:
            assert [r.id for r in a.lens] == [r.id for r in b.lens]
            assert [r.prob for r in b.lens] == pytest.approx([r.prob for r in a.lens], rel=1e-3, abs=1e-6)
        else:
            assert a.lens is None and b.lens is None


def test_a_branch_of_a_scored_text_reuses_its_cache_and_goes_on_as_generate(tiny, tmp_path):
    engine = engine_for(tiny)
    answer = " The weights are open; the code is not."
    run = Run(engine.facts)
    for event in engine.score(ScoreRequest(PROMPT, answer)):
        run.apply(event)
    assert run.score is not None and run.score_summary is not None and len(run) == len(run.score.ids)
    back = Run.from_record(run.save(tmp_path / "scored.jsonl"))  # a scored run is a record like any other
    assert back.score == run.score and back.score_summary == run.score_summary and back.done.reason == "scored"
    at = 4
    token = run[at].candidates[1].id
    events = list(engine.branch(BranchPoint.of_run(run, at, token)))
    assert of(BranchEvent, events)[0].kv_reused_tokens == len(run.prompt.ids) + at - 1
    ids = [s.id for s in of(StepEvent, events)]
    full = list(run.prompt.ids) + list(run.score.ids[:at]) + [token]
    assert ids[1:] == generate_ids(tiny.model, full, N - 1, stop_at_eos=False)


def test_bad_answers_are_one_line(tiny):
    engine = engine_for(tiny)
    for bad in (dict(prompt=PROMPT, answer=""), dict(prompt="  ", answer="x"), dict(prompt=PROMPT, answer=3)):
        with pytest.raises(PromptError) as err:
            ScoreRequest(**bad)
        assert "\n" not in str(err.value)
    long = "word " * 600  # the tiny models' context is 512 positions
    error = failure_of(engine.score(ScoreRequest(PROMPT, long)))
    assert error.kind == ErrorKind.PROMPT and "context" in error.message and "\n" not in error.message
    outside = ScoreRequest(PROMPT, "", answer_ids=(tiny.facts.vocab_rows,))
    assert "vocabulary" in failure_of(engine.score(outside)).message


def test_the_summary_of_no_steps_and_of_a_zero_probability():
    assert score_summary([]).perplexity == 1.0
    step = StepEvent(index=0, id=1, piece="a", special=False, text="a", pending_hex="", pending_needed=0,
                     completed_chars=[], candidates=[], chosen_rank=9, chosen_raw_prob=0.0, chosen_prob=0.0,
                     kept_count=1, kept_mass=1.0, entropy_bits=0.0, sampled_entropy_bits=0.0, greedy=True,
                     settings=SamplerSettings(), settings_changed=False, latency_ms=1.0, forward_ms=1.0, kv_tokens=1,
                     kv_bytes=1)
    summary = score_summary([step])
    assert summary.logprob == -math.inf and summary.perplexity == math.inf and summary.least_likely[0].rank == 9


@pytest.mark.parametrize("name", ["mamba", "falcon_mamba", "mamba2"])
def test_a_state_space_models_scored_answer_continues_the_prompts_state(name, smol_tokenizer):
    """Mamba-1's multi-token scan starts from zeros (core/steps/prefill.py continues_chunks): the answer's forward
    must read the state the prompt left, so every scored step equals one teacher-forced forward of prompt + answer
    (Mamba-2, whose scan continues its state, checks the other route)."""
    from arch_matrix import build

    model = build(name, smol_tokenizer)
    loaded = LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name=f"tiny-{name}"))
    answer = " Partly. Some weights are open, the rest is not."
    events = list(engine_for(loaded).score(ScoreRequest(PROMPT, answer)))
    prompt, steps = of(PromptEvent, events)[0], of(StepEvent, events)
    ids = smol_tokenizer(answer, add_special_tokens=False)["input_ids"]
    assert [s.id for s in steps] == ids
    with torch.inference_mode():
        logp = torch.log_softmax(model(input_ids=torch.tensor([prompt.ids + ids])).logits[0].float(), dim=-1)
    for i, step in enumerate(steps):
        expected = float(logp[len(prompt.ids) - 1 + i, ids[i]])
        assert math.log(step.chosen_raw_prob) == pytest.approx(expected, abs=2e-4), f"step {i + 1}"
