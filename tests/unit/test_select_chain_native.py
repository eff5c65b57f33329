"""The whole sampler chain in one C++ call (core/model/native/select_chain.cpp) against the torch chain
(core/steps/stages.py `run_chain`, each stage transformers' warper or the llama.cpp transcription the stage tests
hold it to): seeded runs of 1,000 steps with every stage on, and runs in other orders (--samplers), pick the same
ids and keep the same sets, with the same report (issue 38)."""

from __future__ import annotations

import math

import pytest
import torch

from tokentui.core.samplers import ChainInput, backend_gaps
from tokentui.core.settings import SamplerSettings
from tokentui.core.steps.select import native_op, reference_probs, select

pytestmark = pytest.mark.skipif(native_op() is None, reason="tokentui's native library does not build here")

EVERY = SamplerSettings(temperature=0.8, dynatemp_range=0.2, top_k=50, top_p=0.95, min_p=0.02, typical_p=0.95,
                        top_n_sigma=3.0, repeat_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.1,
                        dry_multiplier=0.8, xtc_probability=0.5, xtc_threshold=0.1,
                        logit_bias=((13, -2.0), (42, 1.0)), seed=5)
ORDERS = ("top_k;temperature;penalties;min_p;top_p;typ_p;xtc;dry;top_n_sigma",
          "dry;top_n_sigma;xtc;typ_p;temperature;min_p;penalties;top_p;top_k",
          "temperature;top_k;top_p")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _scores(vocab: int, t: int, history: list[int]) -> torch.Tensor:
    """Normal scores with the last tokens raised, so the penalties and DRY have repeats to act on."""
    x = torch.randn(vocab, generator=_gen(50_000 + t)) * 3.0
    x[torch.tensor(history[-6:])] += 6.0
    return x


def _same(a, b) -> None:
    assert (a.token_id, a.chosen_rank, a.kept_count, a.top_k_kept, a.top_p_kept, a.top_ids) == \
        (b.token_id, b.chosen_rank, b.kept_count, b.top_k_kept, b.top_p_kept, b.top_ids)
    assert [p > 0 for p in a.top_sampled_probs] == [p > 0 for p in b.top_sampled_probs]  # the same kept among them
    for f in ("chosen_prob", "chosen_raw_prob", "kept_mass", "entropy_bits", "sampled_entropy_bits",
              "temp_entropy_bits", "mirostat_mu"):
        va, vb = getattr(a, f), getattr(b, f)
        assert (va is None) == (vb is None), f  # greedy: no temperature; mirostat off: no mu
        assert va is None or math.isclose(va, vb, rel_tol=2e-4, abs_tol=1e-5), f
    assert torch.allclose(torch.tensor(a.top_sampled_probs), torch.tensor(b.top_sampled_probs), rtol=2e-4, atol=1e-6)


def _run(settings: SamplerSettings, steps: int, vocab: int) -> None:
    assert backend_gaps(settings, "native") == [] and backend_gaps(settings, "fused")
    history = {True: [7, 8, 9, 7, 8], False: [7, 8, 9, 7, 8]}
    gens = {True: _gen(settings.seed), False: _gen(settings.seed)}
    for t in range(steps):
        x = _scores(vocab, t, history[True])
        sel = {native: select(x, settings, gens[native], 10, native=native, given=ChainInput(ids=history[native]))
               for native in (True, False)}
        _same(sel[True], sel[False])
        for native in (True, False):
            history[native].append(sel[native].token_id)
    assert history[True] == history[False]


def test_every_stage_on_1000_seeded_steps_same_ids_and_kept_sets():
    _run(EVERY, 1000, 8_192)


@pytest.mark.parametrize("order", ORDERS)
def test_other_orders_same_ids_and_kept_sets(order):
    _run(EVERY.with_changes(samplers=order), 300, 8_192)


def test_mirostat_greedy_and_a_large_vocabulary_agree_with_torch():
    for settings, vocab, steps in ((EVERY.with_changes(mirostat=2), 8_192, 100),
                                   (EVERY.with_changes(temperature=0.0), 8_192, 50),
                                   (EVERY, 151_936, 20)):
        _run(settings, steps, vocab)


def test_the_native_chain_draws_from_the_reference_distribution():
    """The kept set and the probabilities the C++ call reports are the reference chain's (core/steps/stages.py
    `chain`, the warpers themselves), the drawn token one it keeps."""
    given = ChainInput(ids=[3, 4, 5, 3, 4, 5, 3, 4], xtc_roll=0.1)
    for seed in range(20):
        x = torch.randn(20_000, generator=_gen(seed)) * 3.0
        probs = reference_probs(x, EVERY, given)
        sel = select(x, EVERY, _gen(seed), 10, native=True, given=given)
        assert sel.kept_count == int((probs > 0).sum())
        assert probs[sel.token_id] > 0
        assert torch.allclose(torch.tensor(sel.top_sampled_probs), probs[sel.top_ids], rtol=2e-4, atol=1e-6)
