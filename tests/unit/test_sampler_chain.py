"""The sampler chain (core/samplers.py): one registry of stages, three selection backends held to it.

The oracle is transformers' own warpers (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
MinPLogitsWarper), applied here by name, not through the registry: the whole-vocabulary reference
(core/steps/stages.py), the torch backend (core/steps/select.py), the native one (core/model/native/select.cpp, or
the torch backend where it lacks a stage) and the compiled step's (core/model/decode/fused_step.py) must give the
distribution they give, and the three backends the same token from the same seed. min-p, the stage added through
the registry, is checked end to end: its flag, the record, the served request, the one-pass panel.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from cli_run import one_line_error, tokentui
from fake_openai_server import FakeServer
from fakes import ScriptedEngine
from tokentui.core.errors import SettingsError
from tokentui.core.model.decode.fused_step import fused_select, sampler_tensor, write_sampler
from tokentui.core.runs.events import Notice, StepEvent
from tokentui.core.runs.record_reader import read_lines
from tokentui.core.runs.record_writer import RunRecorder
from tokentui.core.runs.recording import RecordedRun
from tokentui.core.samplers import DEFAULT_ORDER, PARAMS, STAGES, backend_gaps, served_sampler
from tokentui.core.server.engine import ServerEngine, ServerOptions
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.core.steps.select import draw_noise, native_op, reference_probs, select, unpack
from tokentui.core.steps.stages import chain, warper

N = 10
WARPERS = {"temperature": TemperatureLogitsWarper, "top_k": TopKLogitsWarper, "top_p": TopPLogitsWarper,
           "min_p": MinPLogitsWarper}
SETTINGS = [
    SamplerSettings(temperature=0),
    SamplerSettings(temperature=0.7),
    SamplerSettings(temperature=1.0, top_p=1.0),
    SamplerSettings(temperature=1.3, top_k=5),
    SamplerSettings(temperature=1.0, top_k=50, top_p=0.8),
    SamplerSettings(temperature=0.8, top_p=1.0, min_p=0.1),
    SamplerSettings(temperature=1.5, top_p=1.0, min_p=0.02),
    SamplerSettings(temperature=1.0, top_k=40, top_p=0.95, min_p=0.05),
    SamplerSettings(temperature=0.6, top_p=0.9, min_p=0.3),
    SamplerSettings(temperature=1.0, top_p=1.0, min_p=1.0),  # only the top score (and its ties) stay
]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _logits(vocab: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(vocab, generator=_gen(seed)) * scale


def _warped(x: torch.Tensor, s: SamplerSettings) -> torch.Tensor:
    """transformers' post-sampler distribution, the warpers named here in generate's order (not the registry's)."""
    if s.is_greedy:
        return torch.nn.functional.one_hot(x.argmax(), x.numel()).float()
    scores = TemperatureLogitsWarper(s.temperature)(None, x[None].float())
    if s.top_k:
        scores = TopKLogitsWarper(s.top_k)(None, scores)
    if s.top_p < 1.0:
        scores = TopPLogitsWarper(s.top_p)(None, scores)
    if s.min_p > 0:
        scores = MinPLogitsWarper(s.min_p)(None, scores)
    return torch.softmax(scores, dim=-1)[0]


def _fused(x: torch.Tensor, s: SamplerSettings, seed: int):
    sampler = sampler_tensor(x.device)
    write_sampler(sampler, s)
    noise = draw_noise(None if s.is_greedy else _gen(seed), x.numel(), x.device)
    return unpack(fused_select(x, sampler, noise, N).tolist(), N, s.is_greedy)


def _agrees(selection, probs: torch.Tensor) -> None:
    """A Selection says what the distribution `probs` says: the kept count, the reported tokens' probabilities,
    and a chosen token it can draw."""
    assert selection.kept_count == int((probs > 0).sum())
    assert torch.allclose(torch.tensor(selection.top_sampled_probs), probs[selection.top_ids], atol=2e-6, rtol=1e-4)
    assert probs[selection.token_id] > 0
    assert math.isclose(selection.chosen_prob, float(probs[selection.token_id]), rel_tol=1e-4, abs_tol=2e-6)


# ----------------------------------------------------------------------------------------------- the registry

def test_each_stage_is_its_transformers_warper_and_says_what_it_cut():
    """The registry names each stage's transformers warper (the reference masks with it), in generate's order, and
    the reference's report of each stage's cut agrees with the backends' counts (top-k's and top-p's fields, the
    last stage's kept count) and with the mass those entries had as the stage received them."""
    classic = [s for s in STAGES if s.name in WARPERS]  # the others: tests/unit/test_sampler_stages*.py
    assert [s.name for s in classic] == list(WARPERS)  # generate's order: temperature, top-k, top-p, min-p
    for stage in classic:
        assert type(warper(stage, 1 if stage.param.kind is int else 0.5)) is WARPERS[stage.name]
    settings = SamplerSettings(temperature=0.9, top_k=200, top_p=0.9, min_p=0.05)
    for seed in range(4):
        x = _logits(3_000, seed, scale=1.0 + seed)
        probs, cuts = chain(x, settings)
        assert [c.stage for c in cuts] == ["temperature", "top_k", "top_p", "min_p"]
        temperature, top_k, top_p, min_p = cuts
        assert (temperature.count, temperature.mass, temperature.left) == (0, 0.0, 3_000)
        sel = select(x, settings, _gen(seed), N, native=False)
        assert (top_k.left, top_p.left, min_p.left) == (sel.top_k_kept, sel.top_p_kept, sel.kept_count)
        assert sum(c.count for c in cuts) == 3_000 - sel.kept_count == 3_000 - int((probs > 0).sum())
        scaled = torch.softmax(x / 0.9, dim=-1)  # what top-k received: its cut is the tail past the 200 best
        assert math.isclose(top_k.mass, float(scaled.sort(descending=True).values[200:].sum()), rel_tol=1e-4)
        assert 0 < top_p.mass < 0.1 + 1e-6 and 0 <= min_p.mass < 1


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}-m{s.min_p}")
def test_the_backends_agree_with_each_other_and_with_the_warpers(settings):
    """The oracle test: torch, native (where it has every stage the settings use) and fused selection give
    transformers' distribution, and the same token from the same seed."""
    native = native_op() is not None and not backend_gaps(settings, "native")
    for vocab in (2_000, 49_152):
        for seed in range(3):
            x = _logits(vocab, seed)
            probs = _warped(x, settings)
            assert torch.allclose(reference_probs(x, settings), probs, atol=1e-7)  # the registry's oracles
            assert torch.equal(chain(x, settings)[0], reference_probs(x, settings))  # reported or not
            torch_sel = select(x, settings, _gen(seed), N, native=False)
            _agrees(torch_sel, probs)
            fused = _fused(x, settings, seed)
            _agrees(fused, probs)
            assert fused.token_id == torch_sel.token_id
            if native:
                native_sel = select(x, settings, _gen(seed), N, native=True)
                _agrees(native_sel, probs)
                assert native_sel.token_id == torch_sel.token_id


