"""Forcing a phrase (core/model/forcing.py through `Engine.branch`): every number against an oracle — one
teacher-forced forward over prompt + prefix + phrase (fp32) for each forced token's raw probability, rank and the
model's own preference; transformers' `generate` for the greedy continuation after the phrase; a fresh prefill of
prompt + prefix + phrase for the KV cache after it. Tiny random-weight Llama / Qwen2 / Qwen3 models sharing the
embedded model's tokenizer."""

from __future__ import annotations

import pytest
import torch

from run_checks import failure_of
from tiny_models import generate_ids, tiny_model
from tokentui.core.errors import ErrorKind, SettingsError
from tokentui.core.model.decode.adapter import cache_layers
from tokentui.core.model.decode.steps import TorchForward
from tokentui.core.model.branch import crop_cache
from tokentui.core.model.engine import Engine
from tokentui.core.model.forcing import phrase_ids
from tokentui.core.model.decode.kvcache import cache_nbytes, cache_tokens
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.runs.events import BranchEvent, Notice, PromptEvent, StepEvent
from tokentui.core.runs.run import Run
from tokentui.core.runs.scoring import percent
from tokentui.core.runs.tree import TreeNode
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.core.steps.prefill import prefill

PROMPT = "Is OpenAI open?"
AT = 3
PHRASE = " Paris is the capital"
AFTER = 5  # greedy tokens generated after the phrase


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny(request, smol_tokenizer):
    model = tiny_model(request.param, smol_tokenizer, initializer_range=0.2)
    return LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name=f"tiny-{request.param}"))


def of(kind, events):
    return [e for e in events if isinstance(e, kind)]


def parent(engine):
    events = list(engine.run(PROMPT))
    return of(PromptEvent, events)[0].ids, of(StepEvent, events)


def phrase_point(engine, prompt_ids, steps, text=PHRASE, at=AT) -> BranchPoint:
    ids = tuple(p.id for p in engine.phrase_pieces(text))
    return BranchPoint(tuple(prompt_ids), tuple(s.id for s in steps[:at]), at, ids[0], parent="p",
                       parent_token=steps[at].id, phrase=ids, phrase_text=text)


