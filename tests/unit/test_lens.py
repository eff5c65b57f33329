"""The logit lens (core/model/observe/lens.py), each number against an oracle: the last layer's row against the step's own
logits, every row against the final norm and LM head applied by hand to each decoder layer's output (caught with
forward hooks of the test's own), records and headless JSON carrying it, a run without it asking the model for
nothing more, and a model whose output it cannot reproduce refused rather than shown. Every other decoder family:
tests/unit/test_architecture_matrix.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
import transformers

import tokentui.core.model.engine as engine_module
import tokentui.core.model.step_loop as step_loop
from tiny_models import tiny_gpt2, tiny_model
from cli_run import tokentui
from tokentui.core.model.engine import Engine
from tokentui.core.errors import SettingsError
from tokentui.core.runs.events import LensRow, Notice, PromptEvent, StepEvent
from tokentui.core.model.decode.adapter import new_cache
from tokentui.core.model.observe.lens import forward_last_states, lens_support, lens_unavailable, logit_lens
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.runs.run import Run
from tokentui.core.settings import RunOptions, SamplerSettings

GREEDY = SamplerSettings(temperature=0.0)


def engine_for(model, tokenizer, **options) -> Engine:
    loaded = LoadedModel(model=model, tokenizer=tokenizer, facts=model_facts(model, tokenizer, name="tiny"))
    return Engine(loaded, GREEDY, RunOptions(**{"ignore_eos": True, **options}))


def steps_of(events) -> list[StepEvent]:
    return [e for e in events if isinstance(e, StepEvent)]


def spy_logits(monkeypatch) -> list[torch.Tensor]:
    """The logits of every model run of the next engine run, in order: prefill's, then each decode step's."""
    seen: list[torch.Tensor] = []
    real_prefill, real_decode = engine_module.prefill_chunks, step_loop.decode_one_token

    def prefill(*args, **kwargs):
        for done, logits, ms in real_prefill(*args, **kwargs):
            if logits is not None:
                seen.append(logits.detach().clone())
            yield done, logits, ms

    def decode(*args, **kwargs):
        logits, ms = real_decode(*args, **kwargs)
        seen.append(logits.detach().clone())
        return logits, ms

    monkeypatch.setattr(engine_module, "prefill_chunks", prefill)
    monkeypatch.setattr(step_loop, "decode_one_token", decode)
    return seen


def assert_last_row_is_the_output(steps: list[StepEvent], logits: list[torch.Tensor], layers: int) -> None:
    assert len(steps) == len(logits) and len(steps) >= 2  # the prefill step and at least one decode step
    for step, scores in zip(steps, logits):
        assert [row.layer for row in step.lens] == list(range(1, layers + 1))
        probs = torch.softmax(scores.float(), dim=-1)
        last = step.lens[-1]
        assert last.id == int(scores.argmax()) == step.candidates[0].id
        assert last.prob == pytest.approx(float(probs.max()), rel=1e-4)
        assert last.piece == step.candidates[0].piece


# ---------------------------------------------------------------------------------------------- the real model
def test_last_layer_lens_is_the_embedded_models_own_output(embedded, monkeypatch):
    """SmolLM2's trained final norm: applying it twice to the last state (already normed) would change the row."""
    logits = spy_logits(monkeypatch)
    engine = Engine(embedded, GREEDY, RunOptions(max_new_tokens=5, ignore_eos=True, logit_lens=True))
    steps = steps_of(engine.run("Is OpenAI open?"))
    assert len(steps) == 5
    assert_last_row_is_the_output(steps, logits, embedded.facts.layers)
    assert all(0.0 < row.prob <= 1.0 for s in steps for row in s.lens)


