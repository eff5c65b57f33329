"""Issue 39, item 3: the small truths the seeds name, each against its oracle.

- The one-pass panel's embedding table (shape, format, bytes), RoPE base and scaling with the rotation angle of the
  position in view for the first pairs, and the norms' epsilon: read off the loaded model (core/model/observe/
  truths.py) and checked against the config, the tensors themselves and transformers' rotary embedding (its
  forward's cos / sin at that position, and for plain RoPE θ^(−2i/d) from the config); a learned-position model
  (GPT-2) has no RoPE and says so; the panel shows the facts' numbers at 80×24, 120×30 and 160×48, and "not
  known" for what facts do not give.
- The candidates' raw logits (Candidate.logit, filled by the engine): equal to an independent forward's logits
  for those ids; `L` shows them in the candidates' raw column in place of the raw probabilities.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from attention_fakes import AttentionEngine
from fakes import FACTS, make_loader, screen_text, wait_for
from snapshot_apps import SnapshotApp
from snapshot_apps_anatomy import TimedEngine
from tiny_models import tiny_gpt2, tiny_model
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.model.observe.truths import model_truths
from tokentui.core.runs.events import PromptEvent, StepEvent
from tokentui.core.runs.run import Run
from tokentui.core.runs.truths import ModelTruths, rope_angles
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.tui import DashboardConfig
from tokentui.tui.format import human_bytes, percent
from tokentui.tui.panels.candidate_rows import logit_text
from tokentui.tui.panels.candidates import CandidatesPanel

SIZES = [(80, 24), (120, 30), (160, 48)]
GREEDY = SamplerSettings(temperature=0.0)


def rotary_angles(model, position: int, pairs: int) -> list[float]:
    """The oracle: transformers' rotary embedding run at `position`; each pair's angle from its cos and sin."""
    rotary = model.model.rotary_emb
    x = torch.zeros(1, 1, 1, dtype=torch.float32)
    cos, sin = rotary(x, torch.tensor([[position]]))
    scale = float(getattr(rotary, "attention_scaling", 1.0) or 1.0)
    return [math.atan2(float(sin[0, 0, i]) / scale, float(cos[0, 0, i]) / scale) % (2 * math.pi)
            for i in range(pairs)]


def close_mod_2pi(a: float, b: float, tol: float) -> bool:
    d = abs(a - b) % (2 * math.pi)
    return min(d, 2 * math.pi - d) <= tol


# ---- the numbers, against the model --------------------------------------------------------------------------

def test_the_embedded_models_truths_are_its_config_and_tensors(embedded):
    model, config = embedded.model, embedded.model.config
    truths = embedded.facts.truths
    assert truths == model_truths(model, "RMSNorm")  # the facts carry what the model says
    table = model.get_input_embeddings().weight
    assert (truths.embed_rows, truths.embed_cols) == tuple(table.shape) == (config.vocab_size, config.hidden_size)
    assert truths.embed_bytes == table.numel() * table.element_size() and truths.embed_format == "float32"
    assert truths.rope_theta == config.rope_parameters["rope_theta"]
    assert truths.norm == "RMSNorm" and truths.norm_eps == config.rms_norm_eps
    head_dim = config.hidden_size // config.num_attention_heads
    assert truths.rope_dims == head_dim
    for position in (0, 1, 35, 117, 4000):
        ours = rope_angles(truths, position)
        assert len(ours) == 3
        formula = [position * truths.rope_theta ** (-2 * i / head_dim) for i in range(3)]  # plain RoPE's
        assert ours == pytest.approx(formula, rel=1e-6, abs=1e-9)
        oracle = rotary_angles(model, position, 3)
        assert all(close_mod_2pi(a % (2 * math.pi), b, 2e-3) for a, b in zip(ours, oracle)), (ours, oracle)


def test_scaled_rope_reads_the_models_own_frequencies(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer, rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                                 "rope_theta": 5000.0})
    truths = model_truths(model)
    assert truths.rope_type == "linear" and truths.rope_theta == 5000.0
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    plain = [5000.0 ** (-2 * i / head_dim) for i in range(3)]
    assert truths.rope_inv_freq == pytest.approx([f / 4.0 for f in plain], rel=1e-6)  # linear: every pair ÷ 4
    oracle = rotary_angles(model, 300, 3)
    assert all(close_mod_2pi(a, b, 1e-3) for a, b in zip(rope_angles(truths, 300), oracle))


def test_a_learned_position_model_has_no_rope_and_its_layernorm_epsilon(smol_tokenizer):
    model = tiny_gpt2(smol_tokenizer)
    truths = model_truths(model, "LayerNorm")
    assert truths.rope_theta is None and truths.rope_inv_freq == [] and rope_angles(truths, 9) == []
    assert truths.norm_eps == model.config.layer_norm_epsilon
    table = model.get_input_embeddings().weight
    assert (truths.embed_rows, truths.embed_cols, truths.embed_bytes) == (*table.shape, table.numel() * 4)
    facts = model_facts(model, smol_tokenizer, name="gpt2")
    from tokentui.tui.panels.truths_text import rope_clause

    assert rope_clause(facts.truths, facts, 9) == "positions: a learned table (no RoPE)"


def test_truths_survive_a_record_and_refuse_nonsense(tmp_path, smol_tokenizer):
    model = tiny_model("qwen3", smol_tokenizer)
    facts = model_facts(model, smol_tokenizer, name="tiny")
    engine = Engine(LoadedModel(model=model, tokenizer=smol_tokenizer, facts=facts), GREEDY,
                    RunOptions(max_new_tokens=1))
    run = Run(facts)
    for event in engine.run("Hi"):
        run.apply(event)
    back = Run.from_record(run.save(tmp_path / "run.jsonl"))
    assert back.facts.truths == facts.truths and facts.truths.rope_theta is not None
    with pytest.raises(ValueError):
        ModelTruths(embed_rows=0)
    with pytest.raises(ValueError):
        ModelTruths(norm_eps=-1.0)


# ---- the raw logits -------------------------------------------------------------------------------------------

def test_each_candidates_logit_is_the_models_logit_for_its_id(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer, initializer_range=0.2)
    loaded = LoadedModel(model=model, tokenizer=smol_tokenizer, facts=model_facts(model, smol_tokenizer, name="t"))
    engine = Engine(loaded, SamplerSettings(temperature=0.8, top_p=0.9, seed=3),
                    RunOptions(max_new_tokens=6, ignore_eos=True))
    events = list(engine.run("Is OpenAI open?"))
    prompt = next(e for e in events if isinstance(e, PromptEvent)).ids
    steps = [e for e in events if isinstance(e, StepEvent)]
    ids = prompt + [s.id for s in steps]
    with torch.no_grad():  # the oracle: one full forward, no cache
        logits = model(torch.tensor([ids])).logits[0].float()
    for k, step in enumerate(steps):
        row = logits[len(prompt) - 1 + k]
        wanted = [float(row[c.id]) for c in step.candidates]
        assert [c.logit for c in step.candidates] == pytest.approx(wanted, abs=1e-4)
        # and they are the raw probabilities' logits: softmax over the whole row
        assert [c.raw_prob for c in step.candidates] == pytest.approx(
            torch.softmax(row, -1)[[c.id for c in step.candidates]].tolist(), abs=1e-6)


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_L_shows_the_raw_column_as_logits_and_back(size):
    engine = AttentionEngine(sampler=GREEDY, options=RunOptions())
    app = SnapshotApp(DashboardConfig(load=make_loader(engine), sampler=GREEDY, options=engine.options,
                                      user_theme_dir=None, recorder=None))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run's end")
        panel = app.query_one(CandidatesPanel)
        step = app.state.view_step
        before = panel.last_text.plain
        assert " raw " in before.splitlines()[0]
        await pilot.press("L")
        await pilot.pause(0.05)
        text = panel.last_text.plain
        assert " logit " in text.splitlines()[0] and " raw " not in text.splitlines()[0]
        rows = [line for line in text.splitlines()[1:] if line[2:].strip() and str(step.candidates[0].id) in line]
        assert rows and logit_text(step.candidates[0].logit) in rows[0]
        assert step.candidates[0].logit is not None
        shown = 0
        for c in step.candidates:  # every row shown has its logit in the raw column (a cut piece's row included)
            lines = [line for line in text.splitlines() if f" {c.id} " in line]
            if lines:
                shown += 1
                assert f" {logit_text(c.logit)} " in lines[0], (c, lines[0])
        assert shown >= 3
        await pilot.press("L")
        await pilot.pause(0.05)
        back = panel.last_text.plain.splitlines()
        assert " raw " in back[0] and " logit " not in back[0]
        assert any(str(step.candidates[0].id) in line and percent(step.candidates[0].raw_prob) in line
                   for line in back)


# ---- the panel ---------------------------------------------------------------------------------------------------

TRUTHS = ModelTruths(embed_rows=151_936, embed_cols=1_024, embed_format="Q8_0", embed_bytes=165_306_368,
                     rope_theta=1_000_000.0, rope_type="default", rope_inv_freq=[1.0, 0.8058421877614819,
                                                                                   0.6493816315762113],
                     rope_dims=128, norm="RMSNorm", norm_eps=1e-6)


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_the_one_pass_panel_shows_the_facts_truths_at_every_size(size):
    engine = TimedEngine(sampler=GREEDY, facts=replace(FACTS, tied_lm_head=True, truths=TRUTHS))
    app = SnapshotApp(DashboardConfig(load=make_loader(engine), sampler=GREEDY, options=engine.options,
                                      user_theme_dir=None, recorder=None))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run's end")
        if app.anatomy_panel is None:
            await pilot.press("a")
        await pilot.press("left_square_bracket", "left_square_bracket")  # a past step: its own position
        await pilot.pause(0.1)
        app.redraw()
        await pilot.pause(0.05)
        step = app.state.view_step
        text = " ".join(app.anatomy_panel.last_text.plain.split())
        position = step.kv_tokens - 1
        angles = [a % (2 * math.pi) for a in rope_angles(TRUTHS, position)]
        assert "[151,936 × 1,024] Q8_0, " + human_bytes(TRUTHS.embed_bytes) in text, text
        assert "RoPE θ 1,000,000" in text and "RMSNorm ε 1e-06" in text
        assert f" {position}: " in text and ", ".join(f"{a:.2f}" for a in angles) + " rad" in text
        assert "…" not in screen_text(app)


async def test_what_facts_do_not_give_is_said_not_known():
    truths = ModelTruths(embed_rows=100, embed_cols=8)
    engine = TimedEngine(sampler=GREEDY, facts=replace(FACTS, tied_lm_head=True, truths=truths))
    app = SnapshotApp(DashboardConfig(load=make_loader(engine), sampler=GREEDY, options=engine.options,
                                      user_theme_dir=None, recorder=None))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.phase == "done", what="the run's end")
        await pilot.pause(0.1)
        text = " ".join(app.anatomy_panel.last_text.plain.split())
        assert "embedding table [100 × 8]" in text and "RoPE: not known" in text and "norm ε: not known" in text


def test_a_ggml_table_is_its_formats_blocks(smol_tokenizer):
    import gguf

    from tokentui.core.model.quant.ggml_linear import GGMLEmbedding, GGMLMatrix

    model = tiny_model("llama", smol_tokenizer)
    rows, cols = model.get_input_embeddings().weight.shape
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0]
    raw = torch.zeros(rows, cols // block * size, dtype=torch.uint8)  # a Q8_0 table's blocks, as a file holds them
    model.set_input_embeddings(GGMLEmbedding(GGMLMatrix(raw, "Q8_0", rows, cols)))
    truths = model_truths(model)
    assert (truths.embed_rows, truths.embed_cols, truths.embed_format) == (rows, cols, "Q8_0")
    assert truths.embed_bytes == raw.numel() == rows * cols // 32 * 34


def test_the_embedded_models_candidates_carry_its_logits(embedded, embedded_stock):
    engine = Engine(embedded, SamplerSettings(temperature=0.7, top_p=0.9, seed=1), RunOptions(max_new_tokens=4))
    events = list(engine.run("Is OpenAI open?"))
    prompt = next(e for e in events if isinstance(e, PromptEvent)).ids
    steps = [e for e in events if isinstance(e, StepEvent)]
    with torch.no_grad():  # the oracle: transformers' own load of the same file, one forward without a cache
        logits = embedded_stock.model(torch.tensor([prompt + [s.id for s in steps]])).logits[0].float()
    for k, step in enumerate(steps):
        row = logits[len(prompt) - 1 + k]
        assert [c.logit for c in step.candidates] == pytest.approx([float(row[c.id]) for c in step.candidates],
                                                                   abs=2e-3)
