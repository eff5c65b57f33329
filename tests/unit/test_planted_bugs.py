"""Issue 45: the oracles must be able to fail. Each bug of tests/planted_bugs.py is planted in the engine's calls on
every family of the architecture matrix (tests/arch_matrix.py, the same tiny models), and each test passes only when
the oracle that guards against it fails: the teacher-forced logits (every step's raw log-probabilities against one
full forward without a cache, arch_matrix.forced_gaps) for a cache that is not read, a dropped prefill chunk and
positions off by one; the sampler's (every step's post-sampler probabilities against transformers' warpers on that
full forward, arch_matrix.sampler_gaps) for a skipped temperature and a top-p that keeps one token too few. Without
the bug the same run passes the oracle (the control), so a failure is the bug's."""

from __future__ import annotations

import contextlib

import pytest

from arch_matrix import SPECS, build, forced_gaps, forced_ok, sampler_gaps
from planted_bugs import planted
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.runs.events import PromptEvent, StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAMES = list(SPECS)
# positions off by one: the families whose attention reads position ids (ALiBi's and the state-space models' do not)
POSITIONED = [n for n in NAMES if SPECS[n].positions in ("rotary", "learned") or n in ("qwen3_next", "lfm2")]
STEPS = 8
SAMPLED = SamplerSettings(temperature=0.6, top_k=8, top_p=0.6, seed=3)  # top-p cuts inside the 10 reported
SAMPLER_TOL = 1e-4  # |p|: float32 warpers on a cached vs an uncached forward (measured ≤ 1e-6)
CHUNK = 16  # chunk_dropped's runs: the "Hi" prompt (31 tokens in the chat template) is two prefill chunks
MODELS: dict = {}


def _loaded(name, tokenizer) -> LoadedModel:
    if name not in MODELS:
        model = build(name, tokenizer)
        MODELS[name] = LoadedModel(model, tokenizer, model_facts(model, tokenizer, name=f"tiny-{name}"))
    return MODELS[name]


def _gaps(loaded: LoadedModel, bug: str | None, chunked: bool = False):
    """The engine's run (the bug planted in it, or none), then the teacher-forced oracle outside the bug."""
    chunk = dict(prefill_chunk=CHUNK) if chunked else {}
    engine = Engine(loaded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=STEPS, ignore_eos=True, **chunk))
    with planted(bug, loaded.model) if bug else contextlib.nullcontext():
        events = list(engine.run("Hi"))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert len(prompt.ids) > CHUNK and len(steps) == STEPS
    return forced_gaps(loaded.model, prompt.ids, steps)


def _sampled(loaded: LoadedModel, bug: str | None) -> list[float]:
    engine = Engine(loaded, SAMPLED, RunOptions(max_new_tokens=STEPS, ignore_eos=True))
    with planted(bug, loaded.model) if bug else contextlib.nullcontext():
        events = list(engine.run("Hi"))
    prompt = next(e for e in events if isinstance(e, PromptEvent))
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert len(steps) == STEPS
    return sampler_gaps(loaded.model, prompt.ids, steps, SAMPLED)


@pytest.mark.parametrize("name", NAMES)
def test_the_oracle_holds_without_a_bug(name, smol_tokenizer):
    """The control: the same runs, nothing planted, pass, chunked too."""
    loaded = _loaded(name, smol_tokenizer)
    assert forced_ok(_gaps(loaded, None))
    assert forced_ok(_gaps(loaded, None, chunked=True))
    assert max(_sampled(loaded, None)) <= SAMPLER_TOL


@pytest.mark.parametrize("name", NAMES)
def test_a_cache_written_but_never_read_fails_the_teacher_forced_oracle(name, smol_tokenizer):
    assert not forced_ok(_gaps(_loaded(name, smol_tokenizer), "cache_unread"))


@pytest.mark.parametrize("name", NAMES)
def test_a_dropped_prefill_chunk_fails_the_teacher_forced_oracle(name, smol_tokenizer):
    assert not forced_ok(_gaps(_loaded(name, smol_tokenizer), "chunk_dropped", chunked=True))


@pytest.mark.parametrize("name", POSITIONED)
def test_positions_off_by_one_fail_the_teacher_forced_oracle(name, smol_tokenizer):
    assert not forced_ok(_gaps(_loaded(name, smol_tokenizer), "positions_off"))


@pytest.mark.parametrize("name", NAMES)
def test_a_skipped_temperature_fails_the_sampler_oracle(name, smol_tokenizer):
    assert max(_sampled(_loaded(name, smol_tokenizer), "temperature_skipped")) > SAMPLER_TOL


@pytest.mark.parametrize("name", NAMES)
def test_top_p_keeping_one_too_few_fails_the_sampler_oracle(name, smol_tokenizer):
    assert max(_sampled(_loaded(name, smol_tokenizer), "top_p_one_short")) > SAMPLER_TOL
