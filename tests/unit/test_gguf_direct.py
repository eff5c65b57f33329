"""A later start of a GGUF kept as stored without transformers' model (core/model/load/gguf_direct.py): the ggml step
made from the file's tensors by the first start's placement, transformers' model built only when a forward is asked
for. Oracles: the first start of the same file (transformers' model, its ggml step, its facts and ids), bit for bit;
transformers' forward for the model built on demand; and a fresh process's modules (no transformers' modeling)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from gguf_fixtures import gguf_tools, tiny_gguf  # noqa: F401  (gguf_tools: a fixture)
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.gguf_stored import cached_folder
from tokentui.core.model.load.loader import load_model
from tokentui.core.model.native.ggml_native import GGMLStep
from tokentui.core.model.quant import ggml_linear
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.runs.events import BranchEvent, PrefillEvent, PromptEvent, StepEvent
from tokentui.core.runs.explore_events import SampleEvent, ScoreEvent
from tokentui.core.runs.preview import PreviewRequest
from tokentui.core.runs.requests import FanoutRequest, ScoreRequest
from tokentui.core.runs.run import Run
from tokentui.core.runs.turns import TurnEvent, follow_up
from tokentui.core.settings import RunOptions, SamplerSettings

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("gguf_tools", "isolated_dirs", "one_torch_thread")]
PROMPT = "Is OpenAI open?"


@pytest.fixture(scope="module", autouse=True)
def bound():
    why = ggml_linear.load(lambda _: None)
    if why is not None:
        pytest.skip(why)


def own_copy(tmp_path, family="qwen3", fmt="Q8_0", tied=True):
    """The fixture file under a new path: a cache key of its own, so its first load here is a first start."""
    path = tmp_path / f"{family}-{fmt}-{'tied' if tied else 'untied'}.gguf"
    shutil.copyfile(tiny_gguf(family, fmt, tied=tied), path)
    return path


def greedy(loaded, n=12, **options) -> Engine:
    return Engine(loaded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=n, ignore_eos=True, **options))


def steps_of(events) -> list[StepEvent]:
    return [e for e in events if isinstance(e, StepEvent)]


def figures(step: StepEvent) -> list:
    return [step.id, step.chosen_raw_prob, [(c.id, c.raw_prob) for c in step.candidates]]


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q4_K_M"])
@pytest.mark.parametrize("family, tied", [("llama", False), ("qwen2", True), ("qwen3", True), ("mistral", False)])
def test_a_later_start_runs_the_first_starts_step_without_transformers_model(tmp_path, family, tied, fmt):
    """The first start builds transformers' model and compares the ggml step with its forward; the later start
    builds no model, and its run has the first start's ids, probabilities and candidates bit for bit (the same
    matrices, row orders, norms, biases, rotation and scalars), its facts but the load time, and its end ids.
    llama's and mistral's q / k rows are permuted in the file: a later start that missed the permutation would
    differ from the first token on."""
    path = own_copy(tmp_path, family, fmt, tied)
    first = load_model(str(path), device="cpu")
    assert first.direct is None
    engine = greedy(first, top_candidates=5)
    expected = steps_of(engine.run(PROMPT))
    later = load_model(str(path), device="cpu")
    assert later.direct is not None and not later.direct.built
    again = greedy(later, top_candidates=5)
    got = steps_of(again.run(PROMPT))
    assert [figures(s) for s in got] == [figures(s) for s in expected]
    assert len({s.id for s in got}) > 1  # not one repeated id: the cache is read
    assert replace(again.facts, load_seconds=0.0) == replace(engine.facts, load_seconds=0.0)
    assert again.facts.decode_plan.startswith("native ggml step: ")
    assert again.end_ids == engine.end_ids
    assert not later.direct.built  # a plain run never asked for it


def test_the_model_built_on_demand_is_the_first_starts_and_shares_the_steps_modules(tmp_path):
    """Reading `model` builds transformers' model once, over the step's own modules (nothing copied): its forward
    gives the first start's scores exactly, and a ggml step made from it computes the direct step's bits."""
    path = own_copy(tmp_path)
    first = load_model(str(path), device="cpu")
    greedy(first)  # its plan asks for the ggml step: compared with the forward, the verdict kept
    later = load_model(str(path), device="cpu")
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    model = later.model
    assert later.direct.built and later.model is model
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids, use_cache=False).logits,
                           first.model(input_ids=ids, use_cache=False).logits)
    step = later.direct.step
    assert model.model.layers[0].self_attn.q_proj is step.layers[0].q
    assert model.model.embed_tokens is step.embed and model.lm_head is step.head
    from tokentui.core.model.decode.adapter import new_cache

    built = GGMLStep(model)
    ours, theirs = new_cache(model, 16), new_cache(model, 16)
    from tokentui.core.model.native.ggml_prefill import prefill_hidden

    prefill_hidden(step, ids, ours)
    prefill_hidden(built, ids, theirs)
    for token in (7, 8, 9):
        assert torch.equal(step.hidden(token, ours), built.hidden(token, theirs))


def test_the_lens_turned_on_mid_run_on_a_later_start_takes_the_runs_cache_over(tmp_path):
    """The dashboard's lens key pressed after the third step: the run's own cache (tokentui's, core/model/decode/
    buffers.py) is taken over by transformers' for the forward, and the run goes on from the positions it holds:
    the steps before have the run without the lens's figures, those after have lens rows, and the whole run is the
    first start's with the same key press, bit for bit. A cache lost on the way would score the token alone."""
    path = own_copy(tmp_path, "qwen2", "Q8_0", True)
    seen = {}
    for name in ("first", "later", "plain"):
        loaded = load_model(str(path), device="cpu")
        engine = greedy(loaded, n=6)
        steps = []
        for event in engine.run(PROMPT):
            if isinstance(event, StepEvent):
                steps.append(event)
                if len(steps) == 3 and name != "plain":
                    engine.set_options(replace(engine.options, logit_lens=True))
        seen[name] = steps
        if name == "later":
            assert loaded.direct is not None and loaded.direct.built  # the lens asked for the forward
    first, later, plain = seen["first"], seen["later"], seen["plain"]
    assert [figures(s) for s in later] == [figures(s) for s in first]
    lens = [[(r.id, r.prob) for r in s.lens or ()] for s in later]
    assert lens == [[(r.id, r.prob) for r in s.lens or ()] for s in first]
    on = next(i for i, rows in enumerate(lens) if rows)  # the first step the toggle reached
    assert 3 <= on <= 4 and all(lens[on:])
    assert [figures(s) for s in later[:on]] == [figures(s) for s in plain[:on]]
    assert [s.kv_tokens for s in later] == [s.kv_tokens for s in plain]
    # the forward's step reads the cached positions: its scores are the ggml step's within its tolerance, where the
    # token alone would score far from them
    ours, theirs = ({c.id: c.logit for c in s.candidates} for s in (later[on], plain[on]))
    assert later[on].id == plain[on].id and max(abs(ours[i] - theirs[i]) for i in ours.keys() & theirs.keys()) < 0.05


