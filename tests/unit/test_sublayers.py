"""What each sublayer adds (issue 39; core/model/observe/sublayers.py), against forward hooks of the test's own on
the HF modules: the block's input and output, the attention module's output (through the family's post-attention
norm where it has one) and the MLP's (through its post-feed-forward norm); the lens's top token after attention
against the final norm and head applied by hand to the stream after attention; the residual after the last layer,
normed and through the head, is the step's own top token; records and `--headless --json` carry both views and
replay reads them back (an older record, without them, still loads)."""

from __future__ import annotations

import json

import pytest
import torch

from arch_matrix import build
from cli_run import tokentui
from tiny_models import tiny_model
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.model.observe.sublayers import sublayers_unavailable
from tokentui.core.runs.attention import LayerAttention, SublayerRow
from tokentui.core.runs.events import StepEvent
from tokentui.core.runs.run import Run
from tokentui.core.settings import RunOptions, SamplerSettings

GREEDY = SamplerSettings(temperature=0.0)
TOL = 1e-5


def engine_for(model, tokenizer, **options) -> Engine:
    loaded = LoadedModel(model=model, tokenizer=tokenizer, facts=model_facts(model, tokenizer, name="tiny"))
    return Engine(loaded, GREEDY, RunOptions(**{"ignore_eos": True, **options}))


def last(output) -> torch.Tensor:
    hidden = output[0] if isinstance(output, (tuple, list)) else output
    return hidden[0, -1].detach().float().clone()


def hook_modules(model, layers, attn_out: str, mlp_out: str) -> tuple[list[dict], list]:
    """Per forward, per layer: the block's input and output and the two named modules' outputs (the attention's
    contribution, the MLP's) at the last position."""
    runs: list[dict] = []
    handles = [model.register_forward_pre_hook(lambda m, a, k: runs.append({}), with_kwargs=True)]
    for n, block in enumerate(layers, 1):
        def pre(module, args, kwargs, n=n):
            runs[-1][(n, "in")] = last(args[0] if args else kwargs["hidden_states"])

        def keep(name, n=n):
            return lambda module, args, output: runs[-1].__setitem__((n, name), last(output))

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(block.register_forward_hook(keep("out")))
        handles.append(block.get_submodule(attn_out).register_forward_hook(keep("attn")))
        handles.append(block.get_submodule(mlp_out).register_forward_hook(keep("mlp")))
    return runs, handles


