"""Step 4, selection: `select` checked against oracles, never against itself.

The oracles: transformers' own TemperatureLogitsWarper / TopKLogitsWarper / TopPLogitsWarper + softmax over the
whole vocabulary (`reference_probs` applies them literally; `_warpers` below rebuilds them independently, also
with float64 accumulation), torch's softmax / argmax / sort for everything about the raw scores, and float64
entropies.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tokentui.core.errors import GenerationError
from tokentui.core.steps import select as select_module
from tokentui.core.steps.select import (Selection, draw_noise, draw_uniforms, exp_noise, race_index, reference_probs,
                                        select)
from tokentui.core.settings import SamplerSettings
from tokentui.core.steps.topn import top_prefix, top_scores

PROB_TOL = 1e-6


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(autouse=True, params=["one C++ call", "torch operations"])
def path(request, monkeypatch):
    """Every test here runs through both of select's CPU paths: the one C++ call (core/model/native/select.cpp)
    and the torch operations (what runs on accelerators, or where the native library does not build)."""
    if request.param == "one C++ call" and select_module.native_op() is None:
        pytest.skip("tokentui's native library does not build here")
    if request.param == "torch operations":
        monkeypatch.setattr(select_module, "native_op", lambda: None)
    return request.param


def sampler(temperature: float = 0.7, top_k: int = 0, top_p: float = 0.9, greedy: bool = False) -> SamplerSettings:
    return SamplerSettings(temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _warpers(x: torch.Tensor, s: SamplerSettings, exact: bool = False) -> torch.Tensor:
    """The post-sampler distribution built straight from transformers' warpers, in generate's order.

    exact=False is literally what generate computes on float32 scores. exact=True divides by the temperature in
    float32 as generate does, then runs the same TopK / TopP warpers and softmax in float64: the same rules
    without float32's accumulation error (torch's float32 softmax normaliser and the warper's ascending cumsum
    are each off by ~1e-5 relative at V = 151,936, which `select` avoids).
    """
    scores = x.reshape(1, -1).float()
    if s.temperature != 1.0:
        scores = TemperatureLogitsWarper(s.temperature)(None, scores)
    if exact:
        scores = scores.double()
    if s.top_k:
        scores = TopKLogitsWarper(s.top_k)(None, scores)
    if s.top_p < 1.0:
        scores = TopPLogitsWarper(s.top_p)(None, scores)
    return torch.softmax(scores, dim=-1)[0]


def _entropy_bits(p: torch.Tensor) -> float:
    p = p.double()
    p = p[p > 0]
    return float(-(p * torch.log2(p)).sum())


def _knife_edge(x: torch.Tensor, s: SamplerSettings, ours: int, theirs: int, margin: float) -> tuple[float, float]:
    """When two kept counts differ, prove it is rounding at the top-p boundary, and bound its effect.

    Top-p keeps a token iff the mass of the tokens ranked above it is < top_p. A token whose preceding mass is
    within float error of top_p may land on either side: `margin` is that error (the float32 warper's cumsum over
    the whole vocabulary: ~1e-5; ours: ~1e-7). Returns the post-sampler mass (relative to the kept set) and the
    raw mass of the disputed tokens, which bound how far the two distributions can differ.
    """
    assert s.top_p < 1.0, "only top-p has a rounding-dependent boundary"
    lo, hi = sorted((ours, theirs))
    before_cut = _warpers(x, replace(s, top_p=1.0), exact=True)  # temperature + top-k, no top-p
    probs, order = torch.sort(before_cut, descending=True, stable=True)
    preceding = torch.cumsum(probs, 0) - probs  # [V] float64 mass before each rank
    assert bool(((preceding[lo:hi] - s.top_p).abs() < margin).all()), "kept counts differ away from the boundary"
    raw = torch.softmax(x.double(), -1)[order]
    return float(probs[lo:hi].sum() / probs[:lo].sum()), float(raw[lo:hi].sum())


def check_against_oracle(x: torch.Tensor, s: SamplerSettings, top_n: int = 10, seed: int = 0) -> Selection:
    """Every field of one `select` against the warpers and torch, on scores without ties."""
    sel = select(x, s, gen(seed), top_n)
    x = x.reshape(-1).float()
    ref = _warpers(x, s, exact=True)
    ref32 = _warpers(x, s)
    raw = torch.softmax(x.double(), dim=-1)
    ids = torch.tensor(sel.top_ids, dtype=torch.long)
    n = min(top_n, x.numel())

    # the kept set: tokens with a non-zero post-sampler probability (in float32: far tails underflow to 0)
    kept = ref.float() > 0
    slack = raw_slack = 0.0
    if sel.kept_count != int(kept.sum()):
        slack, raw_slack = _knife_edge(x, s, sel.kept_count, int(kept.sum()), margin=1e-6)
    if sel.kept_count != int((ref32 > 0).sum()):
        _knife_edge(x, s, sel.kept_count, int((ref32 > 0).sum()), margin=2e-4)
    tol = PROB_TOL + slack
    assert sel.kept_mass == pytest.approx(float(raw[kept].sum()), abs=2 * PROB_TOL + raw_slack)

    # top-K by raw score, descending, with their raw and post-sampler probabilities
    assert len(sel.top_ids) == n and len(set(sel.top_ids)) == n
    assert torch.equal(x[ids], torch.sort(x, descending=True).values[:n])
    assert torch.allclose(torch.tensor(sel.top_raw_probs, dtype=torch.float64), raw[ids], rtol=0, atol=PROB_TOL)
    assert torch.allclose(torch.tensor(sel.top_sampled_probs, dtype=torch.float64), ref[ids], rtol=0, atol=tol)
    assert torch.allclose(torch.tensor(sel.top_sampled_probs), ref32[ids], rtol=5e-5, atol=tol)

    # the chosen token: never a cut one; its rank and probabilities by direct computation
    t = sel.token_id
    assert sel.chosen_rank == int((x > x[t]).sum())
    assert ref[t] > 0 or (slack and sel.chosen_rank < sel.kept_count)
    assert sel.chosen_raw_prob == pytest.approx(float(raw[t]), abs=PROB_TOL)
    assert sel.chosen_prob == pytest.approx(float(ref[t]), abs=tol)

    # entropies, in bits, against float64
    assert sel.entropy_bits == pytest.approx(_entropy_bits(raw), rel=1e-5, abs=1e-5)
    assert sel.sampled_entropy_bits == pytest.approx(_entropy_bits(ref), rel=1e-5, abs=1e-5 + 50 * slack)
    assert sel.greedy is False
    return sel


def scores(kind: str, vocab: int, seed: int) -> torch.Tensor:
    g = gen(seed)
    x = torch.randn(vocab, generator=g)
    if kind == "normal":
        return x * 3
    if kind == "flat":  # the nucleus is most of the vocabulary: the fast path must widen, then fall back
        return x * 0.01
    if kind == "peaked":
        x = x * 2
        x[int(torch.randint(vocab, (1,), generator=g))] += 12.0
        return x
    raise ValueError(kind)


GRID = list(itertools.product([0.1, 0.7, 1.0, 1.5], [0, 1, 5, 50], [0.05, 0.5, 0.9, 1.0]))


@pytest.mark.parametrize("kind", ["normal", "flat", "peaked"])
def test_matches_warpers_on_the_full_grid_small_vocab(kind):
    x = scores(kind, 1000, seed=1)
    for i, (t, k, p) in enumerate(GRID):
        check_against_oracle(x, sampler(t, k, p), seed=i)


def test_matches_warpers_on_the_full_grid_49152():
    x = scores("normal", 49152, seed=2)
    for i, (t, k, p) in enumerate(GRID):
        check_against_oracle(x, sampler(t, k, p), seed=i)


@pytest.mark.parametrize(
    "kind, t, k, p",
    [
        ("normal", 0.7, 0, 0.9),  # the defaults: nucleus of a few hundred
        ("normal", 1.0, 0, 0.9),  # nucleus of thousands
        ("normal", 1.5, 0, 0.5),
        ("normal", 0.1, 0, 0.9),
        ("normal", 0.7, 50, 0.9),
        ("normal", 1.5, 50, 1.0),
        ("normal", 1.0, 5, 0.05),
        ("normal", 1.0, 0, 1.0),  # nothing cut: the whole vocabulary
        ("normal", 0.7, 0, 1.0),
        ("flat", 1.0, 0, 0.9),  # widen, then fall back to a full sort
        ("peaked", 0.7, 0, 0.9),
        ("peaked", 1.5, 1, 0.9),
    ],
)
def test_matches_warpers_at_qwen_vocab(kind, t, k, p):
    check_against_oracle(scores(kind, 151936, seed=3), sampler(t, k, p))


def test_reference_probs_is_the_warpers():
    x = scores("normal", 1000, seed=4)
    for t, k, p in GRID[::5]:
        assert torch.equal(reference_probs(x, sampler(t, k, p)), _warpers(x, sampler(t, k, p)))
    one_hot = reference_probs(x, sampler(greedy=True))
    assert one_hot.sum() == 1 and one_hot[x.argmax()] == 1


def test_tiny_top_p_keeps_the_top_token():
    x = scores("normal", 5000, seed=5)
    for t in (0.3, 1.0, 2.0):
        sel = check_against_oracle(x, sampler(t, 0, 1e-9))
        assert sel.kept_count == 1 and sel.token_id == int(x.argmax()) and sel.chosen_prob == 1.0


def test_top_k_ties_at_the_boundary_are_all_kept():
    # 3 clear leaders, then 300 scores tied exactly at the 4th place: top-k=5 keeps all 303 (more than the first
    # prefix holds, so the fast path has to count the ties and widen).
    g = gen(6)
    x = torch.randn(2000, generator=g) - 10.0
    x[:3] = torch.tensor([5.0, 4.5, 4.0])
    tied = torch.randperm(1997, generator=g)[:300] + 3
    x[tied] = 1.0
    for t, p in [(1.0, 1.0), (0.7, 1.0), (1.3, 0.999)]:
        s = sampler(t, 5, p)
        ref = _warpers(x, s)
        sel = select(x, s, gen(1), 10)
        assert sel.kept_count == int((ref > 0).sum()) == 303
        assert ref[sel.token_id] > 0
        assert sel.chosen_prob == pytest.approx(float(ref[sel.token_id]), abs=PROB_TOL)
        assert torch.allclose(torch.tensor(sel.top_sampled_probs), ref[sel.top_ids], atol=PROB_TOL)
        assert sel.kept_mass == pytest.approx(float(torch.softmax(x.double(), -1)[ref > 0].sum()), abs=2e-6)


def test_top_k_ties_under_temperature_match_the_warper():
    x = torch.tensor([3.0, 2.0, 2.0, 2.0, 1.0, 1.0, 0.0, -1.0])
    for t, k in itertools.product([0.5, 1.0, 2.0], [1, 2, 3, 4, 5]):
        s = sampler(t, k, 1.0)
        ref = _warpers(x, s)
        sel = select(x, s, gen(k), 8)
        assert sel.kept_count == int((ref > 0).sum())
        got = torch.zeros(8)
        got[sel.top_ids] = torch.tensor(sel.top_sampled_probs)
        assert torch.allclose(got, ref, atol=PROB_TOL)


def test_top_p_ties_match_the_warper_up_to_which_tied_token_is_kept():
    # Ties straddling the top-p boundary: the warper keeps some of them, in its sort's order. The count and the
    # probabilities match; which of the tied ids are kept is the sort's arbitrary choice.
    x = torch.cat([torch.tensor([4.0]), torch.full((40,), 2.0), torch.randn(500, generator=gen(7)) - 6.0])
    for p in (0.3, 0.5, 0.8):
        s = sampler(1.0, 0, p)
        ref = _warpers(x, s)
        sel = select(x, s, gen(2), 50)
        assert sel.kept_count == int((ref > 0).sum())
        assert 1 < sel.kept_count < 41
        ours = sorted((q for q in sel.top_sampled_probs if q > 0), reverse=True)
        theirs = sorted(ref[ref > 0].tolist(), reverse=True)
        assert ours == pytest.approx(theirs, abs=PROB_TOL)
        assert x[sel.token_id] >= 2.0


def test_temperature_near_zero_samples_the_argmax():
    x = scores("normal", 10000, seed=8)
    top = int(x.argmax())
    for seed in range(20):
        sel = select(x, sampler(1e-4, 0, 1.0), gen(seed))
        assert sel.token_id == top and sel.kept_count == 1 and sel.chosen_prob == 1.0
        assert select(x, sampler(1e-4, 0, 0.9), gen(seed)).token_id == top


def test_greedy_is_torch_argmax():
    x = scores("normal", 151936, seed=9)
    for s in (sampler(greedy=True), sampler(temperature=0.0), sampler(1.5, 3, 0.2, greedy=True)):
        sel = select(x, s, gen(0), 10)
        raw = torch.softmax(x.double(), -1)
        assert sel.token_id == int(torch.argmax(x))
        assert sel.greedy is True and sel.chosen_rank == 0 and sel.chosen_prob == 1.0
        assert sel.kept_count == 1 and sel.sampled_entropy_bits == 0.0
        assert sel.chosen_raw_prob == pytest.approx(float(raw[sel.token_id]), abs=PROB_TOL)
        assert sel.kept_mass == pytest.approx(float(raw[sel.token_id]), abs=PROB_TOL)
        assert sel.top_ids == torch.sort(x, descending=True).indices[:10].tolist()
        assert sel.top_sampled_probs == [1.0] + [0.0] * 9
        assert sel.entropy_bits == pytest.approx(_entropy_bits(torch.softmax(x.double(), -1)), rel=1e-5)


def test_greedy_takes_the_first_of_tied_maxima():
    for ties in ([7, 3], [3, 7, 9], list(range(20, 60))):  # the last: more tied maxima than the topk holds
        x = torch.randn(100, generator=gen(10))
        x[ties] = 9.0
        assert select(x, sampler(greedy=True), None, 10).token_id == int(torch.argmax(x)) == min(ties)
        assert select(x, sampler(greedy=True), None, 1).token_id == min(ties)


@pytest.mark.parametrize("vocab", [151_936, 49_152, 16_384 + 7, 300])
@pytest.mark.parametrize("n", [1, 2, 10, 64])
def test_top_scores_are_torch_topk(vocab, n):
    for case in ("normal", "ties", "spikes"):
        x = torch.randn(vocab, generator=gen(vocab + n)) * 3.5
        if case == "ties":  # many equal scores around the n-th, spread over many blocks
            x = torch.round(x)
        elif case == "spikes":  # the winners crowded into one block, and into the ragged tail
            x[100:100 + n] = 50.0 + torch.arange(n, dtype=torch.float32)
            x[-3:] = 60.0
        values, ids = top_scores(x, n)
        expected = torch.topk(x, n).values
        assert torch.equal(values, expected), case
        assert torch.equal(x[ids], values) and len(set(ids.tolist())) == n, case


@pytest.mark.parametrize("vocab", [151_936, 49_152])
@pytest.mark.parametrize("k", [1, 64, 256, 400, 511, 512, 2_375, 6_000])
def test_top_prefix_is_torch_topk(vocab, k):
    for case in ("normal", "ties", "spikes", "sample-misses"):
        x = torch.randn(vocab, generator=gen(vocab + k)) * 3.5
        if case == "ties":  # many equal scores around the k-th
            x = torch.round(x)
        elif case == "spikes":  # the winners crowded into a few blocks, and at the very end
            x[100:100 + k // 2] = 50.0 + torch.arange(k // 2, dtype=torch.float32)
            x[-3:] = 60.0
        elif case == "sample-misses":  # winners only where the strided sample does not look: the fallback
            x = torch.zeros(vocab)
            x[1::16][:k] = 1.0 + torch.arange(min(k, x[1::16].numel()), dtype=torch.float32)
        values, ids = top_prefix(x, k)
        expected = torch.topk(x, k).values
        assert torch.equal(values, expected), case
        assert torch.equal(x[ids], values) and len(set(ids.tolist())) == k, case


def test_greedy_takes_the_first_of_tied_maxima_in_a_large_vocabulary():
    for ties in ([151_000, 5, 70_000], list(range(0, 151_936, 9_000)), [151_935, 151_934]):
        x = torch.randn(151_936, generator=gen(11))
        x[ties] = 20.0
        assert select(x, sampler(greedy=True), None, 10).token_id == int(torch.argmax(x)) == min(ties)


def test_greedy_matches_generate_without_sampling():
    # A tiny random Llama: generate(do_sample=False) against a loop of forward + select(greedy).
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    prompt = torch.tensor([[1, 17, 42, 99, 3]])
    with torch.no_grad():
        expected = model.generate(prompt, do_sample=False, max_new_tokens=12, pad_token_id=0, eos_token_id=None)
        ids = prompt
        for _ in range(12):
            logits = model(ids).logits[0, -1]
            token = select(logits, sampler(greedy=True), None).token_id
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    assert ids.tolist() == expected.tolist()


def test_top_n_larger_than_the_vocabulary():
    x = torch.tensor([0.5, 2.0, -1.0, 1.0, 0.0])
    for s in (sampler(1.0, 0, 1.0), sampler(0.7, 2, 0.9), sampler(greedy=True)):
        sel = select(x, s, gen(0), top_n=10)
        assert sel.top_ids == [1, 3, 0, 4, 2]
        assert len(sel.top_raw_probs) == len(sel.top_sampled_probs) == 5
    check_against_oracle(x, sampler(1.0, 0, 1.0), top_n=10)
    check_against_oracle(x, sampler(0.7, 2, 0.9), top_n=10)
    for s in (sampler(1.0, 0, 1.0), sampler(0.7, 3, 0.5), sampler(greedy=True)):  # a vocabulary of one
        sel = select(torch.tensor([0.25]), s, gen(0), top_n=10)
        assert (sel.token_id, sel.top_ids, sel.kept_count, sel.chosen_prob) == (0, [0], 1, 1.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_scores(dtype):
    x = scores("normal", 49152, seed=11).to(dtype)
    for s in (sampler(0.7, 0, 0.9), sampler(1.0, 50, 1.0), sampler(1.0, 0, 1.0)):
        sel = check_against_oracle(x, s)
        again = select(x.float(), s, gen(0), 10)
        assert sel == again
    assert select(x, sampler(greedy=True), None).token_id == int(x.float().argmax())


def test_batch_of_one_shape_accepted():
    x = scores("normal", 1000, seed=12)
    s = sampler(0.8, 20, 0.9)
    assert select(x[None, :], s, gen(3)) == select(x, s, gen(3))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize(
    "s", [sampler(greedy=True), sampler(0.7, 0, 0.9), sampler(1.0, 40, 1.0), sampler(1.0, 0, 1.0), sampler(0.5, 0, 1.0)]
)
def test_non_finite_scores_raise(bad, s):
    x = scores("normal", 3000, seed=13)
    x[1234] = bad
    with pytest.raises(GenerationError, match="NaN/inf"):
        select(x, s, gen(0))
    with pytest.raises(GenerationError, match="NaN/inf"):
        select(torch.full((100,), float("nan")), s, gen(0))


def test_seeded_runs_are_reproducible():
    x = scores("normal", 2000, seed=14) * 0.3  # a wide nucleus: many possible tokens per draw
    s = sampler(1.0, 0, 0.95)

    def run(seed: int) -> list[int]:
        g = gen(seed)
        return [select(x, s, g).token_id for _ in range(200)]

    first = run(1234)
    assert len(set(first)) > 50
    assert run(1234) == first
    assert run(1235) != first


def test_sampling_frequencies_match_the_warpers():
    x = torch.tensor([2.0, 1.6, 1.2, 1.0, 0.5, 0.2, -1.0, -3.0])
    # top-k and top-p together (top-k keeps 6 of 8, top-p 5 of those), top-p alone, and nothing cut (the
    # whole-vocabulary path)
    for s, draws in ((sampler(0.8, 6, 0.9), 20_000), (sampler(1.3, 0, 0.8), 3_000), (sampler(1.0, 0, 1.0), 3_000)):
        ref = _warpers(x, s).double()
        g = gen(99)
        counts = torch.zeros(8, dtype=torch.float64)
        for _ in range(draws):
            counts[select(x, s, g, 8).token_id] += 1
        kept = ref > 0
        assert counts[~kept].sum() == 0, "a token cut by top-k / top-p was drawn"
        expected = ref[kept] * draws
        chi2 = float(((counts[kept] - expected) ** 2 / expected).sum())
        assert chi2 < 30.0, (s, chi2)  # df <= 7: p-value < 1e-4 only when the distribution is wrong
        sigma = torch.sqrt(ref * (1 - ref) / draws)
        assert bool(((counts / draws - ref).abs() <= 5 * sigma + 1e-12).all())


def test_the_exponential_race_matches_its_distribution():
    # race_index draws argmax(probs / noise) with per-id Exp(1) noise; check it draws each entry with its probability
    # and never one of probability 0.
    m = 5000
    probs = torch.zeros(m)
    heavy = torch.tensor([3, 700, 701, 2048, 4095, 4999])
    probs[heavy] = torch.tensor([0.25, 0.2, 0.15, 0.1, 0.1, 0.05])
    probs[torch.arange(1000, 1500)] = 0.15 / 500  # a spread-out tail across two blocks
    g = gen(5)
    draws = 10_000
    hits = torch.cat([race_index(probs, draw_noise(g, m, probs.device)) for _ in range(draws)])
    assert bool((probs[hits] > 0).all())
    groups = torch.cat([heavy, torch.tensor([-1])])
    observed = torch.tensor([float((hits == i).sum()) for i in heavy] + [float(((hits >= 1000) & (hits < 1500)).sum())])
    expected = torch.tensor([0.25, 0.2, 0.15, 0.1, 0.1, 0.05, 0.15]) * draws
    assert len(groups) == len(observed)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 30.0, chi2
    assert torch.equal(race_index(probs, draw_noise(gen(8), m, probs.device)),
                       race_index(probs, draw_noise(gen(8), m, probs.device)))


@pytest.mark.parametrize("vocab", [49_152, 151_936, 300])
def test_a_prefix_noise_is_the_whole_draws_noise_at_its_ids(vocab):
    # select() takes the logarithms of a prefix's uniforms only: the same noise, bit for bit, as the whole
    # vocabulary's draw (which the compiled whole step uses) at those ids, so both race to the same token.
    whole = draw_noise(gen(3), vocab, torch.device("cpu"))
    uniforms = draw_uniforms(gen(3), vocab, torch.device("cpu"))
    ids = torch.randperm(vocab, generator=gen(4))[:257]
    assert torch.equal(exp_noise(uniforms.index_select(0, ids)), whole.index_select(0, ids))
    assert torch.equal(exp_noise(uniforms.clone()), whole)
    assert bool((whole > 0).all()) and torch.isfinite(whole).all()
