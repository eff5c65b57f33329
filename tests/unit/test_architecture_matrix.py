"""Issue 24: every feature on every architecture. For each tiny random-weight model of tests/arch_matrix.py (38 decoder
families, built from configs at an init scale where their output depends on the context, the embedded model's
tokenizer), against oracles that do not use tokentui's readings (arch_matrix.py's docstring says which): greedy ids
equal `generate`'s, which vary (at least half distinct, or the oracle is vacuous); at every step the engine's raw
log-probabilities equal one full forward's without a cache (teacher-forced, FORCED_TOL); the KV figure per token is
the cache's real growth, also after a sliding window fills while decoding; the totals equal the cache tensors'
nbytes at every length; the layer kinds are the architecture's; the logit lens's rows equal the final norm, LM head
and logit post-processing applied by hand to hooked block outputs, and the last row is the model's own distribution;
every one-pass shape is the real tensor's; the blocks' order (parallel or not), positions, norm and experts are read
right; `--compile` compiles without recompiling and gives the same ids, or says before the run why it decodes
eagerly; and the table in docs/models.md is these observations. Then: prompts longer than a prefill chunk, bfloat16, records,
and a Mamba folder loaded and run the way a user's is."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch

from arch_matrix import (FORCED_TOL, NEW_TOKENS, SPECS, Observation, build, cache_kwargs, forced_gaps, observe,
                         tensor_bytes)
from tiny_models import REPO, assert_varies, generate_ids
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, load_model, model_facts
from tokentui.core.runs.architecture import kv_bytes_at
from tokentui.core.runs.events import DoneEvent, ErrorEvent, Notice, PromptEvent, StepEvent
from tokentui.core.runs.facts import ModelFacts
from tokentui.core.runs.record_reader import event_from_dict
from tokentui.core.settings import RunOptions, SamplerSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAMES = list(SPECS)
OBSERVED: dict[str, Observation] = {}


@pytest.fixture
def seen(request, smol_tokenizer) -> Observation:
    name = request.param
    if name not in OBSERVED:
        OBSERVED[name] = observe(name, smol_tokenizer)
    return OBSERVED[name]


def each(test):
    """One test per family; `pytest -m matrix` selects the matrix alone."""
    return pytest.mark.matrix(pytest.mark.parametrize("seen", NAMES, indirect=True, ids=NAMES)(test))


# ---------------------------------------------------------------------------------------------- the matrix
@each
def test_it_runs_without_a_traceback_and_greedy_equals_generate(seen):
    assert seen.errors == []
    assert_varies(seen.generated, f"generate's {NEW_TOKENS} greedy ids on tiny {seen.name}")
    assert len(seen.ids) == NEW_TOKENS and seen.ids == seen.generated
    assert not any("could not reproduce" in n or "KV cache holds" in n for n in seen.notices), seen.notices


@each
def test_teacher_forced_logits_are_one_full_forwards(seen):
    """What the cache holds, not only its size: every step's raw log-probabilities (its candidates') are one full
    forward's of the whole sequence at that position, within FORCED_TOL, and its first candidate is that argmax."""
    assert len(seen.forced) == NEW_TOKENS
    worst = max(gap for gap, _ in seen.forced)
    assert worst <= FORCED_TOL and all(top for _, top in seen.forced), seen.forced


@each
def test_the_kv_layer_kinds_are_the_architectures(seen):
    spec = SPECS[seen.name]
    assert {g.kind for g in seen.facts.kv_groups} == spec.kinds
    assert sorted(i for g in seen.facts.kv_groups for i in g.layers) == list(range(seen.facts.layers))


