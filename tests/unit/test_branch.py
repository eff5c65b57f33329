"""Branching with KV reuse (core/model/branch.py, `Engine.branch`, `tokentui branch`), each number against an oracle:
a fresh prefill's KV cache, transformers' `generate(do_sample=False)` from prompt + prefix + the forced token,
the parent step's own candidates, the tokenizer's one-shot decode. Tiny random-weight Llama / Qwen2 / Qwen3 models
(scaled-up initial weights, so greedy answers vary token to token) and the embedded SmolLM2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tiny_models import tiny_model
from tiny_models import generate_ids
from cli_run import tokentui
from run_checks import failure_of
from tokentui.core.errors import ErrorKind
from tokentui.core.model import branch as branch_module
from transformers import StaticCache
from tokentui.core.model.decode.adapter import new_cache
from tokentui.core.model.branch import BranchPoint, HeldCache, crop_cache, crop_problem
from tokentui.core.model.decode.run_cache import RunCache
from tokentui.core.model.decode.steps import CompiledWhole, TorchForward
from tokentui.core.steps.detokenize import oneshot_text
from tokentui.core.model.engine import Engine
from tokentui.core.errors import SettingsError
from tokentui.core.runs.events import (BranchEvent, DoneEvent, ErrorEvent, Notice, PrefillEvent, PromptEvent,
                                  StepEvent)
from tokentui.core.model.decode.kvcache import cache_nbytes, cache_tokens
from tokentui.core.model.decode.adapter import cache_layers
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.steps.prefill import prefill
from tokentui.core.runs.run import Run, RunError
from tokentui.core.steps.select import reference_probs
from tokentui.core.settings import RunOptions, SamplerSettings

PROMPT = "Is OpenAI open?"
AT = 4  # 0-based step index of the branch point in the tiny-model tests


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny(request, smol_tokenizer):
    model = tiny_model(request.param, smol_tokenizer, initializer_range=0.2)
    return LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name=f"tiny-{request.param}"))


@pytest.fixture(scope="module")
def tiny_llama(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer, initializer_range=0.2)
    return LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name="tiny-llama"))


def greedy_engine(loaded, n=10, **sampler) -> Engine:
    return Engine(loaded, SamplerSettings(**({"temperature": 0.0} | sampler)),
                  RunOptions(max_new_tokens=n, ignore_eos=True))


def parent_run(engine, prompt=PROMPT):
    events = list(engine.run(prompt))
    prompt_event = next(e for e in events if isinstance(e, PromptEvent))
    steps = [e for e in events if isinstance(e, StepEvent)]
    return prompt_event.ids, steps


def point_at(prompt_ids, steps, at, token, **kw) -> BranchPoint:
    return BranchPoint(tuple(prompt_ids), tuple(s.id for s in steps[:at]), at, token, **kw)


def of(kind, events):
    return [e for e in events if isinstance(e, kind)]


# ------------------------------------------------------------------------------------------------- the cache
@pytest.mark.parametrize("growable", [True, False])
def test_a_cropped_cache_is_exactly_a_fresh_prefill_of_the_prefix(tiny, growable):
    engine = greedy_engine(tiny)
    prompt_ids, steps = parent_run(engine)
    ids = list(prompt_ids) + [s.id for s in steps]
    keep = len(prompt_ids) + AT - 1
    if growable:  # the engine's own cache (GrowableLayer), as its run left it
        held = engine.take_held_cache()
        engine.hold_cache(held)  # looked at, and kept for a branch as the run left it
        cache = held.cache
        assert engine.held_ids == tuple(ids[:-1]) and cache.tokens() == len(ids) - 1
    else:  # transformers' DynamicLayer, filled by one prefill
        cache = RunCache(new_cache(tiny.model), TorchForward(tiny.model))
        prefill(tiny.model, ids, cache)
    crop_cache(cache, keep)
    fresh, _ = TorchForward(tiny.model).new_cache(keep, 0)
    prefill(tiny.model, ids[:keep], fresh)
    assert cache.tokens() == fresh.tokens() == keep
    assert cache_tokens(cache.kv) == cache_tokens(fresh.kv) == keep  # transformers' own count
    assert cache.nbytes() == cache_nbytes(fresh.kv) == keep * tiny.facts.kv_bytes_per_token
    for (k, v), (fk, fv) in zip(cache_layers(cache.kv), cache_layers(fresh.kv), strict=True):
        assert k.shape == fk.shape and v.shape == fv.shape
        torch.testing.assert_close(k, fk, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v, fv, rtol=1e-4, atol=1e-5)


def static_run_cache(model) -> RunCache:
    """A run's cache as --compile's whole step makes it (a static cache, counted on the host)."""
    return RunCache(StaticCache(config=model.config, max_cache_len=64), CompiledWhole(None, TorchForward(model)),
                    static=True)


def test_crop_refuses_what_it_cannot_do(tiny_llama):
    cache, _ = TorchForward(tiny_llama.model).new_cache(4, 12)
    prefill(tiny_llama.model, [1, 2, 3, 4], cache)
    with pytest.raises(ValueError):
        crop_cache(cache, 5)
    assert "--compile" in crop_problem(static_run_cache(tiny_llama.model))
    assert crop_problem(cache) is None


# ------------------------------------------------------------------------------------------------- greedy = generate
def test_greedy_branch_reuses_the_cache_and_equals_generate(tiny):
    engine = greedy_engine(tiny)
    prompt_ids, steps = parent_run(engine)
    parent = steps[AT]
    forced = parent.candidates[1].id  # the runner-up of that step
    point = point_at(prompt_ids, steps, AT, forced, parent="p", parent_token=parent.id)
    events = list(engine.branch(point))
    assert not of(ErrorEvent, events)
    branch, prefilled, done = of(BranchEvent, events)[0], of(PrefillEvent, events)[0], events[-1]
    assert events[0] is branch
    reused = len(prompt_ids) + AT - 1
    assert (branch.at, branch.id, branch.parent_id, branch.parent) == (AT, forced, parent.id, "p")
    assert branch.kv_reused_tokens == reused and branch.tokens == [s.id for s in steps[:AT]]
    assert (prefilled.tokens, prefilled.reused_tokens, prefilled.kv_tokens) == (1, reused, reused + 1)
    new = of(StepEvent, events)
    assert [s.index for s in new] == list(range(AT, AT + 10))
    assert [s.forced for s in new] == [True] + [False] * 9
    ids = [s.id for s in new]
    assert ids[0] == forced
    assert ids[1:] == generate_ids(tiny.model, list(prompt_ids) + list(point.tokens) + [forced], 9)
    # the forced step shows the genuine distribution of step AT, and the forced token's own numbers
    first = new[0]
    assert [c.id for c in first.candidates] == [c.id for c in parent.candidates]
    for mine, theirs in zip(first.candidates, parent.candidates):
        assert mine.raw_prob == pytest.approx(theirs.raw_prob, rel=1e-4, abs=1e-7)
    assert first.chosen_raw_prob == pytest.approx(parent.candidates[1].raw_prob, rel=1e-4)
    assert first.chosen_rank == 1 and first.chosen_prob == 0.0  # greedy keeps only the top token
    assert any(isinstance(e, Notice) and "probability 0" in e.message for e in events)
    assert isinstance(done, DoneEvent) and done.tokens == done.runs == 10 and done.prompt_tokens == len(prompt_ids)
    assert done.text == oneshot_text(tiny.tokenizer, list(point.tokens) + ids)
    assert first.kv_tokens == reused + 1 and new[-1].kv_tokens == reused + 10


def test_without_a_held_cache_the_prefix_is_prefilled_once_and_gives_the_same_branch(tiny_llama):
    engine = greedy_engine(tiny_llama)
    prompt_ids, steps = parent_run(engine)
    point = point_at(prompt_ids, steps, AT, steps[AT].candidates[2].id)
    reused_ids = [s.id for s in of(StepEvent, engine.branch(point))]
    fresh = greedy_engine(tiny_llama)  # a new process, as `tokentui branch` is: nothing held
    events = list(fresh.branch(point))
    prefilled = of(PrefillEvent, events)[0]
    assert of(BranchEvent, events)[0].kv_reused_tokens == 0
    assert (prefilled.tokens, prefilled.reused_tokens) == (len(prompt_ids) + AT, 0)
    assert [s.id for s in of(StepEvent, events)] == reused_ids
    # a held cache of another prompt is not reused either (and that needs no notice)
    parent_run(fresh, "Something else entirely")
    events = list(fresh.branch(point))
    assert of(BranchEvent, events)[0].kv_reused_tokens == 0
    assert not any("not reused" in e.message for e in of(Notice, events))
    assert [s.id for s in of(StepEvent, events)] == reused_ids


def test_reuse_runs_one_single_token_forward(tiny_llama):
    engine = greedy_engine(tiny_llama)
    prompt_ids, steps = parent_run(engine)
    lengths = []
    hook = tiny_llama.model.register_forward_pre_hook(
        lambda module, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        events = list(engine.branch(point_at(prompt_ids, steps, AT, 42)))
    finally:
        hook.remove()
    assert not of(ErrorEvent, events)
    assert lengths == [1] * 10  # the step's scores by one decode, then 9 decodes: no prefill at all


def test_a_branch_never_reads_past_its_crop(tiny_llama, monkeypatch):
    engine = greedy_engine(tiny_llama)
    prompt_ids, steps = parent_run(engine)
    keep = len(prompt_ids) + AT - 1
    held = engine.take_held_cache()
    engine.hold_cache(held)
    with torch.inference_mode():  # poison every position past the crop, in the buffers themselves
        for layer in held.cache.kv.layers:
            layer._kbuf[..., keep:, :] = float("nan")
            layer._vbuf[..., keep:, :] = float("nan")
    seen = []
    real = branch_module.decode_one_token

    def spy(token_id, cache, **kw):
        seen.append((token_id, cache.tokens()))
        return real(token_id, cache, **kw)

    monkeypatch.setattr(branch_module, "decode_one_token", spy)
    point = point_at(prompt_ids, steps, AT, steps[AT].candidates[1].id)
    events = list(engine.branch(point))
    assert not of(ErrorEvent, events), of(ErrorEvent, events)  # a NaN read would end the branch with an error
    assert seen == [(steps[AT - 1].id, keep)]  # t(k-1) fed at position L + k - 1
    ids = [s.id for s in of(StepEvent, events)]
    assert ids[1:] == generate_ids(tiny_llama.model, list(prompt_ids) + list(point.tokens) + [ids[0]], 9)


def test_at_step_zero_the_prompts_last_token_is_fed_again(tiny_llama):
    engine = greedy_engine(tiny_llama, n=6)
    prompt_ids, steps = parent_run(engine)
    forced = steps[0].candidates[3].id
    events = list(engine.branch(point_at(prompt_ids, steps, 0, forced)))
    assert of(BranchEvent, events)[0].kv_reused_tokens == len(prompt_ids) - 1
    ids = [s.id for s in of(StepEvent, events)]
    assert ids == [forced] + generate_ids(tiny_llama.model, list(prompt_ids) + [forced], 5)


def test_a_branch_of_a_branch_reuses_the_branch_cache(tiny_llama):
    engine = greedy_engine(tiny_llama)
    prompt_ids, steps = parent_run(engine)
    first = Run(engine.facts)
    for event in engine.branch(point_at(prompt_ids, steps, AT, steps[AT].candidates[1].id, parent="p")):
        first.apply(event)
    point = BranchPoint.of_run(first, AT + 2, 7, parent="b1")
    assert point.tokens[:AT] == tuple(s.id for s in steps[:AT]) and point.parent_token == first[2].id
    events = list(engine.branch(point))
    assert of(BranchEvent, events)[0].kv_reused_tokens == len(prompt_ids) + AT + 1
    ids = [s.id for s in of(StepEvent, events)]
    assert ids[1:] == generate_ids(tiny_llama.model, list(prompt_ids) + list(point.tokens) + [7], 9)


def test_a_held_static_cache_is_not_reused_and_a_notice_says_why(tiny_llama):
    engine = greedy_engine(tiny_llama)
    prompt_ids, steps = parent_run(engine)
    point = point_at(prompt_ids, steps, AT, 9)
    expected = [s.id for s in of(StepEvent, greedy_engine(tiny_llama).branch(point))]
    engine.hold_cache(HeldCache(static_run_cache(tiny_llama.model), engine.held_ids))
    events = list(engine.branch(point))
    notes = [e.message for e in of(Notice, events)]
    assert any("not reused" in n and "--compile" in n for n in notes)
    assert of(BranchEvent, events)[0].kv_reused_tokens == 0
    assert of(PrefillEvent, events)[0].tokens == len(prompt_ids) + AT
    assert [s.id for s in of(StepEvent, events)] == expected


# ------------------------------------------------------------------------------------------------- sampling
def test_a_forced_token_the_sampler_cut_has_probability_zero(tiny_llama):
    engine = Engine(tiny_llama, SamplerSettings(temperature=0.7, top_k=3, top_p=1.0, seed=3),
                    RunOptions(max_new_tokens=AT + 2, ignore_eos=True))
    prompt_ids, steps = parent_run(engine)
    parent = steps[AT]
    for rank, cut in ((0, False), (6, True)):
        events = list(engine.branch(point_at(prompt_ids, steps, AT, parent.candidates[rank].id)))
        first = of(StepEvent, events)[0]
        assert first.forced and first.id == parent.candidates[rank].id
        assert first.chosen_prob == pytest.approx(parent.candidates[rank].prob, abs=1e-6)
        assert (first.chosen_prob == 0.0) == cut
        assert any("probability 0" in e.message for e in of(Notice, events)) == cut
        assert first.kept_count == parent.kept_count and first.settings == parent.settings


def test_forced_selection_of_a_token_outside_the_candidates(tiny_llama):
    logits = torch.randn(tiny_llama.facts.vocab_rows, generator=torch.Generator().manual_seed(0)) * 3
    settings = SamplerSettings(temperature=0.9, top_p=1.0)
    token = int(torch.argsort(logits)[len(logits) // 2])  # mid-ranked: outside the top 10, not cut by top-p 1
    sel = branch_module.forced_selection(logits, settings, torch.Generator().manual_seed(1), 10, token)
    assert sel.token_id == token and token not in sel.top_ids
    assert sel.chosen_rank == int((logits > logits[token]).sum())
    assert sel.chosen_prob == pytest.approx(float(reference_probs(logits, settings)[token]), rel=1e-4)
    assert sel.chosen_raw_prob == pytest.approx(float(torch.softmax(logits, -1)[token]), rel=1e-4)


# ------------------------------------------------------------------------------------------------- checks, control
def test_branch_points_are_checked_as_built():
    for bad in [dict(prompt_ids=(), tokens=(), at=0, token=1), dict(prompt_ids=(1,), tokens=(2,), at=0, token=1),
                dict(prompt_ids=(1,), tokens=(), at=-1, token=1), dict(prompt_ids=(1,), tokens=(), at=0, token=-3),
                dict(prompt_ids=(1, True), tokens=(), at=0, token=1), dict(prompt_ids=(1,), tokens=(), at=0,
                                                                            token=1, parent=5)]:
        with pytest.raises(SettingsError) as err:
            BranchPoint(**bad)
        assert "\n" not in str(err.value)
    assert BranchPoint([1, 2], [3], 1, 4).prompt_ids == (1, 2)  # lists become tuples: frozen all the way


def test_a_token_outside_the_vocabulary_is_one_line_and_keeps_the_held_cache(tiny_llama):
    engine = greedy_engine(tiny_llama, n=4)
    prompt_ids, steps = parent_run(engine)
    held = engine.held_ids
    events = list(engine.branch(point_at(prompt_ids, steps, 2, tiny_llama.facts.vocab_rows)))
    error = failure_of(events)
    assert len(events) == 2 and error.kind == ErrorKind.SETTINGS
    assert "vocabulary" in error.message and "\n" not in error.message
    assert engine.held_ids == held


def test_stop_before_the_first_step_keeps_the_held_cache(tiny_llama):
    engine = greedy_engine(tiny_llama, n=6)
    prompt_ids, steps = parent_run(engine)
    held = engine.held_ids
    point = point_at(prompt_ids, steps, AT, 11)
    events = []
    for event in engine.branch(point):
        events.append(event)
        if isinstance(event, BranchEvent):
            engine.stop()
    assert isinstance(events[-1], DoneEvent) and events[-1].reason == "stopped" and events[-1].tokens == 0
    assert engine.held_ids == held
    assert of(BranchEvent, list(engine.branch(point)))[0].kv_reused_tokens == len(prompt_ids) + AT - 1


# ------------------------------------------------------------------------------------------------- the run model
def test_a_branch_run_navigates_by_position_and_round_trips_through_a_record(tiny_llama, tmp_path):
    engine = greedy_engine(tiny_llama, n=5)
    prompt_ids, steps = parent_run(engine)
    run = Run(engine.facts)
    events = list(engine.branch(point_at(prompt_ids, steps, AT, 5)))
    for event in events:
        run.apply(event)
    assert run.offset == AT and len(run) == 5 and run.branch is events[0]
    assert [s.index for s in run] == run.values("index") == list(range(AT, AT + 5))
    assert run[0].forced and not run[1].forced and run.cursor(0).step.index == AT
    assert run.text == events[-1].text
    back = Run.from_record(run.save(tmp_path / "branch.jsonl"))
    assert [e.to_dict() for e in back.events()] == [e.to_dict() for e in run.events()]
    with pytest.raises(RunError):
        run.apply(events[0])  # a second branch event
    with pytest.raises(RunError):
        Run(engine.facts).apply(of(StepEvent, events)[0])  # step AT without its branch event


# ------------------------------------------------------------------------------------------------- embedded model
def test_embedded_greedy_branch_equals_generate(embedded, embedded_stock):
    engine = greedy_engine(embedded, n=8)
    prompt_ids, steps = parent_run(engine)
    at = 3
    forced = steps[at].candidates[1].id
    point = point_at(prompt_ids, steps, at, forced)
    events = list(engine.branch(point))
    assert of(BranchEvent, events)[0].kv_reused_tokens == len(prompt_ids) + at - 1
    ids = [s.id for s in of(StepEvent, events)]
    assert ids[0] == forced
    assert ids[1:] == generate_ids(embedded_stock.model, list(prompt_ids) + list(point.tokens) + [forced], 7)
    assert events[-1].text == oneshot_text(embedded.tokenizer, list(point.tokens) + ids)


# ------------------------------------------------------------------------------------------------- the command
@pytest.fixture(scope="module")
def record(embedded, isolated_dirs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("branch-records")
    result = tokentui("--headless", "--json", "--temperature", "0", "--max-new-tokens", "8", "--ignore-eos",
                      "--record-dir", str(folder))
    assert result.returncode == 0, result.stderr
    (path,) = folder.glob("*.jsonl")
    return path


def test_cli_branch_streams_json_whose_greedy_ids_equal_generate(record, embedded_stock):
    parent = Run.from_record(record)
    forced = parent[2].candidates[1].id
    result = tokentui("branch", str(record), "--at", "3", "--token", str(forced), "--json", "--max-new-tokens", "6",
                      "--ignore-eos", "--no-record")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [e["event"] for e in events if e["event"] != "load"]
    assert kinds[:4] == ["model", "prompt", "branch", "prefill"] and kinds[-1] == "done"
    branch = next(e for e in events if e["event"] == "branch")
    prefix = [s.id for s in parent[:2]]
    assert (branch["at"], branch["id"], branch["parent_id"], branch["tokens"]) == (2, forced, parent[2].id, prefix)
    assert branch["parent"] == record.name and branch["kv_reused_tokens"] == 0  # a fresh process: prefilled
    steps = [e for e in events if e["event"] == "step"]
    assert [s["index"] for s in steps] == list(range(2, 8)) and steps[0]["forced"] and "forced" not in steps[1]
    ids = [s["id"] for s in steps]
    assert ids == [forced] + generate_ids(embedded_stock.model, parent.prompt.ids + prefix + [forced], 5)
    assert events[-1]["text"] == oneshot_text(embedded_stock.tokenizer, prefix + ids)


@pytest.mark.parametrize("args, needle", [
    (["--at", "1", "--token", "1"], "no such file"),
    (["--at", "99", "--token", "1"], "numbered 1..8"),
    (["--at", "0", "--token", "1"], "numbered 1..8"),
    (["--at", "2", "--token", "49152"], "not a token id"),
    (["--at", "2", "--token", "-1"], "not a token id"),
    (["--at", "2"], "required"),
    (["--at", "two", "--token", "1"], "integer"),
    (["--at", "2", "--token", "1", "--temperature", "-1"], "temperature"),
    (["--at", "2", "--token", "1", "--model", "/no/such/model"], "no such file"),
])
def test_cli_bad_input_is_one_line_and_exit_2(record, tmp_path, capsys, args, needle):
    from tokentui.cli import main

    path = str(tmp_path / "missing.jsonl") if needle == "no such file" and "--model" not in args else str(record)
    assert main(["branch", path, *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_a_record_whose_model_cannot_be_located_asks_for_model(record, tmp_path, capsys):
    from tokentui.cli import main

    lines = record.read_text(encoding="utf-8").splitlines()
    model = json.loads(lines[0])
    model.update(source="folder", name="tiny-llama")
    moved = tmp_path / "folder-model.jsonl"
    moved.write_text("\n".join([json.dumps(model)] + lines[1:]) + "\n", encoding="utf-8")
    not_a_record = tmp_path / "notes.jsonl"
    not_a_record.write_text("hello\n", encoding="utf-8")
    for path, needle in ((moved, "pass --model"), (not_a_record, "not JSON")):
        assert main(["branch", str(path), "--at", "2", "--token", "5"]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1