@pytest.mark.parametrize("vocab", [50, 3_000, 151_936])
def test_min_p_against_transformers_min_p_warper(vocab):
    """min-p on random logits of several shapes, alone and after the other stages, torch and fused backends: the
    kept set and the probabilities of MinPLogitsWarper, and the draw inside it."""
    for trial in range(12):
        gen = _gen(1000 + trial)
        x = torch.randn(vocab, generator=gen) * float(torch.rand(1, generator=gen) * 5 + 0.3)
        min_p = float(torch.rand(1, generator=gen)) * 0.5 + 0.001
        t = float(torch.rand(1, generator=gen)) * 1.5 + 0.2
        for settings in (SamplerSettings(temperature=t, top_p=1.0, min_p=min_p),
                         SamplerSettings(temperature=t, top_k=20, top_p=0.9, min_p=min_p)):
            scores = TemperatureLogitsWarper(t)(None, x[None].clone())
            if settings.top_k:
                scores = TopPLogitsWarper(0.9)(None, TopKLogitsWarper(20)(None, scores))
            probs = torch.softmax(MinPLogitsWarper(min_p)(None, scores), dim=-1)[0]
            floor = torch.softmax(scores, -1)[0]
            assert torch.equal(probs > 0, floor >= min_p * floor.max())  # the warper's rule, as documented
            _agrees(select(x, settings, _gen(trial), N), probs)
            _agrees(_fused(x, settings, trial), probs)


