"""Every engine feature on a GGUF run as stored (issue 37, Build 5), through the public engine API, on tiny files of
tests/gguf_fixtures.py loaded with the default flags (core/model/load/gguf_stored.py; the native ggml step decodes):
the plan, greedy ids on every format, candidates, the logit lens, one-pass timings, branching with KV reuse, fan-out
and score. Time travel is the dashboard's reading of these runs' step events (tui/state_readings.py): nothing in it
depends on how the weights are stored, and branching from an earlier step (its engine half) is checked here.

Oracles: the same model's own forward through the same ggml modules (transformers' `generate`, a cache fed one token
at a time: the products ggml computes for one row, as the native step's), and for the 32- and 16-bit files and Q8_0
the float32 Hugging Face folder the file was made from.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from gguf_fixtures import FORMATS, gguf_tools, hf_folder, tiny_gguf  # noqa: F401  (gguf_tools: a fixture)
from test_one_pass_anatomy import check_split
from tiny_models import generate_ids
from tokentui.core.model.decode.adapter import cache_keyword
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import load_model
from tokentui.core.model.quant import ggml_linear
from tokentui.core.runs.branch_point import BranchPoint
from tokentui.core.runs.events import BranchEvent, PrefillEvent, PromptEvent, StepEvent
from tokentui.core.runs.explore_events import FanoutEvent, SampleEvent, ScoreEvent
from tokentui.core.runs.requests import FanoutRequest, ScoreRequest
from tokentui.core.settings import RunOptions, SamplerSettings

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("gguf_tools", "isolated_dirs", "one_torch_thread")]
PROMPT = "Is OpenAI open?"
STEPS = 16
# the files whose greedy ids are the float32 HF folder's on these tiny models (checked for each family below); the
# 4- to 6-bit files move these random models' logits by as much as the logits (tests/unit/test_gguf_stored.py)
KEEPS_THE_FOLDERS_IDS = ("F32",)
NEAR_TIE = 0.1  # raw probability between the forward's two best tokens where the native step may pick the other


@pytest.fixture(scope="module", autouse=True)
def bound():
    why = ggml_linear.load(lambda _: None)
    if why is not None:
        pytest.skip(why)


_LOADED: dict = {}


def loaded(family: str, fmt: str, tied: bool):
    if (family, fmt, tied) not in _LOADED:
        _LOADED[family, fmt, tied] = load_model(str(tiny_gguf(family, fmt, tied=tied)), device="cpu")
    return _LOADED[family, fmt, tied]


def greedy(model_loaded, n=STEPS, **options) -> Engine:
    return Engine(model_loaded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=n, ignore_eos=True,
                                                                             **options))


def run(engine, prompt=PROMPT):
    events = list(engine.run(prompt))
    prompt_event = next(e for e in events if isinstance(e, PromptEvent))
    return prompt_event.ids, [e for e in events if isinstance(e, StepEvent)]


# ---------------------------------------------------------------------------------------------- the plan, greedy
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family, tied", [("llama", False), ("qwen2", True), ("qwen3", True), ("mistral", False)])
def test_the_native_ggml_step_decodes_as_the_models_forward(family, tied, fmt):
    """Every family the ggml step serves runs it, and says so (these Q4_0 / Q4_1 files too: their head is Q6_K, which
    keeps them off the packed path, core/model/load/gguf_stored.py's packed_serves). A run through the forward (the lens asks for
    it) gives `generate`'s greedy ids through the same modules exactly; the native step's ids are those until the
    first step where the forward's two best tokens are within NEAR_TIE (the step sums norms and attention in another
    order, which moves an activation across an 8-bit rounding step now and then: ggml_native's TOLERANCE). F32 files
    also keep the float32 folder's ids (the other formats' products round the activations to 8 or 16 bits, the
    prompt's as llama.cpp's prefill does as well as each step's, and do not on every one of these random models)."""
    model_loaded = loaded(family, fmt, tied)
    engine = greedy(model_loaded)
    assert engine.facts.decode_plan.startswith("native ggml step: "), engine.facts.decode_plan
    prompt_ids, steps = run(engine)
    _, forward = run(greedy(model_loaded, logit_lens=True))
    reference = [s.id for s in forward]
    assert reference == generate_ids(model_loaded.model, prompt_ids, STEPS, stop_at_eos=False)
    ids = [s.id for s in steps]
    at = next((i for i, (a, b) in enumerate(zip(ids, reference)) if a != b), None)
    if at is not None:
        top = forward[at].candidates
        assert top[0].raw_prob - top[1].raw_prob < NEAR_TIE, (at, top[:2])
    if fmt in KEEPS_THE_FOLDERS_IDS:
        folder = AutoModelForCausalLM.from_pretrained(hf_folder(family, tied), dtype=torch.float32).eval()
        assert ids == generate_ids(folder, prompt_ids, STEPS, stop_at_eos=False, vary=True)


