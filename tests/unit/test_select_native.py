"""Step 4 in one C++ call (core/model/native/select.cpp) against the torch path and torch's own random stream.

tests/unit/test_select.py runs every oracle test (transformers' warpers, float64 entropies) through both paths; this
file checks what is particular to the C++ call: it draws from the generator exactly what `uniform_` draws (values
and the state it leaves), it agrees with the torch path field by field over a grid of settings and score shapes,
and the cases its candidate search must get right (ties made by the temperature, underflow, a far outlier).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tokentui.core.errors import GenerationError
from tokentui.core.settings import SamplerSettings
from tokentui.core.steps.select import native_op, reference_probs, select

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(native_op() is None, reason="tokentui's native library does not build here")]

FIELDS_EXACT = ("token_id", "chosen_rank", "kept_count", "greedy", "top_k_kept", "top_p_kept")
FIELDS_FLOAT = ("chosen_raw_prob", "chosen_prob", "kept_mass", "entropy_bits", "sampled_entropy_bits",
                "temp_entropy_bits")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("vocab", [1, 7, 623, 624, 625, 1_249, 49_152])
@pytest.mark.parametrize("already", [0, 1, 5, 623, 624, 700])
def test_the_draw_is_uniform_s_stream_and_leaves_the_generator_where_uniform_would(vocab, already):
    # scores all equal at T = 1 and nothing cut: the race picks the smallest noise, i.e. the largest uniform
    x = torch.zeros(vocab)
    ours, theirs = gen(vocab + already), gen(vocab + already)
    torch.empty(already).uniform_(generator=ours)  # somewhere inside a block of the stream, or at its end
    torch.empty(already).uniform_(generator=theirs)
    token = select(x, SamplerSettings(temperature=1.0, top_p=1.0), ours, 3, native=True).token_id
    u = torch.empty(vocab).uniform_(generator=theirs)
    assert token == int(torch.nonzero(u == u.max())[0])
    assert torch.equal(ours.get_state(), theirs.get_state())
    # and the next draw of both continues the same stream
    assert torch.equal(torch.rand(5, generator=ours), torch.rand(5, generator=theirs))


def test_the_default_generator_is_used_when_none_is_given():
    x = torch.zeros(1000)
    torch.manual_seed(7)
    token = select(x, SamplerSettings(temperature=1.0, top_p=1.0), None, native=True).token_id
    torch.manual_seed(7)
    u = torch.empty(1000).uniform_()
    assert token == int(u.argmax())


def _scores(kind: str, vocab: int, seed: int) -> torch.Tensor:
    g = gen(seed)
    x = torch.randn(vocab, generator=g) * 3
    if kind == "flat":
        return x * 0.003
    if kind == "peaked":
        x[int(torch.randint(vocab, (1,), generator=g))] += 15.0
    if kind == "outlier":  # a model that pushes some tokens far down (finite): the histogram's span is capped
        x[: min(100, vocab // 4)] = -1e30
    if kind == "ties":  # whole groups of equal scores
        x = torch.round(x)
    return x


GRID = [s for s in (SamplerSettings(temperature=t, top_k=k, top_p=p) for t, k, p in
                    itertools.product([0.0, 0.1, 0.7, 1.0, 1.5], [0, 1, 5, 50], [0.05, 0.5, 0.9, 1.0]))
        if not (s.is_greedy and (s.top_k or s.top_p < 1.0))]


@pytest.mark.parametrize("kind", ["normal", "flat", "peaked", "outlier", "ties"])
@pytest.mark.parametrize("vocab", [40, 3_000, 49_152])
def test_the_call_reports_what_the_torch_path_reports(kind, vocab):
    x = _scores(kind, vocab, seed=vocab)
    for s in GRID:
        ours, theirs = gen(11), gen(11)
        a = select(x, s, ours, 10, native=True)
        b = select(x, s, theirs, 10, native=False)
        assert torch.equal(ours.get_state(), theirs.get_state()), s
        if kind == "ties":  # which of several equal scores is listed, or kept at the top-p boundary (and so can
            # be drawn), is left open by both paths and by the warpers
            assert x[a.top_ids].tolist() == x[b.top_ids].tolist() and a.kept_count == b.kept_count, s
            assert not s.is_greedy or a.token_id == b.token_id == int(x.argmax()), s
            continue
        for field in FIELDS_EXACT:
            assert getattr(a, field) == getattr(b, field), (s, field)
        for field in FIELDS_FLOAT:
            va, vb = getattr(a, field), getattr(b, field)
            assert (va is None) == (vb is None) and (va is None or abs(va - vb) < 1e-4), (s, field, va, vb)
        assert a.top_ids == b.top_ids, s
        assert torch.allclose(torch.tensor(a.top_raw_probs), torch.tensor(b.top_raw_probs), atol=1e-6), s
        assert torch.allclose(torch.tensor(a.top_sampled_probs), torch.tensor(b.top_sampled_probs), atol=1e-6), s


def test_a_tie_made_by_the_temperature_at_the_k_th_score_keeps_every_tied_token():
    # distinct raw scores that divide to the same float: TopKLogitsWarper (on scores / T) keeps them all
    base = torch.randn(5_000, generator=gen(2)) - 10.0
    near = torch.tensor(1.0).repeat(6)
    for i in range(1, 6):
        near[i] = torch.nextafter(near[i - 1], torch.tensor(0.0))
    x = torch.cat([base, near])
    s = SamplerSettings(temperature=3.0, top_k=3, top_p=1.0)
    assert len(set((near / 3.0).tolist())) < 6  # the premise: the division makes ties
    sel = select(x, s, gen(0), 10, native=True)
    ref = reference_probs(x, s)
    assert sel.top_k_kept == int((ref > 0).sum()) > 3
    assert sel.kept_count == int((ref > 0).sum())
    assert ref[sel.token_id] > 0


def test_probabilities_that_underflow_are_not_kept_as_in_the_warpers():
    # at a small temperature most of the vocabulary underflows to exactly 0 after the softmax
    x = torch.randn(20_000, generator=gen(3)) * 3
    s = SamplerSettings(temperature=0.05, top_p=1.0)
    sel = select(x, s, gen(1), 10, native=True)
    ref = reference_probs(x, s)
    assert sel.kept_count == int((ref > 0).sum()) < x.numel()
    assert ref[sel.token_id] > 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_scores_raise_and_the_draw_is_still_taken(bad):
    x = torch.randn(5_000, generator=gen(4))
    x[77] = bad
    ours, theirs = gen(5), gen(5)
    with pytest.raises(GenerationError, match="NaN/inf"):
        select(x, SamplerSettings(temperature=0.7, top_p=0.9), ours, native=True)
    with pytest.raises(GenerationError, match="NaN/inf"):
        select(x, SamplerSettings(temperature=0.7, top_p=0.9), theirs, native=False)
    assert torch.equal(ours.get_state(), theirs.get_state())


def test_scores_that_overflow_once_divided_by_the_temperature_raise():
    x = torch.tensor([3e38, 1.0, -3e38])
    with pytest.raises(GenerationError, match="NaN/inf"):
        select(x, SamplerSettings(temperature=0.5, top_p=0.9), gen(0), native=True)


def test_seeded_runs_pick_the_same_tokens_through_either_path():
    x = torch.randn(49_152, generator=gen(6)) * 0.4  # a wide nucleus: many tokens can be drawn each step
    s = SamplerSettings(temperature=0.9, top_p=0.95)
    ours, theirs = gen(99), gen(99)
    a = [select(x, s, ours, native=True).token_id for _ in range(100)]
    b = [select(x, s, theirs, native=False).token_id for _ in range(100)]
    assert a == b and len(set(a)) > 50


@pytest.mark.parametrize("top_k", [1, 5, 50, 300])
def test_scores_tied_by_a_bfloat16_head_keep_every_token_tied_at_the_k_th(top_k):
    # a bfloat16 head gives a few hundred distinct scores over a whole vocabulary: the k-th is tied with many more
    x = (torch.randn(49_152, generator=gen(top_k)) * 3).bfloat16().float()
    s = SamplerSettings(temperature=0.7, top_k=top_k, top_p=1.0)
    ref = reference_probs(x, s)
    ours, theirs = gen(1), gen(1)
    a = select(x, s, ours, 10, native=True)
    b = select(x, s, theirs, 10, native=False)
    assert a.top_k_kept == b.top_k_kept == a.kept_count == int((ref > 0).sum()) >= top_k
    assert a.token_id == b.token_id and ref[a.token_id] > 0  # the same kept set, the same noise: the same draw
    assert x[a.top_ids].tolist() == x[b.top_ids].tolist()