def test_a_stage_the_native_backend_lacks_runs_on_torch_and_says_so():
    settings = SamplerSettings(temperature=0.9, min_p=0.1)
    assert backend_gaps(settings, "native") == ["min-p"] and backend_gaps(settings, "fused") == []
    assert backend_gaps(settings.with_changes(min_p=0.0), "native") == []
    x = _logits(5_000, 3)
    default, on_torch = select(x, settings, _gen(7), N), select(x, settings, _gen(7), N, native=False)
    assert default == on_torch  # the same numbers: the torch backend ran, not a native call without min-p
    with pytest.raises(RuntimeError, match="the native selection has no min-p"):
        select(x, settings, _gen(7), N, native=True)


def test_seeded_draws_without_min_p_are_unchanged_by_it():
    """min-p 0 (off, the default) takes the same path as before it existed: the same token for the same seed as
    settings that never name it."""
    for seed in range(5):
        x = _logits(49_152, seed)
        for s in (SamplerSettings(temperature=0.7), SamplerSettings(temperature=1.1, top_k=30, top_p=0.8)):
            a = select(x, s, _gen(seed), N)
            b = select(x, s.with_changes(min_p=0.0), _gen(seed), N)
            assert a == b


# ----------------------------------------------------------------------------------------------- settings, flags

BAD = {"temperature": ("-1", "temperature must be a number >= 0"), "top_k": ("-2", "top-k must be an integer >= 0"),
       "top_p": ("1.5", "top-p must be in (0, 1]"), "min_p": ("1.5", "min-p must be in [0, 1]"),
       "seed": ("-1", "seed must be an integer in 0..")}


def test_settings_fields_are_the_registrys_and_checked_where_built():
    assert list(SamplerSettings().to_dict()) == [p.name for p in PARAMS]
    assert SamplerSettings(temperature=1, top_k=3, top_p=1).top_p == 1.0  # floats stored as floats
    assert SamplerSettings().min_p == 0.0
    for bad in (-0.1, 1.01, float("nan"), "0.1", True):
        with pytest.raises(SettingsError, match="min-p must be in"):
            SamplerSettings(min_p=bad)


def test_every_parameter_has_a_flag_that_rejects_a_bad_value_in_one_line(isolated_dirs):
    help_text = tokentui("--help").stdout + tokentui("branch", "--help").stdout
    for p in PARAMS:
        assert help_text.count(p.flag) >= 2, p.flag  # on the dashboard / headless command and on branch
    numeric = [p for p in PARAMS if p.name in BAD]  # issue 38's settings: tests/unit/test_sampler_stages_run.py
    assert len(numeric) == len(BAD)
    for p in numeric:
        value, needle = BAD[p.name]
        one_line_error(tokentui("--headless", "--no-record", p.flag, value), needle)
    one_line_error(tokentui("--headless", "--no-record", "--min-p", "lots"), "min-p must be a number")


# ----------------------------------------------------------------------------------------------- the record

def test_min_p_is_recorded_and_read_back_and_old_records_read_as_off(tmp_path):
    engine = ScriptedEngine(sampler=SamplerSettings(temperature=0.8, min_p=0.25))
    with RecordedRun(engine.facts, RunRecorder(tmp_path), on_note=lambda m: None) as run:
        run.open()
        list(run.record(engine.run("hello")))
    written = [json.loads(line) for line in run.path.read_text().splitlines()]
    assert {w["settings"]["min_p"] for w in written if w.get("event") == "step"} == {0.25}
    steps = [e for _, e in read_lines(run.path)[0] if isinstance(e, StepEvent)]
    assert steps and all(s.settings.min_p == 0.25 for s in steps)
    # a record written before min-p existed: its steps read as min-p off
    old = [e for _, e in read_lines(Path(__file__).parent.parent / "data" / "record.jsonl")[0]
           if isinstance(e, StepEvent)]
    assert old and all(s.settings.min_p == 0.0 for s in old)


# ----------------------------------------------------------------------------------------------- served request