def test_a_branch_and_a_preview_on_a_later_start_reuse_the_cache_without_building_the_model(tmp_path):
    """A branch with KV reuse, and a step previewed under other settings on the run's held cache (the dashboard's
    time travel), give the first start's figures and build no model."""
    path = own_copy(tmp_path, "qwen2", "Q4_K_M", True)
    first_engine = greedy(load_model(str(path), device="cpu"), n=8)
    later = load_model(str(path), device="cpu")
    engines = {"first": first_engine, "later": greedy(later, n=8)}
    results = {}
    for name, engine in engines.items():
        events = list(engine.run(PROMPT))
        prompt_ids = next(e for e in events if isinstance(e, PromptEvent)).ids
        steps = steps_of(events)
        request = PreviewRequest(tuple(prompt_ids), tuple(s.id for s in steps[:4]), SamplerSettings(temperature=0.5))
        preview = engine.preview_step(request)[0]
        assert preview.source == "kv"
        point = BranchPoint(tuple(prompt_ids), tuple(s.id for s in steps[:3]), 3, steps[3].candidates[1].id)
        branch = list(engine.branch(point))
        reused = next(e for e in branch if isinstance(e, BranchEvent)).kv_reused_tokens
        assert reused == len(prompt_ids) + 2 == next(e for e in branch if isinstance(e, PrefillEvent)).reused_tokens
        results[name] = ([figures(s) for s in steps_of(branch)], preview.pick,
                         [(c.id, c.prob, c.raw_prob) for c in preview.candidates])
    assert results["later"] == results["first"]
    assert not later.direct.built