# ---------------------------------------------------------------------------------------------- tiny models
def hooked_layer_outputs(model) -> tuple[list[list[torch.Tensor]], list]:
    """Per model run, each decoder layer's output at the last position (the residual stream after that layer)."""
    runs: list[list[torch.Tensor]] = []

    def pre(module, args, kwargs):
        runs.append([])

    def after(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output  # [1, T, H]
        runs[-1].append(hidden[0, -1].detach().clone())

    handles = [model.register_forward_pre_hook(pre, with_kwargs=True)]
    handles += [layer.register_forward_hook(after) for layer in model.model.layers]
    return runs, handles


@pytest.mark.parametrize("kind, tied", [("llama", True), ("llama", False), ("qwen2", True), ("qwen3", True)])
def test_tiny_model_lens_equals_the_norm_and_head_applied_by_hand(kind, tied, smol_tokenizer, monkeypatch):
    model = tiny_model(kind, smol_tokenizer, num_hidden_layers=3, tie_word_embeddings=tied)
    assert (model.lm_head.weight is model.get_input_embeddings().weight) == tied
    with torch.no_grad():  # a non-trivial final norm (random init leaves it all ones, which hides a double norm)
        model.model.norm.weight.copy_(torch.rand_like(model.model.norm.weight) * 2 + 0.2)
    assert lens_support(model) is None
    runs, handles = hooked_layer_outputs(model)
    logits = spy_logits(monkeypatch)
    try:
        steps = steps_of(engine_for(model, smol_tokenizer, max_new_tokens=4, logit_lens=True).run("Hi there"))
    finally:
        for handle in handles:
            handle.remove()
    assert len(runs) == len(steps) == 4
    for step, outputs in zip(steps, runs):
        assert len(outputs) == len(step.lens) == 3
        with torch.inference_mode():
            by_hand = torch.softmax(model.lm_head(model.model.norm(torch.stack(outputs))).float(), dim=-1)  # [L, V]
        for n, (row, probs) in enumerate(zip(step.lens, by_hand), 1):
            assert row.layer == n
            assert row.id == int(probs.argmax())
            assert row.prob == pytest.approx(float(probs.max()), rel=1e-4)
    assert_last_row_is_the_output(steps, logits, 3)


def test_bfloat16_lens_runs_and_matches_the_output(smol_tokenizer, monkeypatch):
    model = tiny_model("qwen3", smol_tokenizer).to(torch.bfloat16)
    logits = spy_logits(monkeypatch)
    steps = steps_of(engine_for(model, smol_tokenizer, max_new_tokens=3, logit_lens=True).run("Hi"))
    assert all(isinstance(row.prob, float) for row in steps[0].lens)
    for step, scores in zip(steps, logits):
        assert step.lens[-1].id == int(scores.argmax())
        assert step.lens[-1].prob == pytest.approx(float(torch.softmax(scores.float(), -1).max()), rel=2e-2)


def test_logit_lens_takes_the_block_outputs_forward_last_states_caught(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer)
    ids = torch.tensor([[1, 2, 3, 4]])
    logits, states = forward_last_states(model, ids, new_cache(model))
    assert states.shape == (2, 64)  # [L, H]: each block's output at the last position
    with torch.inference_mode():
        out = model(input_ids=ids, output_hidden_states=True)
    assert torch.allclose(states[0], out.hidden_states[1][0, -1])  # block 1's output, before any norm
    rows = logit_lens(model, states, piece=lambda i: f"<{i}>", logits=logits)
    probs = torch.softmax(out.logits[0, -1].float(), -1)
    assert [r.layer for r in rows] == [1, 2] and rows[-1].id == int(probs.argmax())
    assert rows[-1].piece == f"<{rows[-1].id}>" and rows[-1].prob == pytest.approx(float(probs.max()), rel=1e-5)
    with pytest.raises(ValueError, match="2 block outputs"):
        logit_lens(model, states[1:])


# ---------------------------------------------------------------------------------------------- refused
def test_a_model_without_an_lm_head_is_refused_in_one_line_and_the_run_goes_on(smol_tokenizer):
    model = tiny_gpt2(smol_tokenizer)
    model.get_output_embeddings = lambda: None  # a head tokentui cannot call
    reason = lens_support(model)
    assert reason is not None and "\n" not in reason and "GPT2LMHeadModel" in reason and "LM head" in reason
    events = list(engine_for(model, smol_tokenizer, max_new_tokens=3, logit_lens=True).run("Hi"))
    notices = [e.message for e in events if isinstance(e, Notice)]
    assert notices == [f"{reason}: running without it"]
    assert events.index(next(e for e in events if isinstance(e, Notice))) < events.index(
        next(e for e in events if isinstance(e, PromptEvent)))
    steps = steps_of(events)
    assert len(steps) == 3 and all(s.lens is None and "lens" not in s.to_dict() for s in steps)


class _ScaledLlama(transformers.LlamaForCausalLM):
    """A family that does something to its logits after the LM head that tokentui does not know (× 3)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 3.0
        return out


def test_a_model_whose_output_the_lens_cannot_reproduce_runs_without_it_and_says_so_once(smol_tokenizer):
    torch.manual_seed(0)
    reference = tiny_model("llama", smol_tokenizer)
    model = _ScaledLlama(reference.config).eval()
    model.load_state_dict(reference.state_dict())
    assert lens_support(model) is None  # its parts are where a Llama keeps them
    events = list(engine_for(model, smol_tokenizer, max_new_tokens=4, logit_lens=True).run("Hi"))
    notices = [e.message for e in events if isinstance(e, Notice)]
    assert len(notices) == 1 and "could not reproduce" in notices[0] and notices[0].endswith("running without it")
    steps = steps_of(events)
    assert len(steps) == 4 and all(s.lens is None for s in steps)  # not one row that is not the model's
    assert "could not reproduce" in lens_support(model)


def test_compiled_runs_are_refused_without_compiling(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer)
    assert lens_unavailable(model, compiled=False) is None
    message = lens_unavailable(model, compiled=True)
    assert "--compile" in message and "\n" not in message


def test_option_is_validated_and_off_by_default():
    assert RunOptions().logit_lens is False
    with pytest.raises(SettingsError, match="logit-lens must be true or false"):
        RunOptions(logit_lens="yes")
    from tokentui.cli import build_parser
    from tokentui.commands.common import settings_from_args

    assert settings_from_args(build_parser().parse_args(["--logit-lens"]))[1].logit_lens is True
    assert settings_from_args(build_parser().parse_args([]))[1].logit_lens is False


# ---------------------------------------------------------------------------------------------- what the model is asked
def spy_block_hooks(model) -> tuple[list[dict], object]:
    """Per forward: how many ids it read and whether forward hooks sat on the blocks (the lens's way of reading the
    residual stream) while it ran."""
    calls: list[dict] = []
    blocks = model.model.layers

    def pre(module, args, kwargs):
        calls.append({"hooked": all(len(b._forward_hooks) for b in blocks), "tokens": kwargs["input_ids"].shape[1],
                      "output_hidden_states": kwargs.get("output_hidden_states")})

    return calls, model.register_forward_pre_hook(pre, with_kwargs=True)


def test_lens_off_hooks_nothing_and_on_hooks_only_the_forwards_it_reads(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer)
    calls, handle = spy_block_hooks(model)
    try:
        off = list(engine_for(model, smol_tokenizer, max_new_tokens=3, prefill_chunk=8).run("Is OpenAI open?"))
        prompt_tokens = len(next(e for e in off if isinstance(e, PromptEvent)).ids)
        chunks = -(-prompt_tokens // 8)
        assert chunks >= 2 and len(calls) == chunks + 2
        assert not any(c["hooked"] or c["output_hidden_states"] for c in calls)
        assert all(s.lens is None and "lens" not in s.to_dict() for s in steps_of(off))
        calls.clear()
        on = list(engine_for(model, smol_tokenizer, max_new_tokens=3, prefill_chunk=8, logit_lens=True)
                  .run("Is OpenAI open?"))
    finally:
        handle.remove()
    # prefill: only the last chunk's forward is read (its last position scores the first token); then every decode
    assert [c["hooked"] for c in calls] == [False] * (chunks - 1) + [True] * 3
    assert not any(c["output_hidden_states"] for c in calls)
    assert all(not len(b._forward_hooks) for b in model.model.layers)  # none left behind
    assert [s.id for s in steps_of(on)] == [s.id for s in steps_of(off)]
    assert all(len(s.lens) == 2 for s in steps_of(on))


# ---------------------------------------------------------------------------------------------- records
def test_run_and_record_round_trip_the_lens(smol_tokenizer, tmp_path):
    model = tiny_model("qwen2", smol_tokenizer)
    engine = engine_for(model, smol_tokenizer, max_new_tokens=4, logit_lens=True)
    events = [engine.facts, *engine.run("Hi")]
    steps = steps_of(events)
    steps[1] = replace(steps[1], lens=None)  # a step without the lens and one with an empty lens keep that apart
    steps[2] = replace(steps[2], lens=[])
    events = [steps.pop(0) if isinstance(e, StepEvent) else e for e in events]
    run = Run()
    for event in events:
        run.apply(event)
    originals = steps_of(events)
    # the steps before the last are rebuilt from the run's columns (the last is the event kept as it came): the lens
    # rows, an empty lens and no lens each come back as they went in
    assert run[:-1] == originals[:-1] and originals[1].lens is None and originals[2].lens == []
    assert run[0].lens and isinstance(run[0].lens[0], LensRow)
    assert run[1].lens is None and run[2].lens == []
    path = run.save(tmp_path / "run.jsonl")
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    step_lines = [line for line in lines if line["event"] == "step"]
    assert "lens" not in step_lines[1] and step_lines[2]["lens"] == []
    assert set(step_lines[0]["lens"][0]) == {"layer", "id", "piece", "prob"}
    back = Run.from_record(path)
    assert list(back) == originals


# ---------------------------------------------------------------------------------------------- headless
def test_headless_json_carries_one_lens_row_per_layer(embedded, isolated_dirs, tmp_path):
    result = tokentui("--headless", "--json", "--logit-lens", "--temperature", "0", "--max-new-tokens", "3",
                      "--record-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    layers = next(e for e in events if e["event"] == "model")["layers"]
    steps = [e for e in events if e["event"] == "step"]
    assert len(steps) == 3 and not [e for e in events if e["event"] == "notice"]
    for step in steps:
        assert [row["layer"] for row in step["lens"]] == list(range(1, layers + 1))
        assert all(set(row) == {"layer", "id", "piece", "prob"} for row in step["lens"])
        assert step["lens"][-1]["id"] == step["candidates"][0]["id"] == step["id"]  # greedy: the chosen token
    (record,) = tmp_path.glob("*.jsonl")
    run = Run.from_record(record)
    assert [[(r.layer, r.id, r.piece, r.prob) for r in s.lens] for s in run] == \
        [[(r["layer"], r["id"], r["piece"], r["prob"]) for r in s["lens"]] for s in steps]


def test_headless_text_mode_says_where_the_lens_goes(embedded, isolated_dirs, tmp_path):
    result = tokentui("--headless", "--logit-lens", "--temperature", "0", "--max-new-tokens", "2", "--no-record")
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "--logit-lens" in line]
    assert len(notes) == 1 and "--json" in notes[0]
