"""Issue 38's stages everywhere a run goes: flags validated where the settings are built (one line, exit 2), the
order as llama.cpp spells it, records that carry every setting (and old ones that read as off), served requests
under each server's own names with one line for what a server ignores, the backends routed where one lacks a
stage, and local runs that read their own history (penalties over the prompt and the tokens so far, Mirostat's
state restored by a branch) and replay from a seed with every stage on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from cli_run import one_line_error, tokentui
from fake_openai_server import FakeServer
from fakes import ScriptedEngine
from tiny_models import tiny_model
from tokentui.commands.common import add_sampler_flags, settings_from_args
from tokentui.core.errors import SettingsError
from tokentui.core.model.branch import BranchPoint
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.model.sampler_input import RunHistory
from tokentui.core.runs.events import Notice, PromptEvent, StepEvent
from tokentui.core.runs.record_reader import read_lines
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.recording import RecordedRun
from tokentui.core.samplers import (DEFAULT_ORDER, PARAMS, STAGES, ChainInput, backend_gaps, chain_order, ignored_by,
                                    mirostat_mu, parse_order, served_sampler)
from tokentui.core.server.engine import ServerEngine, ServerOptions
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.core.steps.select import native_op, reference_probs, select
from tokentui.core.steps.token_bytes import token_bytes

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # a descheduled 2nd thread stalls O(V) ops

EVERY = SamplerSettings(temperature=0.9, top_k=60, top_p=0.95, min_p=0.01, typical_p=0.97, top_n_sigma=3.0,
                        repeat_penalty=1.2, repeat_last_n=32, presence_penalty=0.3, frequency_penalty=0.2,
                        dry_multiplier=0.8, xtc_probability=0.3, xtc_threshold=0.2, dynatemp_range=0.2,
                        logit_bias=[(5, -3.0), (42, 1.5)], seed=3)
# A bad value for every setting that takes one, and what its one line says
BAD = {"temperature": ("-1", "temperature must be a number >= 0"), "top_k": ("-2", "top-k must be an integer >= 0"),
       "top_p": ("1.5", "top-p must be in (0, 1]"), "min_p": ("1.5", "min-p must be in [0, 1]"),
       "seed": ("-1", "seed must be an integer in 0.."),
       "logit_bias": ("5", "logit-bias must be ID=BIAS"), "repeat_penalty": ("0", "repeat-penalty must be a number > 0"),
       "repeat_last_n": ("-1", "repeat-last-n must be an integer >= 0"),
       "presence_penalty": ("inf", "presence-penalty must be a finite number"),
       "frequency_penalty": ("nan", "frequency-penalty must be a finite number"),
       "dry_multiplier": ("-0.5", "dry-multiplier must be a number >= 0"),
       "dry_base": ("0.9", "dry-base must be a number >= 1"),
       "dry_allowed_length": ("-1", "dry-allowed-length must be an integer >= 0"),
       "dry_penalty_last_n": ("-1", "dry-penalty-last-n must be an integer >= 0"),
       "dry_sequence_breakers": ("x" * 41, "over llama.cpp's 40"),
       "dynatemp_range": ("-1", "dynatemp-range must be a number >= 0"),
       "dynatemp_exp": ("-2", "dynatemp-exp must be a number >= 0"),
       "top_n_sigma": ("0", "top-n-sigma must be a number > 0, or -1 for off"),
       "typical_p": ("0", "typical-p must be in (0, 1]"),
       "xtc_probability": ("2", "xtc-probability must be in [0, 1]"),
       "xtc_threshold": ("-0.1", "xtc-threshold must be in [0, 1]"),
       "mirostat": ("1", "mirostat 1 (the first version) is not implemented"),
       "mirostat_tau": ("-1", "mirostat-ent must be a number >= 0"),
       "mirostat_eta": ("-1", "mirostat-lr must be a number >= 0"),
       "samplers": ("top_k;nope", "samplers: no stage 'nope'")}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _args(*argv: str):
    parser = argparse.ArgumentParser()
    add_sampler_flags(parser)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--top-candidates", type=int, default=10)
    return parser.parse_args(list(argv))


# ------------------------------------------------------------------------------------------------ settings, flags

def test_every_setting_has_a_flag_and_a_bad_value_is_one_line():
    numeric = [p for p in PARAMS if p.kind is not bool]
    assert set(BAD) == {p.name for p in numeric}  # a new setting needs a bad value here
    for p in numeric:
        value, needle = BAD[p.name]
        with pytest.raises((SettingsError, SystemExit)) as caught:
            settings_from_args(_args(p.flag, value))
        if caught.type is SettingsError:
            assert needle in str(caught.value) and "\n" not in str(caught.value), (p.name, str(caught.value))
    for flag, value, needle in (("--samplers", "top_k;topk", "samplers names top_k twice"),
                                ("--logit-bias", "15043=nan", "logit-bias: token 15043's bias must be a finite"),
                                ("--mirostat", "1", "mirostat 1 (the first version) is not implemented")):
        one_line_error(tokentui("--headless", "--no-record", flag, value), needle)


def test_the_flags_spell_the_settings_as_llama_cpp_does():
    s, _ = settings_from_args(_args("--samplers", "penalties;top-k;typical;nucleus;temp", "--logit-bias", "15043+1",
                                    "--logit-bias", "7=-2.5", "--logit-bias", "9-0.5", "--dry-sequence-breaker",
                                    "none", "--dry-sequence-breaker", "\n\n", "--mirostat-ent", "3", "--top-n-sigma",
                                    "-1"))
    assert s.samplers == "penalties;top_k;typ_p;top_p;temperature"
    assert s.logit_bias == ((7, -2.5), (9, -0.5), (15043, 1.0))
    assert s.dry_sequence_breakers == ("\n\n",) and s.mirostat_tau == 3.0
    assert settings_from_args(_args())[0] == SamplerSettings()  # no flag: the defaults, every new stage off
    assert DEFAULT_ORDER == "penalties;dry;temperature;top_n_sigma;top_k;typ_p;top_p;min_p;xtc"
    assert [s.name for s in chain_order(SamplerSettings(top_k=5, min_p=0.1))] == ["temperature", "top_k", "top_p",
                                                                                 "min_p"]  # today's chain
    assert parse_order("TOP_K ; min-p") == ("top_k", "min_p")


def test_mirostat_replaces_the_chain_as_in_llama_cpp():
    s = EVERY.with_changes(mirostat=2)
    assert [st.name for st in chain_order(s)] == ["logit_bias", "temperature", "mirostat"]
    assert "dynatemp" not in backend_gaps(s, "native")


# ------------------------------------------------------------------------------------------------ records

def test_every_setting_is_recorded_and_read_back_and_old_records_read_as_off(tmp_path):
    settings = EVERY.with_changes(samplers="temperature;top_k;xtc", dry_sequence_breakers=("\n", "::"),
                                  mirostat_tau=4.5)
    engine = ScriptedEngine(sampler=settings)
    with RecordedRun(engine.facts, RunRecorder(tmp_path), on_note=lambda m: None) as run:
        run.open()
        list(run.record(engine.run("hello")))
    written = [json.loads(line) for line in run.path.read_text().splitlines()]
    step = next(w for w in written if w.get("event") == "step")
    assert step["settings"]["samplers"] == "temperature;top_k;xtc" and step["settings"]["logit_bias"] == [
        [5, -3.0], [42, 1.5]]
    steps = [e for _, e in read_lines(run.path)[0] if isinstance(e, StepEvent)]
    assert steps and all(s.settings == settings for s in steps)
    old = [e for _, e in read_lines(Path(__file__).parent.parent / "data" / "record.jsonl")[0]
           if isinstance(e, StepEvent)]
    assert old and all(s.settings.repeat_penalty == 1.0 and s.settings.samplers == DEFAULT_ORDER
                       and s.settings.logit_bias == () and not chain_order(s.settings)[0].name == "penalties"
                       for s in old)
    bad = run.path.read_text().replace('"mirostat": 0', '"mirostat": 1')
    (tmp_path / "bad.jsonl").write_text(bad)
    with pytest.raises(Exception, match="mirostat 1"):
        read_lines(tmp_path / "bad.jsonl")


# ------------------------------------------------------------------------------------------------ served

def test_each_server_gets_the_settings_under_its_own_names_and_one_line_says_what_it_ignores():
    body, order = served_sampler(EVERY, "llama.cpp")
    assert order == DEFAULT_ORDER.split(";")
    assert {k: body[k] for k in ("repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty",
                                 "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                                 "top_n_sigma", "typical_p", "xtc_probability", "xtc_threshold", "dynatemp_range",
                                 "dynatemp_exponent", "mirostat", "mirostat_tau", "mirostat_eta")} == {
        "repeat_penalty": 1.2, "repeat_last_n": 32, "presence_penalty": 0.3, "frequency_penalty": 0.2,
        "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 64,
        "top_n_sigma": 3.0, "typical_p": 0.97, "xtc_probability": 0.3, "xtc_threshold": 0.2, "dynatemp_range": 0.2,
        "dynatemp_exponent": 1.0, "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1}
    assert body["logit_bias"] == [[5, -3.0], [42, 1.5]] and body["dry_sequence_breakers"] == ["\n", ":", '"', "*"]
    assert ignored_by(EVERY, "llama.cpp") == []
    vllm, _ = served_sampler(EVERY, "vLLM")
    assert vllm["repetition_penalty"] == 1.2 and vllm["logit_bias"] == {"5": -3.0, "42": 1.5}
    assert "dry_multiplier" not in vllm and "typical_p" not in vllm
    assert ignored_by(EVERY, "vLLM") == ["repeat-last-n", "DRY", "dynatemp-range", "top-n-sigma", "typical-p", "XTC"]
    assert served_sampler(SamplerSettings(), "vLLM")[0] == {"temperature": 0.7, "top_k": -1, "top_p": 0.9,
                                                            "min_p": 0.0, "seed": 0}  # nothing new when all off


def test_a_served_llama_server_run_sends_the_chain_and_a_vllm_run_says_what_it_lacks():
    with FakeServer(engine="llama.cpp") as server:
        served = ServerEngine.connect(ServerOptions(server.url, timeout=30.0), EVERY,
                                      RunOptions(max_new_tokens=2, top_candidates=2))
        path, sent = served.request_body([1, 2, 3], EVERY, 4)
        served.close()
    assert path == "/completion"
    assert sent["samplers"] == DEFAULT_ORDER.split(";") and sent["repeat_penalty"] == 1.2
    assert sent["dry_multiplier"] == 0.8 and sent["xtc_threshold"] == 0.2 and sent["logit_bias"] == [[5, -3.0],
                                                                                                     [42, 1.5]]
    with FakeServer(engine="vllm") as server:
        served = ServerEngine.connect(ServerOptions(server.url, timeout=30.0), EVERY,
                                      RunOptions(max_new_tokens=2, top_candidates=2))
        events = list(served.run("hello"))
        served.close()
    notes = [e.message for e in events if isinstance(e, Notice) and "samples without" in e.message]
    assert len(notes) == 1 and "DRY, dynatemp-range, top-n-sigma, typical-p, XTC" in notes[0]
    assert server.requests[0]["presence_penalty"] == 0.3 and "dry_multiplier" not in server.requests[0]


# ------------------------------------------------------------------------------------------------ backends

def test_native_and_torch_give_the_same_ids_for_1000_seeded_steps():
    if native_op() is None:
        pytest.skip("tokentui's native library does not build here")
    s = SamplerSettings(temperature=0.9, top_k=40, top_p=0.95)
    assert backend_gaps(s, "native") == []
    native, torch_gen = _gen(3), _gen(3)
    for t in range(1000):
        x = torch.randn(2048, generator=_gen(10_000 + t)) * 3
        a, b = select(x, s, native, 8, native=True), select(x, s, torch_gen, 8, native=False)
        assert (a.token_id, a.kept_count, a.top_k_kept, a.top_p_kept) == (b.token_id, b.kept_count, b.top_k_kept,
                                                                          b.top_p_kept)


def test_the_native_chain_takes_every_stage_and_seeded_runs_replay_with_every_stage_on():
    """With every stage on, the step runs the whole chain's own C++ call (nothing routed to torch but what it
    would sort over the whole vocabulary), and a seeded run replays on either backend."""
    assert backend_gaps(EVERY, "native") == [] and backend_gaps(EVERY.with_changes(mirostat=2), "native") == []
    assert backend_gaps(EVERY, "fused")
    assert backend_gaps(SamplerSettings(top_k=3, top_p=0.5, samplers="top_p;top_k;temperature"),
                        "native") == ["top-p over the whole vocabulary"]
    assert backend_gaps(SamplerSettings(min_p=0.1), "native") == ["min-p"]  # the classic chain's C++ call lacks it
    history = [1, 2, 3, 1, 2, 3, 1, 2]
    runs = []
    for native in (None, False, None):
        gen, ids = _gen(EVERY.seed), list(history)
        for t in range(100):
            x = torch.randn(3_000, generator=_gen(t)) * 3
            ids.append(select(x, EVERY, gen, 8, native=native, given=ChainInput(ids=ids)).token_id)
        runs.append(ids)
    assert runs[0] == runs[1] == runs[2]  # the same seed, the same ids, on the backend the step was sent to
    if native_op() is not None:
        with pytest.raises(RuntimeError, match="the native selection has no top-p over the whole vocabulary"):
            select(torch.randn(3_000), EVERY.with_changes(samplers="top_p;top_k"), _gen(0), 8, native=True)


# ------------------------------------------------------------------------------------------------ local runs

@pytest.fixture(scope="module")
def tiny(smol_tokenizer):
    model = tiny_model("llama", smol_tokenizer, initializer_range=0.2)
    return LoadedModel(model, smol_tokenizer, model_facts(model, smol_tokenizer, name="tiny-llama"))


def _run(loaded, settings, n=12, **kw):
    engine = Engine(loaded, settings, RunOptions(max_new_tokens=n, ignore_eos=True, top_candidates=20))
    events = list(engine.branch(kw["point"]) if "point" in kw else engine.run("Say it again and again."))
    prompt = next((e.ids for e in events if isinstance(e, PromptEvent)), None)
    return engine, prompt, [e for e in events if isinstance(e, StepEvent)]


def _logits(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1].float()


def test_a_local_run_reads_its_history_and_replays_from_its_seed_with_every_stage_on(tiny):
    _, prompt, steps = _run(tiny, EVERY)
    assert [s.id for s in _run(tiny, EVERY)[2]] == [s.id for s in steps]  # the same seed, the same ids
    settings = EVERY.with_changes(xtc_probability=0.0)  # XTC's roll is the run's own draw: left out here
    _, prompt, steps = _run(tiny, settings)
    ids = list(prompt) + [s.id for s in steps]
    for k in (0, 5, 11):  # each step's candidates: the chain on that step's scores, over the prompt + tokens so far
        before = ids[: len(prompt) + k]
        given = RunHistory(tiny.tokenizer, token_bytes(tiny.tokenizer), before).given(settings)  # DRY's breakers too
        want = reference_probs(_logits(tiny.model, before), settings, given)
        got = torch.tensor([c.prob for c in steps[k].candidates])
        torch.testing.assert_close(got, want[[c.id for c in steps[k].candidates]], atol=1e-4, rtol=0)
    free = SamplerSettings(temperature=0.9, top_k=60, seed=3)
    repeat = free.with_changes(repeat_penalty=50.0, repeat_last_n=0)  # window 0: the penalty is off
    assert [s.id for s in _run(tiny, free)[2]] == [s.id for s in _run(tiny, repeat)[2]]
    harsh = free.with_changes(repeat_penalty=50.0, repeat_last_n=64, presence_penalty=20.0)
    _, prompt2, penalised = _run(tiny, harsh, n=16)
    seen = set(prompt2)
    for s in penalised:  # a token of the prompt or already drawn is never drawn again while others remain
        assert s.id not in seen
        seen.add(s.id)


def test_a_branch_restores_mirostats_state_from_the_steps_before_it(tiny):
    settings = SamplerSettings(temperature=1.0, mirostat=2, mirostat_tau=2.0, mirostat_eta=0.5, seed=1)
    engine, prompt, steps = _run(tiny, settings, n=10)
    at = 6
    mu = mirostat_mu([(s.settings, s.chosen_prob) for s in steps[:at]])
    point = BranchPoint(tuple(prompt), tuple(s.id for s in steps[:at]), at, steps[at].id, mirostat_mu=mu)
    branched = _run(tiny, settings, n=4, point=point)[2]
    after = next(s for s in branched if s.index == at + 1)  # the step after the forced one: the parent's mu there
    parent = steps[at + 1]
    assert [c.id for c in after.candidates] == [c.id for c in parent.candidates]
    torch.testing.assert_close(torch.tensor([c.prob for c in after.candidates]),
                               torch.tensor([c.prob for c in parent.candidates]), atol=1e-5, rtol=0)
    fresh = _run(tiny, settings, n=4, point=BranchPoint(tuple(prompt), tuple(s.id for s in steps[:at]), at,
                                                        steps[at].id))[2]
    started = next(s for s in fresh if s.index == at + 1)
    assert started.kept_count != parent.kept_count  # without the state: another truncation (the test can fail)