@each
def test_kv_per_token_is_the_caches_real_growth(seen):
    facts, oracle = seen.facts, seen.oracle_bytes
    caps = [g.cap for g in facts.kv_groups if g.cap is not None]
    first_cap = min(caps) if caps else None
    growth = {t + 1: oracle[t + 1] - oracle[t] for t in oracle if t + 1 in oracle}
    below = [g for t, g in growth.items() if first_cap is None or t <= first_cap]
    assert below and set(below) == {facts.kv_bytes_per_token}  # every position below the windows adds exactly that
    if first_cap is not None:  # the window is crossed while decoding; past it only the unwindowed layers grow
        assert seen.prompt_tokens < first_cap < seen.prompt_tokens + NEW_TOKENS
        uncapped = sum(len(g.layers) * g.per_position for g in facts.kv_groups if g.cap is None)
        assert {g for t, g in growth.items() if t > max(caps)} == {uncapped * facts.kv_bytes_per_value}


@each
def test_the_totals_are_the_cache_tensors_nbytes_at_every_length(seen):
    facts = seen.facts
    for tokens, nbytes in seen.oracle_bytes.items():
        assert kv_bytes_at(facts.kv_groups, tokens, facts.kv_bytes_per_value) == nbytes, tokens
    assert seen.step_kv and all(nbytes == seen.oracle_bytes[tokens] for tokens, nbytes in seen.step_kv)


@each
def test_lens_rows_are_the_hand_computation_and_the_last_is_the_models_own(seen):
    layers = seen.facts.layers
    assert len(seen.lens_rows) == len(seen.hand_rows) == NEW_TOKENS
    for ours, hand, own in zip(seen.lens_rows, seen.hand_rows, seen.model_top):
        assert len(ours) == len(hand) == layers
        for (i, p), (j, q) in zip(ours, hand):
            assert i == j and p == pytest.approx(q, rel=1e-4)
        assert hand[-1][0] == own[0] and hand[-1][1] == pytest.approx(own[1], rel=1e-4)
    if SPECS[seen.name].logits_op:  # the op matters here: leaving it out would not reproduce the model
        assert seen.lens_without_op_kl > 1e-3


@each
def test_one_pass_shapes_are_the_real_tensors(seen):
    spec, anatomy = SPECS[seen.name], seen.facts.anatomy
    names = [name for name, _, _ in seen.stage_shapes]
    bad = [(name, ours, real) for name, ours, real in seen.stage_shapes if ours != real]
    assert not bad
    for ids in ("50 ids", "1 ids"):
        assert f"embedding ({ids})" in names and f"LM head ({ids})" in names
        assert sum(ids in n and "block" in n for n in names) == len(anatomy.blocks)
        # every layer's cache tensors, once per tensor the stage names
        assert {int(re.search(r"layer (\d+)", n).group(1)) - 1 for n in names if ids in n and ", layer" in n} == \
            set(range(seen.facts.layers))
        assert any("router" in n for n in names if ids in n) is spec.moe
        assert any("positions" in n for n in names if ids in n) is (spec.positions == "learned")


@each
def test_blocks_are_read_right(seen):
    spec, anatomy = SPECS[seen.name], seen.facts.anatomy
    first = anatomy.blocks[0]
    assert first.order == spec.order
    if first.mlp != "none":  # zeroing the mixer's output moves the MLP's input unless both read the block's input
        assert seen.mlp_moves is (spec.order != "parallel")
    assert first.positions == spec.positions
    assert anatomy.final_norm == spec.norm_kind and anatomy.final_norm_module == spec.norm
    assert seen.norm_centres is (spec.norm_kind == "LayerNorm")
    assert any(b.mlp == "MoE" for b in anatomy.blocks) is spec.moe
    assert [op.split(" ")[0] for op in anatomy.logits_ops] == \
        ({"softcap": ["soft-cap"], "scale": ["×"], "divide": ["÷"]}[spec.logits_op[0]] if spec.logits_op else [])


@each
def test_compile_compiles_without_recompiling_or_says_why_not_before_the_run(seen):
    assert seen.compile_ids == seen.generated
    if SPECS[seen.name].compiles:
        assert seen.compile_notice.startswith("static KV cache")
        figure, real = seen.compile_allocated
        assert figure == real > 0  # the notice's allocation is the static cache's
    else:
        assert seen.compile_notice.startswith("--compile") and seen.compile_notice.endswith("decoding eagerly")
        assert "\n" not in seen.compile_notice