# ---------------------------------------------------------------------------------------------- the features
FILE = ("qwen3", "Q4_K_M", True)  # mixed formats (Q4_K, Q6_K), q/k norms, a tied Q6_K head


def test_candidates_and_the_lens_are_the_forwards():
    """A run with the lens goes through the model's forward; without it, through the native step: the same ids and
    candidates (within the step's rounding) up to the first step where the forward's two best are within NEAR_TIE
    (the test above says why), and each lens row set's last layer is the step's own top token."""
    model_loaded = loaded(*FILE)
    layers = model_loaded.facts.layers
    _, native = run(greedy(model_loaded, top_candidates=5))
    _, lensed = run(greedy(model_loaded, top_candidates=5, logit_lens=True))
    at = next((i for i, (a, b) in enumerate(zip(native, lensed)) if a.id != b.id), len(native))
    if at < len(native):
        top = lensed[at].candidates
        assert top[0].raw_prob - top[1].raw_prob < NEAR_TIE, (at, top[:2])
    assert at >= 4, at  # the prompt's own step and a few after it agree whatever the ties later
    for a, b in zip(native[:at], lensed[:at]):
        assert [c.id for c in a.candidates][:3] == [c.id for c in b.candidates][:3]
        assert max(abs(x.raw_prob - y.raw_prob) for x, y in zip(a.candidates, b.candidates)) < 2e-2
    for a, b in zip(native, lensed):
        assert a.lens is None and b.lens is not None and len(b.lens) == layers
        assert b.lens[-1].id == b.id and b.lens[-1].prob == pytest.approx(b.chosen_raw_prob, abs=1e-4)


def test_the_attention_and_sublayer_views_from_the_first_step():
    """The native ggml step prefills without transformers' forward (core/model/native/ggml_prefill.py), and a
    capture watches the forward's modules: with the views on, the prompt goes through the forward, so the first
    step (the prompt's last position) has its rows as every later one does, and the ids are the plain run's."""
    model_loaded = loaded(*FILE)
    layers = model_loaded.facts.layers
    prompt_ids, plain = run(greedy(model_loaded, n=4))
    _, viewed = run(greedy(model_loaded, n=4, attention=True, sublayers=True))
    assert [s.id for s in viewed] == [s.id for s in plain]
    for index, step in enumerate(viewed):
        assert step.attention is not None and len(step.attention) == layers
        assert {row.query for row in step.attention} == {len(prompt_ids) - 1 + index}
        assert step.sublayers is not None and len(step.sublayers) == layers
        assert plain[index].attention is None and plain[index].sublayers is None


def test_one_pass_timings_tile_each_step():
    _, steps = run(greedy(loaded(*FILE), n=8, time_stages=True))
    check_split(steps)


