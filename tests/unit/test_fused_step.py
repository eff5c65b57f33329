"""The whole step's selection (core/model/decode/fused_step.py) against the eager path and its oracles: every reported number
equal to `select`'s, the post-sampler distribution equal to transformers' warpers, the same seeded draw; and, under
torch.compile, one graph that never compiles again (1,000 steps, sampler changes) with Dynamo's own counters."""

from __future__ import annotations

import math

import pytest
import torch

from tiny_models import tiny_model
from tokentui.core.model.engine import Engine
from tokentui.core.model.decode.fused_step import fused_select, sampler_tensor, write_sampler
from tokentui.core.model.load.loader import LoadedModel, model_facts
from tokentui.core.model.speed import SpeedOptions
from tokentui.core.runs.events import StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings
from tokentui.core.steps.select import draw_noise, reference_probs, select, unpack

N = 10
SETTINGS = [
    SamplerSettings(temperature=0),
    SamplerSettings(temperature=1.0),
    SamplerSettings(temperature=0.7),
    SamplerSettings(temperature=1.3, top_k=5),
    SamplerSettings(temperature=0.8, top_p=0.9),
    SamplerSettings(temperature=1.0, top_k=50, top_p=0.8),
    SamplerSettings(temperature=0.9, top_k=1),
    SamplerSettings(temperature=1.1, top_k=100_000),  # >= V: top-k keeps everything, and says so
    SamplerSettings(temperature=0.05, top_p=0.6),  # the far tail underflows to 0 (0.5 would cut inside the tie)
]


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _logits(vocab: int, seed: int) -> torch.Tensor:
    g = _gen(seed)
    x = torch.randn(vocab, generator=g) * 3.0
    x[7] = x[11] = x.max() + 1.0  # a tie at the top: argmax's first index
    return x


def _fused(x, settings, seed):
    sampler = sampler_tensor(x.device)
    write_sampler(sampler, settings)
    noise = draw_noise(None if settings.is_greedy else _gen(seed), x.numel(), x.device)
    return unpack(fused_select(x, sampler, noise, N).tolist(), N, settings.is_greedy)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}")
@pytest.mark.parametrize("vocab", [49_152, 2_000])
def test_fused_selection_reports_what_select_reports(settings, vocab):
    for seed in range(4):
        x = _logits(vocab, seed)
        eager = select(x, settings, _gen(seed), N)
        fused = _fused(x, settings, seed)
        assert fused.token_id == eager.token_id, seed  # the same seeded draw
        assert (fused.chosen_rank, fused.kept_count, fused.greedy) == (eager.chosen_rank, eager.kept_count,
                                                                      eager.greedy)
        assert (fused.top_k_kept, fused.top_p_kept) == (eager.top_k_kept, eager.top_p_kept)
        assert fused.top_ids[:2] == [7, 11] and sorted(eager.top_ids[:2]) == [7, 11]  # a tie: id order here
        assert sorted(fused.top_ids) == sorted(eager.top_ids)
        for name in ("chosen_raw_prob", "chosen_prob", "kept_mass", "entropy_bits", "sampled_entropy_bits"):
            assert math.isclose(getattr(fused, name), getattr(eager, name), rel_tol=2e-5, abs_tol=1e-6), name
        if not settings.is_greedy:
            assert math.isclose(fused.temp_entropy_bits, eager.temp_entropy_bits, rel_tol=2e-5, abs_tol=1e-6)
        # the oracle: transformers' warpers over the whole vocabulary
        ref = reference_probs(x, settings)
        torch.testing.assert_close(torch.tensor(fused.top_sampled_probs), ref[fused.top_ids], rtol=2e-5, atol=1e-6)
        assert fused.kept_count == int((ref > 0).sum())
        assert ref[fused.token_id] > 0


def test_greedy_is_argmax_first_index_and_consumes_no_noise():
    x = _logits(49_152, 3)
    assert _fused(x, SamplerSettings(temperature=0), 0).token_id == int(torch.argmax(x)) == 7


def test_non_finite_scores_are_refused_like_select():
    from tokentui.core.errors import GenerationError

    x = _logits(2_000, 0)
    x[5] = float("nan")
    for settings in (SamplerSettings(temperature=0), SamplerSettings(temperature=1.0, top_p=0.9)):
        with pytest.raises(GenerationError):
            _fused(x, settings, 0)