def test_the_models_page_table_is_the_matrix(smol_tokenizer):
    import transformers
    from arch_matrix import render, table_section

    # The table's figures are transformers' caches (Falcon's new decoder caches only its K/V heads since 5.25):
    # it is the pinned release's (scripts/setup.sh); on another, the per-family tests above are the check.
    pin = re.search(r"transformers==([0-9][0-9.]*)", (REPO / "scripts" / "setup.sh").read_text()).group(1)
    if transformers.__version__ != pin:
        pytest.skip(f"docs/models.md's table is measured on the pinned transformers {pin}; this is "
                    f"{transformers.__version__} (scripts/try_newest.py runs the matrix on it)")
    for name in NAMES:
        if name not in OBSERVED:
            OBSERVED[name] = observe(name, smol_tokenizer)
    table = render([OBSERVED[n] for n in NAMES])
    assert table_section((REPO / "docs" / "models.md").read_text(encoding="utf-8")) == table, \
        "docs/models.md's architecture table is not the matrix's: run `.venv/bin/python scripts/arch_table.py`"


# ---------------------------------------------------------------------------------------------- beyond the matrix
def _run(model, tokenizer, prompt: str, n: int, **options):
    loaded = LoadedModel(model, tokenizer, model_facts(model, tokenizer, name="tiny"))
    events = list(Engine(loaded, SamplerSettings(temperature=0),
                         RunOptions(max_new_tokens=n, ignore_eos=True, **options)).run(prompt))
    return loaded.facts, events


LONG = " ".join(f"word{i % 97} and" for i in range(160))  # ~670 tokens: two prefill chunks of 512


# Mamba and FalconMamba: transformers' Mamba-1 scan restarts from zeros on a multi-token forward, so their later
# chunks are fed one token at a time (core/steps/prefill.py); a defect this oracle found (issue 45) when they were not
@pytest.mark.matrix
@pytest.mark.parametrize("name", ["mistral", "gemma2", "qwen3_next", "lfm2", "mamba", "falcon_mamba"])
def test_a_prompt_longer_than_a_prefill_chunk(name, smol_tokenizer):
    """Chunked prefill across a sliding window and through recurrent layers: the same ids as generate's one
    pass (which vary), every step's log-probabilities one full forward's (so a chunk dropped or misplaced shows
    whatever the ids do), and the totals the formula gives."""
    model = build(name, smol_tokenizer)
    facts, events = _run(model, smol_tokenizer, LONG, 8)
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    assert len(prompt.ids) > 512 and not [e for e in events if isinstance(e, (ErrorEvent, Notice))]
    steps = [e for e in events if isinstance(e, StepEvent)]
    expected = generate_ids(model, prompt.ids, 8, stop_at_eos=False)
    assert_varies(expected, f"generate's 8 ids on tiny {name} after the long prompt")
    assert [s.id for s in steps] == expected
    forced = forced_gaps(model, prompt.ids, steps)
    assert max(gap for gap, _ in forced) <= FORCED_TOL and all(top for _, top in forced), forced
    assert all(s.kv_bytes == kv_bytes_at(facts.kv_groups, s.kv_tokens, 4) for s in steps)


@pytest.mark.parametrize("name", ["falcon_mqa", "deepseek_v3", "gemma2", "qwen3_next", "mamba"])
def test_bfloat16_figures_are_the_bfloat16_tensors(name, smol_tokenizer):
    model = build(name, smol_tokenizer).to(torch.bfloat16)
    facts, events = _run(model, smol_tokenizer, "Hi", 4)
    assert facts.kv_bytes_per_value == 2
    full = model_facts(build(name, smol_tokenizer), smol_tokenizer, name="fp32")
    assert facts.kv_bytes_per_token * 2 == full.kv_bytes_per_token
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert steps and all(s.kv_bytes == kv_bytes_at(facts.kv_groups, s.kv_tokens, 2) for s in steps)
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([list(range(100, 130))]), use_cache=True, **cache_kwargs(model, cache))
    assert tensor_bytes(cache) == kv_bytes_at(facts.kv_groups, 30, 2)