@pytest.mark.parametrize("fmt, same", [("F32", None), ("Q4_K_M", 3)])
def test_a_branch_reuses_the_parents_cache_and_continues_as_the_forward(fmt, same):
    """The branch reuses the parent's cached positions and goes on as `generate` from the prefix and the forced
    token. F32: every id (its products are float32's). Q4_K_M: its first `same` ids; after that, the parent's cached
    rows (the native step's) and `generate`'s (one forward over the prefix) differ by where a float32 rounding moves
    an activation across one of its 8-bit steps, and this random model carries that into other ids."""
    model_loaded = loaded(FILE[0], fmt, FILE[2])
    engine = greedy(model_loaded, n=10)
    prompt_ids, steps = run(engine)
    at = 4
    forced = steps[at].candidates[1].id
    events = list(engine.branch(BranchPoint(tuple(prompt_ids), tuple(s.id for s in steps[:at]), at, forced)))
    branch = next(e for e in events if isinstance(e, BranchEvent))
    prefill = next(e for e in events if isinstance(e, PrefillEvent))
    ids = [e.id for e in events if isinstance(e, StepEvent)]
    assert branch.kv_reused_tokens == len(prompt_ids) + at - 1 == prefill.reused_tokens
    assert ids[0] == forced
    prefix = list(prompt_ids) + [s.id for s in steps[:at]] + [forced]
    assert ids[1:][:same] == generate_ids(model_loaded.model, prefix, len(ids) - 1, stop_at_eos=False)[:same]


def test_a_fan_out_draws_its_samples_from_the_steps_distribution():
    model_loaded = loaded(*FILE)
    engine = greedy(model_loaded, n=6)
    prompt_ids, steps = run(engine)
    request = FanoutRequest(tuple(prompt_ids), tuple(s.id for s in steps[:2]), 2, n=3, m=4, seed=5)
    first, again = (list(engine.fanout(request)) for _ in range(2))
    fan = next(e for e in first if isinstance(e, FanoutEvent))
    samples = [e for e in first if isinstance(e, SampleEvent)]
    assert len(samples) == 3 and all(len(s.ids) == 4 for s in samples)
    assert {s.ids[0] for s in samples} <= {c.id for c in fan.candidates}
    assert [s.ids for s in samples] == [s.ids for s in again if isinstance(s, SampleEvent)]  # seeded


def test_a_scored_answer_has_the_forwards_probabilities():
    model_loaded = loaded(*FILE)
    model, engine = model_loaded.model, greedy(model_loaded)
    events = list(engine.score(ScoreRequest(PROMPT, " Yes, it is open.")))
    prompt_ids = next(e for e in events if isinstance(e, PromptEvent)).ids
    score = next(e for e in events if isinstance(e, ScoreEvent))
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert [s.id for s in steps] == score.ids
    with torch.inference_mode():  # the oracle: the prompt, then the answer, through the model's forward
        cache = DynamicCache(config=model.config)
        keyword = {cache_keyword(model): cache}
        first = model(torch.tensor([prompt_ids]), **keyword).logits[0, -1:]
        rest = model(torch.tensor([score.ids[:-1]]), **keyword).logits[0]
        probs = torch.softmax(torch.cat([first, rest]).double(), dim=-1)
    for i, step in enumerate(steps):
        assert step.chosen_raw_prob == pytest.approx(float(probs[i, step.id]), abs=1e-4), i


def test_a_model_the_ggml_step_does_not_serve_runs_the_forward_and_says_why(tmp_path):
    """A family the native ggml step does not run (here a Qwen3 file whose MLP is made GELU after loading: the
    converter's other families need a sentencepiece tokenizer) decodes with transformers' forward on the same ggml
    modules, and the plan's description says why. (The file under a path of its own: its first start, whose plan is
    chosen from transformers' model; a later start's is the file's, core/model/load/gguf_direct.py.)"""
    path = tmp_path / "gelu.gguf"
    shutil.copyfile(tiny_gguf("qwen3", "Q8_0", tied=True), path)
    model_loaded = load_model(str(path), device="cpu")  # its own copy: changed
    for layer in model_loaded.model.model.layers:
        layer.mlp.act_fn = torch.nn.GELU()
    engine = greedy(model_loaded, n=6)
    plan = engine.facts.decode_plan
    assert plan.startswith("transformers' forward: Q8_0 weights as stored; "), plan
    assert "no native ggml step (an MLP activation other than SiLU)" in plan
    prompt_ids, steps = run(engine)
    assert [s.id for s in steps] == generate_ids(model_loaded.model, prompt_ids, 6, stop_at_eos=False)