def test_the_served_request_carries_min_p_under_each_servers_name():
    s = SamplerSettings(temperature=0.9, top_k=0, top_p=0.95, min_p=0.07, seed=5)
    body, order = served_sampler(s, "llama.cpp")  # llama-server also gets every other stage's settings (off here)
    assert {k: body[k] for k in ("temperature", "top_k", "top_p", "min_p", "seed")} == {
        "temperature": 0.9, "top_k": 0, "top_p": 0.95, "min_p": 0.07, "seed": 5}
    assert order == DEFAULT_ORDER.split(";")  # today's chain, with the stages that are off in llama.cpp's places
    for kind in ("vLLM", "SGLang"):
        assert served_sampler(s, kind)[0] == {"temperature": 0.9, "top_k": -1, "top_p": 0.95, "min_p": 0.07,
                                              "seed": 5}
    assert "min_p" not in served_sampler(s, "OpenAI")[0]
    greedy = served_sampler(s.with_changes(greedy=True), "vLLM")[0]
    assert greedy["temperature"] == 0.0


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_served_run_sends_min_p(engine):
    settings = SamplerSettings(temperature=0.8, min_p=0.12)
    with FakeServer(engine=engine) as server:
        served = ServerEngine.connect(ServerOptions(server.url, timeout=30.0), settings,
                                      RunOptions(max_new_tokens=3, top_candidates=2))
        events = list(served.run("hello"))
        served.close()
    assert server.requests and server.requests[0]["min_p"] == 0.12 and server.requests[0]["top_p"] == 0.9
    assert not any(isinstance(e, Notice) and "min-p" in e.message for e in events)


def test_a_server_without_min_p_says_it_samples_without_it():
    with FakeServer(engine="other") as server:
        served = ServerEngine.connect(ServerOptions(server.url, timeout=30.0), SamplerSettings(min_p=0.1),
                                      RunOptions(max_new_tokens=2, top_candidates=2))
        events = list(served.run("hello"))
        served.close()
    assert "min_p" not in server.requests[0]
    notes = [e.message for e in events if isinstance(e, Notice) and "min-p" in e.message]
    assert len(notes) == 1 and "samples without it" in notes[0]


def test_llama_servers_request_orders_its_samplers_by_the_chain():
    with FakeServer(engine="llama.cpp") as server:
        served = ServerEngine.connect(ServerOptions(server.url, timeout=30.0), SamplerSettings(),
                                      RunOptions(max_new_tokens=2, top_candidates=2))
        path, body = served.request_body([1, 2, 3], SamplerSettings(temperature=0.5, top_k=7, min_p=0.2), 4)
        served.close()
    assert path == "/completion"
    assert body["samplers"] == DEFAULT_ORDER.split(";")
    assert (body["temperature"], body["top_k"], body["top_p"], body["min_p"]) == (0.5, 7, 0.9, 0.2)


# ----------------------------------------------------------------------------------------------- the panels

def test_the_one_pass_panel_names_min_p_and_says_which_selection_ran(smol_tokenizer):
    """The sampler stages' line names every cut that is on (min-p with what it kept: the step's kept count), and
    on a local CPU model, that a stage the native selection lacks sent the step to the torch one."""
    from tiny_models import tiny_model
    from tokentui.core.model.load.loader import model_facts
    from tokentui.core.model.observe.anatomy import one_pass

    facts = model_facts(tiny_model("llama", smol_tokenizer), smol_tokenizer, name="tiny-llama")
    assert facts.device.startswith("cpu")
    engine = ScriptedEngine(sampler=SamplerSettings(temperature=0.8, top_p=0.9, min_p=0.2))
    step = next(e for e in engine.run("hello") if isinstance(e, StepEvent))
    stages = {s.name: s for s in one_pass(facts, 10, step, step.settings)}
    cuts = stages["top-k / top-p / min-p"].note
    assert f"min-p 0.2: {step.kept_count} kept" in cuts and "top-p 0.9" in cuts
    assert "torch selection: the native one has no min-p" in cuts
    plain = {s.name: s for s in one_pass(facts, 10, step, step.settings.with_changes(min_p=0.0))}
    assert "top-k / top-p" in plain and "torch selection" not in plain["top-k / top-p"].note
