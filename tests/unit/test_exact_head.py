"""The LM head's exact scores in one call (core/model/native/exact_head.cpp, op tokentui_q4::exact_top, used by
QLMHead): the `count` highest scores of each row recomputed from the float32 rows, in place; the oracle is the same
product in float64 (torch), rounded to float32, on the top set torch's topk picks."""

from __future__ import annotations

import pytest
import torch

from tokentui.core.model.native.q4_native import load

pytestmark = pytest.mark.skipif(load(lambda _progress: None) is not None, reason="tokentui's library does not build")


def exact_top(scores, x, weight, bias, count):
    torch.ops.tokentui_q4.exact_top(scores, x, weight, bias, count)


def reference(scores, x, weight, bias, count):
    """Torch's version, every product and sum in float64 then rounded once (as the library's)."""
    out = scores.clone()
    for m in range(scores.shape[0]):
        top = scores[m].topk(min(count, scores.shape[1])).indices if count else torch.empty(0, dtype=torch.long)
        exact = weight.double()[top] @ x[m].double()
        if bias is not None:
            exact = exact + bias.double()[top]
        out[m, top] = exact.float()
    return out


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("count", [1, 64, 256, 700])
def test_the_highest_scores_are_recomputed_and_the_rest_left(with_bias, count):
    g = torch.Generator().manual_seed(count)
    vocab, hidden = 5000, 96  # 5000 = 78 blocks of 64 and a tail of 8
    weight = torch.randn(vocab, hidden, generator=g)
    x = torch.randn(3, hidden, generator=g)
    bias = torch.randn(vocab, generator=g) if with_bias else None
    scores = (x @ weight.T) + torch.randn(3, vocab, generator=g) * 0.05  # a kernel's rounding, roughly
    scores[1, -3:] += 100.0  # the best scores in the tail block
    want = reference(scores, x, weight, bias, count)
    got = scores.clone()
    exact_top(got, x, weight, bias, count)
    torch.testing.assert_close(got, want, rtol=1.5e-7, atol=1e-6)
    changed = (got != scores).sum(dim=1)
    assert (changed <= count).all() and (changed >= count - 2).all()  # a recomputed score can land on its old value


def test_every_score_or_none():
    g = torch.Generator().manual_seed(1)
    weight, x = torch.randn(300, 40, generator=g), torch.randn(2, 40, generator=g)
    scores = torch.randn(2, 300, generator=g)
    everything = scores.clone()
    exact_top(everything, x, weight, None, 300)
    torch.testing.assert_close(everything, (x.double() @ weight.double().T).float(), rtol=1.5e-7, atol=1e-6)
    untouched = scores.clone()
    exact_top(untouched, x, weight, None, 0)
    assert torch.equal(untouched, scores)


def test_ties_at_the_edge_recompute_exactly_count_and_everything_above_it():
    g = torch.Generator().manual_seed(2)
    weight, x = torch.randn(4096, 64, generator=g), torch.randn(1, 64, generator=g)
    scores = (x @ weight.T).to(torch.bfloat16).float()  # torch's int4 kernel's scores: bfloat16, many equal
    got = scores.clone()
    exact_top(got, x, weight, None, 256)
    exact = (x.double() @ weight.double().T).float()
    kth = scores[0].topk(256).values.min()
    recomputed = got[0] == exact[0]
    assert recomputed[scores[0] > kth].all()
    assert torch.equal(got[0, scores[0] < kth], scores[0, scores[0] < kth])
    assert int(recomputed.sum()) >= 256 - 2 and int((got[0] != scores[0]).sum()) <= 256


def test_a_nan_score_is_never_picked():
    g = torch.Generator().manual_seed(3)
    weight, x = torch.randn(1000, 32, generator=g), torch.randn(1, 32, generator=g)
    scores = torch.randn(1, 1000, generator=g)
    scores[0, 10] = float("nan")
    got = scores.clone()
    exact_top(got, x, weight, None, 5)
    assert torch.isnan(got[0, 10])
    clean = scores.clone()
    clean[0, 10] = -float("inf")
    torch.testing.assert_close(got[:, torch.arange(1000) != 10],
                               reference(clean, x, weight, None, 5)[:, torch.arange(1000) != 10],
                               rtol=1.5e-7, atol=1e-6)


def test_wrong_shapes_are_refused():
    weight, x = torch.randn(100, 16), torch.randn(1, 16)
    with pytest.raises(RuntimeError, match="weight"):
        exact_top(torch.randn(1, 99), x, weight, None, 4)
    with pytest.raises(RuntimeError, match="x"):
        exact_top(torch.randn(1, 100), torch.randn(2, 16), weight, None, 4)
    with pytest.raises(RuntimeError, match="bias"):
        exact_top(torch.randn(1, 100), x, weight, torch.randn(50), 4)