def test_a_follow_up_turn_on_a_later_start_reuses_the_cache_without_building_the_model(tmp_path):
    """A follow-up turn (core/model/turn.py) goes on from the positions the first turn cached, as on the first start,
    with the same ids and probabilities, and builds no model."""
    path = own_copy(tmp_path, "llama", "Q8_0", False)
    seen = {}
    for name in ("first", "later"):
        loaded = load_model(str(path), device="cpu")
        engine = greedy(loaded, n=6)
        run = Run()
        for event in engine.run(PROMPT):
            run.apply(event)
        second = list(engine.turn(follow_up(run, "And is Anthropic?", parent="first.jsonl")))
        turn = next(e for e in second if isinstance(e, TurnEvent))
        assert turn.reused_tokens > 0
        seen[name] = (turn.reused_tokens, [figures(s) for s in steps_of(second)])
        if name == "later":
            assert loaded.direct is not None and not loaded.direct.built
    assert seen["later"] == seen["first"]


def test_the_lens_views_fan_out_and_score_on_a_later_start_build_the_model_and_match_the_first(tmp_path):
    """What needs transformers' forward builds the model when first asked for, and gives the first start's
    figures: the lens rows, the attention and sublayer views, a seeded fan-out's samples, a score's probabilities."""
    path = own_copy(tmp_path, "qwen3", "Q4_0", True)
    seen = {}
    for name in ("first", "later"):
        loaded = load_model(str(path), device="cpu")
        assert (loaded.direct is None) == (name == "first")
        engine = greedy(loaded, n=5, logit_lens=True, attention=True, sublayers=True)
        events = list(engine.run(PROMPT))
        prompt_ids, lensed = next(e for e in events if isinstance(e, PromptEvent)).ids, steps_of(events)
        if name == "later":
            assert loaded.direct.built  # the lens asked for the forward
        request = FanoutRequest(tuple(prompt_ids), tuple(s.id for s in lensed[:2]), 2, n=3, m=3, seed=5)
        samples = [e.ids for e in engine.fanout(request) if isinstance(e, SampleEvent)]
        scored = list(engine.score(ScoreRequest(PROMPT, " Yes it is.")))
        score = next(e for e in scored if isinstance(e, ScoreEvent))
        seen[name] = ([figures(s) for s in lensed], [[(r.id, r.prob) for r in s.lens] for s in lensed],
                      [len(s.attention) for s in lensed], [len(s.sublayers) for s in lensed], samples,
                      score.ids, [figures(s) for s in steps_of(scored)])
    assert seen["later"] == seen["first"]
    assert all(rows for rows in seen["later"][1])


def test_a_fan_out_from_a_plain_run_on_a_later_start_builds_the_model_and_matches_the_first(tmp_path):
    """A fan-out after a run without the lens: the run's held cache is tokentui's own (core/model/decode/buffers.py),
    copied per sample as one and handed to transformers' batch forward. Greedy, every sample goes on as the run
    itself did (its steps after the fan-out's), and the samples are the first start's."""
    path = own_copy(tmp_path, "llama", "Q8_0", False)
    seen = {}
    for name in ("first", "later"):
        loaded = load_model(str(path), device="cpu")
        engine = greedy(loaded, n=5)
        events = list(engine.run(PROMPT))
        prompt_ids, steps = next(e for e in events if isinstance(e, PromptEvent)).ids, steps_of(events)
        request = FanoutRequest(tuple(prompt_ids), tuple(s.id for s in steps[:2]), 2, n=3, m=4, seed=11)
        samples = [e.ids for e in engine.fanout(request) if isinstance(e, SampleEvent)]
        if name == "later":
            assert loaded.direct.built  # the batch forward asked for the model
        assert len(samples) == 3 and all(len(ids) == 4 for ids in samples)
        # greedy: every sample is the run's own continuation, which the batch forward reads from the copied positions
        assert all(ids[:3] == [s.id for s in steps[2:5]] for ids in samples)
        seen[name] = samples
    assert seen["later"] == seen["first"]