def teacher_forced(model, ids: list[int]) -> torch.Tensor:
    """float32 log-probabilities of every next token over `ids`, one forward with no cache: [T, V]."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def test_each_forced_token_equals_a_teacher_forced_forward_and_greedy_goes_on_as_generate(tiny):
    engine = Engine(tiny, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=12, ignore_eos=True))
    prompt_ids, steps = parent(engine)
    point = phrase_point(engine, prompt_ids, steps)
    k = len(point.phrase)
    assert k >= 3 and point.phrase == tuple(tiny.tokenizer(PHRASE, add_special_tokens=False)["input_ids"])
    engine.options = RunOptions(max_new_tokens=k + AFTER, ignore_eos=True)
    events = list(engine.branch(point))
    branch = of(BranchEvent, events)[0]
    assert branch.phrase_ids == list(point.phrase) and branch.phrase_text == PHRASE and branch.id == point.phrase[0]
    new = of(StepEvent, events)
    assert [s.index for s in new] == list(range(AT, AT + k + AFTER))
    assert [s.forced for s in new] == [True] * k + [False] * AFTER
    assert [s.id for s in new[:k]] == list(point.phrase)
    # the oracle: one forward over prompt + prefix + phrase, fp32
    full = list(prompt_ids) + list(point.tokens) + list(point.phrase)
    logp = teacher_forced(tiny.model, full)
    for j, step in enumerate(new[:k]):
        row = logp[len(prompt_ids) + AT - 1 + j]  # the scores that predict the phrase's token j
        token = point.phrase[j]
        assert step.chosen_raw_prob == pytest.approx(float(row[token].exp()), rel=1e-4, abs=1e-7)
        assert step.chosen_rank == int((row > row[token]).sum())
        assert step.candidates[0].id == int(row.argmax())  # the token the model itself preferred there
        assert step.candidates[0].raw_prob == pytest.approx(float(row.max().exp()), rel=1e-4)
    # then greedy, exactly as generate from prompt + prefix + phrase
    assert [s.id for s in new[k:]] == generate_ids(tiny.model, full, AFTER, stop_at_eos=False)
    # the KV cache right after the phrase is a fresh prefill of it: tokens and bytes
    after = new[k]
    fresh, _ = TorchForward(tiny.model).new_cache(len(full), 0)
    prefill(tiny.model, full, fresh)
    assert after.kv_tokens == cache_tokens(fresh.kv) == len(full)
    assert after.kv_bytes == cache_nbytes(fresh.kv)
    held = engine.take_held_cache()  # and so are its tensors, cut back to there
    crop_cache(held.cache, len(full))
    for (hk, hv), (fk, fv) in zip(cache_layers(held.cache.kv), cache_layers(fresh.kv), strict=True):
        torch.testing.assert_close(hk, fk, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(hv, fv, rtol=1e-4, atol=1e-5)


def test_a_phrase_branch_reuses_the_parents_cache_and_the_record_round_trips(tiny, tmp_path):
    engine = Engine(tiny, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=10, ignore_eos=True))
    prompt_ids, steps = parent(engine)
    point = phrase_point(engine, prompt_ids, steps)
    run = Run(engine.facts)
    for event in engine.branch(point):
        run.apply(event)
    assert run.branch.kv_reused_tokens == len(prompt_ids) + AT - 1
    back = Run.from_record(run.save(tmp_path / "phrase.jsonl"))
    assert back.branch.phrase_ids == list(point.phrase) and back.branch.phrase_text == PHRASE
    assert [s.forced for s in back] == [s.forced for s in run]
    # a one-token branch writes its branch line without the phrase fields
    assert "phrase_ids" not in BranchEvent(0, 1, "a", None, None, 0, [1], [], "").to_dict()


def test_sampling_after_the_phrase_uses_the_settings_in_force_and_cut_tokens_are_told_once(tiny):
    engine = Engine(tiny, SamplerSettings(temperature=0.7, top_k=2, seed=5), RunOptions(max_new_tokens=12,
                                                                                         ignore_eos=True))
    prompt_ids, steps = parent(engine)
    point = phrase_point(engine, prompt_ids, steps, " zebra quantum")
    events = list(engine.branch(point))
    forced = [s for s in of(StepEvent, events) if s.forced]
    assert len(forced) == len(point.phrase) and all(s.settings.top_k == 2 for s in forced)
    cut = [s for s in forced if s.chosen_prob == 0.0]
    notes = [e.message for e in of(Notice, events) if "probability 0" in e.message]
    assert len(notes) == (1 if cut else 0)  # one notice for the phrase, however many of its tokens were cut


def test_bad_phrases_are_one_line_and_keep_the_held_cache(tiny):
    engine = Engine(tiny, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=4, ignore_eos=True))
    prompt_ids, steps = parent(engine)
    held = engine.held_ids
    long = BranchPoint(tuple(prompt_ids), tuple(s.id for s in steps[:AT]), AT, 5, phrase=(5,) * 5)
    error = failure_of(engine.branch(long))
    assert error.kind == ErrorKind.SETTINGS and "length limit" in error.message
    engine.options = RunOptions(max_new_tokens=600, ignore_eos=True)
    past = BranchPoint(tuple(prompt_ids), tuple(s.id for s in steps[:AT]), AT, 5, phrase=(5,) * 500)
    error = failure_of(engine.branch(past))
    assert error.kind == ErrorKind.PROMPT and "context" in error.message and "\n" not in error.message
    outside = BranchPoint(tuple(prompt_ids), (), 0, 5, phrase=(5, tiny.facts.vocab_rows))
    assert "vocabulary" in failure_of(engine.branch(outside)).message
    assert engine.held_ids == held
    assert engine.phrase_pieces("") == [] and phrase_ids(tiny.tokenizer, "") == []
    for bad in (dict(phrase=(6, 5)), dict(phrase=(5, -1)), dict(phrase_text=3), dict(sample=-1)):
        with pytest.raises(SettingsError):
            BranchPoint((1,), (), 0, 5, **bad)


def test_the_tree_file_names_a_phrase():
    node = TreeNode(2, parent=1, at=4, token=7, piece="␣Paris", phrase=[7, 8, 9], phrase_text=" Paris is")
    data = node.to_dict()
    assert data["phrase"] == [7, 8, 9] and data["phrase_text"] == " Paris is"
    assert TreeNode(**{k: v for k, v in data.items() if k != "event"}) == node
    assert "phrase" not in TreeNode(3, parent=1, at=4, token=7).to_dict()
    with pytest.raises(ValueError):
        TreeNode(2, parent=1, at=4, token=7, phrase=[8, 9])


def test_a_cut_forced_tokens_notice_says_its_raw_probability_by_the_one_rule(tiny):
    """Issue 40 item 8: the notice for a forced token greedy would never take says its raw probability as every
    other probability is said (core/runs/scoring.py's percent): on a tiny model's ~50k-entry vocabulary a token's
    raw probability is ~2e-5, which the old `:.2%` printed as 0.00%."""
    engine = Engine(tiny, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=4, ignore_eos=True))
    prompt_ids, steps = parent(engine)
    token = (steps[AT].id + 1) % tiny.facts.vocab_rows  # not greedy's pick: cut after sampling
    events = list(engine.branch(BranchPoint(tuple(prompt_ids), tuple(s.id for s in steps[:AT]), AT, token)))
    forced = next(s for s in of(StepEvent, events) if s.forced)
    note = next(e.message for e in of(Notice, events) if "probability 0" in e.message)
    assert 0 < forced.chosen_raw_prob < 5e-5
    assert note.endswith(f"its raw probability is {percent(forced.chosen_raw_prob)}") and "0.00%" not in note