def test_the_new_model_facts_go_through_records_and_older_records_still_read(smol_tokenizer):
    for name in ("qwen3_next", "deepseek_v3", "mamba"):
        facts = model_facts(build(name, smol_tokenizer), smol_tokenizer, name=name)
        line = json.loads(json.dumps(facts.to_dict()))
        assert {"kv_groups", "anatomy"} <= line.keys()
        assert event_from_dict(line) == facts
    old = dict(line)
    del old["kv_groups"], old["anatomy"]
    back = event_from_dict(old)
    assert isinstance(back, ModelFacts) and back.kv_groups is None and back.anatomy is None
    server = replace(facts, kv_groups=None, anatomy=None).to_dict()
    assert "kv_groups" not in server and "anatomy" not in server  # written only where known


def test_a_mamba_folder_loads_and_runs_as_a_users_model_does(smol_tokenizer, tmp_path):
    """Issue 24's first defect: Mamba crashed at load (no num_attention_heads) and then in the engine."""
    model = build("mamba", smol_tokenizer)
    model.save_pretrained(tmp_path)
    smol_tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu", dtype="float32")
    facts = loaded.facts
    assert facts.architecture == "MambaForCausalLM" and facts.attention_heads is None and facts.kv_bytes_per_token == 0
    assert [g.kind for g in facts.kv_groups] == ["state"] and facts.kv_groups[0].state_names == ["conv", "SSM"]
    events = list(Engine(loaded, SamplerSettings(temperature=0),
                         RunOptions(max_new_tokens=6, ignore_eos=True, logit_lens=True)).run("Hi"))
    steps = [e for e in events if isinstance(e, StepEvent)]
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    assert [s.id for s in steps] == generate_ids(loaded.model, prompt.ids, 6, stop_at_eos=False)
    assert len({s.kv_bytes for s in steps}) == 1 and steps[0].kv_bytes > 0  # a fixed-size state: constant per step
    assert all(len(s.lens) == facts.layers for s in steps) and isinstance(events[-1], DoneEvent)


@pytest.mark.parametrize("name", ["mistral", "qwen3_next", "mamba"])
def test_a_branch_of_a_windowed_or_recurrent_model_prefills_afresh_and_says_why(name, smol_tokenizer):
    """Their caches cannot be cut back to a prefix (a window dropped positions, a state cannot be undone): the
    branch's prefix is prefilled afresh, the Notice says why, and the branch is the model's own continuation."""
    from tokentui.core.model.branch import BranchPoint

    model = build(name, smol_tokenizer)
    loaded = LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name=name))
    engine = Engine(loaded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=12, ignore_eos=True))
    events = list(engine.run("Hi"))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    steps = [e for e in events if isinstance(e, StepEvent)]
    token = steps[5].candidates[1].id
    point = BranchPoint(prompt_ids=tuple(prompt.ids), tokens=tuple(s.id for s in steps[:5]), at=5, token=token)
    branch = list(engine.branch(point))
    notices = [e.message for e in branch if isinstance(e, Notice) and "not reused" in e.message]
    assert len(notices) == 1 and "cannot be cut back" in notices[0] and "prefilling" in notices[0]
    ids = [e.id for e in branch if isinstance(e, StepEvent)]
    prefix = list(prompt.ids) + [s.id for s in steps[:5]] + [token]
    assert ids == [token] + generate_ids(model, prefix, 11, stop_at_eos=False)  # 12 steps of its own
    assert isinstance(branch[-1], DoneEvent)