@pytest.mark.parametrize("damage", ["no facts", "placement unreadable", "verdict for other libraries",
                                    "verdict refused", "no shape in the verdict"])
def test_a_cache_without_what_a_later_start_needs_loads_as_the_first_start(tmp_path, damage):
    """Anything missing or not as written sends the later start the first start's way (transformers' model, the
    step made from it), with the same ids; where the step is compared again its verdict is kept, and the start after
    goes without the model."""
    path = own_copy(tmp_path)
    first = greedy(load_model(str(path), device="cpu"))
    expected = [s.id for s in steps_of(first.run(PROMPT))]
    folder = cached_folder(path)
    verdict = folder / "ggml_step.json"
    kept = json.loads(verdict.read_text())
    if damage == "no facts":
        (folder / "facts.json").unlink()
    elif damage == "placement unreadable":
        (folder / "placement.json").write_text("{not json")
    elif damage == "verdict for other libraries":
        verdict.write_text(json.dumps({**kept, "libraries": "another build"}))
    elif damage == "verdict refused":
        verdict.write_text(json.dumps({**kept, "accepted": False}))
    else:
        verdict.write_text(json.dumps({k: v for k, v in kept.items() if k != "shape"}))
    later = load_model(str(path), device="cpu")
    assert later.direct is None
    assert [s.id for s in steps_of(greedy(later).run(PROMPT))] == expected
    if damage in ("no facts", "verdict for other libraries"):  # kept again by that start: the next goes direct
        assert load_model(str(path), device="cpu").direct is not None


def test_a_later_start_in_a_fresh_process_imports_no_transformers(tmp_path):
    """The command a user runs: the second start of a file imports no transformers at all (its modeling, its cache
    classes, its package's scan of every model's files: over a second of a start's imports) and prints the first
    start's run."""
    path = own_copy(tmp_path, "qwen3", "Q4_K_M", True)
    code = ("import json, sys\nfrom tokentui.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'transformers')\n"
            "print(json.dumps(heavy), file=sys.stderr)\n")
    argv = ["--model", str(path), "--headless", "--json", "--greedy", "--max-new-tokens", "6", "--no-record"]
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "TOKENTUI_CACHE_DIR": str(tmp_path / "cache")})
        assert done.returncode == 0, done.stderr[-2000:]
        events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        runs.append(([e["id"] for e in events if e["event"] == "step"], json.loads(done.stderr.splitlines()[-1])))
    (first_ids, first_heavy), (later_ids, later_heavy) = runs
    assert "transformers.modeling_utils" in first_heavy  # the first start builds the model
    assert later_heavy == [] and later_ids == first_ids and len(first_ids) == 6


def test_a_placement_that_does_not_fit_the_cached_config_is_one_line_when_the_model_is_built(tmp_path):
    """A cache folder edited by hand (its placement names another family than its config builds): the step still
    runs the file, and building transformers' model refuses in one line naming the folder to delete."""
    from tokentui.core.errors import ModelLoadError

    path = own_copy(tmp_path)
    greedy(load_model(str(path), device="cpu"))
    placement = cached_folder(path) / "placement.json"
    data = json.loads(placement.read_text())
    placement.write_text(json.dumps({**data, "family": "LlamaForCausalLM"}))
    later = load_model(str(path), device="cpu")
    assert later.direct is not None
    with pytest.raises(ModelLoadError, match="delete that folder and start again") as err:
        later.model
    assert "\n" not in str(err.value) and str(cached_folder(path)) in str(err.value)