FAMILIES = {  # model, blocks, the module whose output is attention's contribution, the MLP's
    "llama": (lambda tok: tiny_model("llama", tok, num_hidden_layers=3), "self_attn", "mlp"),
    "qwen3": (lambda tok: tiny_model("qwen3", tok), "self_attn", "mlp"),
    "gemma2_sandwich": (lambda tok: build("gemma2", tok, sliding_window=8), "post_attention_layernorm",
                        "post_feedforward_layernorm"),
    "gpt2": (lambda tok: build("gpt2", tok), "attn", "mlp"),
    "phi_parallel": (lambda tok: build("phi", tok), "self_attn", "mlp"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_norms_equal_forward_hooks_on_the_hf_modules(family, smol_tokenizer):
    make, attn_out, mlp_out = FAMILIES[family]
    model = make(smol_tokenizer)
    assert sublayers_unavailable(model) is None
    engine = engine_for(model, smol_tokenizer, max_new_tokens=3, sublayers=True, logit_lens=True)
    from tokentui.core.model.architecture import logits_ops, model_parts

    parts = model_parts(model)
    runs, handles = hook_modules(model, parts.layers, attn_out, mlp_out)
    try:
        steps = [e for e in engine.run("Hi") if isinstance(e, StepEvent)]
    finally:
        for handle in handles:
            handle.remove()
    assert len(runs) == len(steps) == 3
    for step, seen in zip(steps, runs):
        assert [row.layer for row in step.sublayers] == list(range(1, len(parts.layers) + 1))
        for row in step.sublayers:
            n = row.layer
            assert row.resid_before == pytest.approx(float(seen[(n, "in")].norm()), rel=TOL)
            assert row.resid_after == pytest.approx(float(seen[(n, "out")].norm()), rel=TOL)
            assert row.attn_norm == pytest.approx(float(seen[(n, "attn")].norm()), rel=1e-4, abs=1e-5)
            assert row.mlp_norm == pytest.approx(float(seen[(n, "mlp")].norm()), rel=TOL)
            # the lens after attention: the stream before the MLP through the final norm and the head, by hand
            with torch.no_grad():
                mid = (seen[(n, "in")] + seen[(n, "attn")])[None, None]
                if parts.norm is not None:
                    mid = parts.norm(mid)
                logits = parts.head(mid)[0, 0].float()
                for _, op in logits_ops(model):  # Gemma 2's final soft-cap, as the lens applies it
                    logits = op(logits)
            assert row.after_attn is not None and row.after_attn.id == int(logits.argmax())
            assert row.after_attn.prob == pytest.approx(float(torch.softmax(logits, -1).max()), rel=1e-4)
            assert row.after_mlp == step.lens[n - 1]
        # the residual after the last layer, normed and through the head, is the step's own output
        assert step.sublayers[-1].after_mlp.id == step.candidates[0].id == step.id


def test_without_the_lens_the_rows_have_norms_only(smol_tokenizer):
    model = tiny_model("qwen2", smol_tokenizer)
    steps = [e for e in engine_for(model, smol_tokenizer, max_new_tokens=2, sublayers=True).run("Hi")
             if isinstance(e, StepEvent)]
    assert all(r.after_attn is None and r.after_mlp is None for s in steps for r in s.sublayers)
    assert all(r.resid_after > 0 for s in steps for r in s.sublayers)


def test_a_state_space_model_says_so_in_one_line(smol_tokenizer):
    reason = sublayers_unavailable(build("mamba", smol_tokenizer))
    assert reason is not None and "\n" not in reason


# ---------------------------------------------------------------------------------------------- records, headless
def test_run_and_record_round_trip_both_views(smol_tokenizer, tmp_path):
    model = tiny_model("llama", smol_tokenizer)
    engine = engine_for(model, smol_tokenizer, max_new_tokens=3, attention=True, attention_heads=True,
                        sublayers=True, logit_lens=True)
    events = [engine.facts, *engine.run("Hi")]
    steps = [e for e in events if isinstance(e, StepEvent)]
    run = Run()
    for event in events:
        run.apply(event)
    assert list(run) == steps  # time travel: the run keeps what redraws a past step
    path = run.save(tmp_path / "run.jsonl")
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    step_lines = [line for line in lines if line["event"] == "step"]
    first = step_lines[0]["attention"][0]
    assert set(first) == {"layer", "query", "window", "top", "heads"}
    assert all(len(pair) == 2 and isinstance(pair[0], int) for pair in first["top"])
    assert set(step_lines[0]["sublayers"][0]) == {"layer", "resid_before", "attn_norm", "mlp_norm", "resid_after",
                                                  "after_attn", "after_mlp"}
    back = Run.from_record(path)
    assert list(back) == steps
    assert isinstance(back[0].attention[0], LayerAttention) and isinstance(back[0].sublayers[0], SublayerRow)
    # an older record (no such fields) still loads, its steps without them
    for line in step_lines:
        del line["attention"], line["sublayers"]
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    assert all(s.attention is None and s.sublayers is None for s in Run.from_record(old))


def test_headless_json_carries_attention_and_sublayers(embedded, isolated_dirs, tmp_path):
    result = tokentui("--headless", "--json", "--attention-heads", "--sublayers", "--temperature", "0",
                      "--max-new-tokens", "2", "--record-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    facts = next(e for e in events if e["event"] == "model")
    prompt = next(e for e in events if e["event"] == "prompt")
    steps = [e for e in events if e["event"] == "step"]
    assert len(steps) == 2 and not [e for e in events if e["event"] == "notice"]
    for n, step in enumerate(steps):
        assert [row["layer"] for row in step["attention"]] == list(range(1, facts["layers"] + 1))
        for row in step["attention"]:
            assert row["query"] == len(prompt["ids"]) + n - 1
            assert len(row["top"]) == 8 and len(row["heads"]) == facts["attention_heads"]
            assert all(len(h) == 8 for h in row["heads"])
        assert [row["layer"] for row in step["sublayers"]] == list(range(1, facts["layers"] + 1))
    (record,) = tmp_path.glob("*.jsonl")
    run = Run.from_record(record)
    assert [[(r.layer, [list(p) for p in r.top]) for r in s.attention] for s in run] == \
        [[(r["layer"], r["top"]) for r in s["attention"]] for s in steps]