# ---------------------------------------------------------------------------------------------------------------
# The whole step under torch.compile (dynamo's eager backend: recompiles and guards are dynamo's, whatever backend).

SCHEDULE = {0: SamplerSettings(temperature=0), 150: SamplerSettings(temperature=0.8, top_k=40, seed=3),
            400: SamplerSettings(temperature=1.0, top_p=0.9, seed=3), 650: SamplerSettings(temperature=0),
            800: SamplerSettings(temperature=1.2, top_k=200, top_p=0.95, seed=9)}


def _run_with_schedule(engine):
    """A 1,000-step run whose sampler changes at the SCHEDULE's steps (taking effect at the next step)."""
    steps = []
    engine.update_sampler(**SCHEDULE[0].to_dict())
    for event in engine.run("Hi"):
        if isinstance(event, StepEvent):
            steps.append(event)
            if event.index + 1 in SCHEDULE:
                engine.update_sampler(**SCHEDULE[event.index + 1].to_dict())
    return steps


def test_the_whole_step_compiles_once_for_1000_steps_and_sampler_changes(smol_tokenizer, monkeypatch):
    """Forward + selection + packing as one graph: after the warm-up, 1,000 steps with the sampler changed four
    times (greedy, top-k, top-p, both) compile nothing (Dynamo's counters), the decoder never fell back, and every
    step reports what the eager path reports from the same seed: the same ids, the same kept counts."""
    from torch._dynamo.utils import counters

    import tokentui.core.model.decode.compiled as compiled

    monkeypatch.setattr(compiled, "compile_settings",
                        lambda device: (dict(fullgraph=True, dynamic=False, backend="eager"), {}))
    torch.compiler.reset()
    model = tiny_model("llama", smol_tokenizer, max_position_embeddings=2048)
    loaded = LoadedModel(model=model, tokenizer=smol_tokenizer, facts=model_facts(model, smol_tokenizer, name="t"))
    options = RunOptions(max_new_tokens=1000, ignore_eos=True)
    threads = torch.get_num_threads()
    try:
        engine = Engine(loaded, SamplerSettings(temperature=0), options, speed=SpeedOptions(compile=True))
        assert engine.compiled is not None and engine.compiled.top_n == options.top_candidates
        graphs, frames = counters["stats"]["unique_graphs"], counters["frames"]["ok"]
        assert graphs >= 1
        ours = _run_with_schedule(engine)
        assert counters["stats"]["unique_graphs"] == graphs and counters["frames"]["ok"] == frames
        assert engine.compiled.failure is None
    finally:
        torch.set_num_threads(threads)
    eager = _run_with_schedule(Engine(loaded, SamplerSettings(temperature=0), options))
    assert len(ours) == len(eager) == 1000
    assert [s.id for s in ours] == [s.id for s in eager]
    # Kept counts: equal, except that top-p's boundary may fall one token apart. The compiled step normalises the
    # probabilities over the whole sorted vocabulary and the eager one over its own pass, so the two cumulative
    # masses differ by float rounding (~1e-7); this random model's nucleus holds ~40,000 near-equal tokens, so
    # now and then the boundary token's mass before it lies within that rounding of top_p.
    differ = [(a.kept_count, b.kept_count, a.settings.top_p) for a, b in zip(ours, eager) if a.kept_count != b.kept_count]
    assert all(abs(x - y) == 1 and top_p < 1.0 for x, y, top_p in differ), differ
    assert len(differ) <= len(ours) // 100, differ
    assert [s.top_k_kept for s in ours] == [s.top_k_kept for s in eager]
    assert [s.settings.top_p for s in ours] == [s.settings.top_p for s in eager]
    assert not ours[0].greedy or ours[0].settings.is_greedy
    for a, b in zip(ours, eager):
        assert math.isclose(a.chosen_prob, b.chosen_prob, rel_tol=1e-3, abs_tol=1e-5)
        assert math.isclose(a.entropy_bits, b.entropy_bits, rel_tol=1e-3, abs_tol=1e-5)
