"""The 4-bit linear modules (core/model/quant/qlinear.py) against F.linear on the same weights: with torch's int4 kernel
within the bfloat16 rounding it is documented to do (tokentui's AVX2 kernel: tests/unit/test_q4_native.py), fused
siblings equal to the separate products, and the LM head's highest scores exactly the float32 product; the
structural tests run for every kernel available here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tokentui.core.model.quant.gguf_quant import BF16_ROUNDOFF, GROUP, read_blocks
from tokentui.core.model.quant.int4_kernel import TorchInt4
from tokentui.core.model.native.q4_native import NativeQ4
from tokentui.core.model.quant.qlinear import (
    EXACT_SCORES, KERNELS, FusedQLinear, QLinear, QLMHead, kernel_available, quantized_nbytes, quantized_parameters,
)
from test_gguf_quant import raw_blocks

pytestmark = [pytest.mark.skipif(not kernel_available(), reason="no int4 CPU kernel in this torch"),
              pytest.mark.usefixtures("one_torch_thread")]
TORCH = KERNELS[TorchInt4.name]
HERE = [k for k in KERNELS.values() if (TorchInt4.available() if k is TORCH else NativeQ4.unavailable() is None)]
torch_only = pytest.mark.skipif(not TorchInt4.available(), reason="no torch int4 CPU kernel")


@pytest.fixture(params=HERE, ids=lambda k: k.name)
def kernel(request):
    return request.param


def matrix(kind="Q4_1", rows=64, cols=512, seed=0):
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    return read_blocks(kind, quants.quantize(weights, GGMLQuantizationType[kind]), rows, cols)


def bound(x: torch.Tensor, m, y_exact: torch.Tensor) -> torch.Tensor:
    """|kernel - F.linear(x, W)| can be at most: activations rounded to bf16 (u sum |x||w|), the scales' rounding
    (sum |x| * the per-weight bound) and the output's rounding to bf16 (u |y|), u = 2^-8; plus float32 sums."""
    w = m.dequantize().abs()
    per_weight = m.scale_bound().repeat_interleave(GROUP, dim=1)
    if m.halves:
        per_weight = per_weight[:, :m.in_features] + per_weight[:, m.in_features:]
    activations = BF16_ROUNDOFF * (x.abs() @ w.t())
    scales = x.abs() @ per_weight.t()
    return activations + scales + BF16_ROUNDOFF * 1.01 * (y_exact.abs() + activations + scales) + 1e-5


@torch_only
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_qlinear_equals_f_linear_within_the_bf16_bound(kind):
    m = matrix(kind)
    layer = QLinear.from_matrix(m, kernel=TORCH)
    x = torch.randn(5, m.in_features)
    exact = F.linear(x.double(), m.dequantize().double()).float()
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (5, m.out_features)
    assert ((got - exact).abs() <= bound(x, m, exact)).all()
    # the rounding is really there (a test that could not tell bf16 from fp32 would prove nothing)
    assert not torch.allclose(got, exact, rtol=0, atol=1e-6)


@torch_only
def test_the_kernel_multiplies_the_bf16_rounded_weights():
    m = matrix("Q4_1", seed=4)
    layer = QLinear.from_matrix(m, kernel=TORCH)
    x = torch.randn(3, m.in_features).to(torch.bfloat16).float()  # already bf16: no activation rounding
    reference = F.linear(x.double(), m.dequantize(torch.bfloat16).double())
    # only the output's rounding to bfloat16 (and float32 sums) remain
    assert ((layer(x).double() - reference).abs() <= BF16_ROUNDOFF * reference.abs() + 1e-5).all()


def test_leading_dimensions_and_bias(kernel):
    m = matrix()
    bias = torch.randn(m.out_features)
    layer = QLinear.from_matrix(m, bias=bias, kernel=kernel)
    x = torch.randn(2, 3, m.in_features)
    want = (QLinear.from_matrix(m, kernel=kernel)(x.reshape(6, -1)) + bias).reshape(2, 3, -1)
    assert torch.equal(layer(x), want)


def count_kernel_calls(fn) -> int:
    calls = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("_weight_int4pack_mm_for_cpu", "q4_linear", "q4_linear_i16"):
                calls.append(1)
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return len(calls)


def test_fused_parts_equal_the_separate_products_from_one_kernel_call(kernel):
    q, k, v = matrix(rows=128, seed=1), matrix(rows=64, seed=2), matrix(rows=64, seed=3)
    fused = FusedQLinear.from_matrices([q, k, v], kernel)
    parts = fused.parts([None, torch.randn(64), None])
    x = torch.randn(1, 4, q.in_features)
    one = [QLinear.from_matrix(m, kernel=kernel) for m in (q, k, v)]
    separate = [one[0](x), one[1](x) + parts[1].bias, one[2](x)]
    outs = []
    assert count_kernel_calls(lambda: outs.extend(part(x) for part in parts)) == 1
    for got, want in zip(outs, separate):
        assert torch.equal(got, want)
    assert [p.out_features for p in parts] == [128, 64, 64]


def test_a_part_called_with_another_input_does_not_reuse_the_last_product(kernel):
    a, b = matrix(rows=64, seed=5), matrix(rows=64, seed=6)
    gate, up = FusedQLinear.from_matrices([a, b], kernel).parts()
    x1, x2 = torch.randn(1, a.in_features), torch.randn(1, a.in_features)
    gate(x1)
    assert torch.equal(up(x2), QLinear.from_matrix(b, kernel=kernel)(x2))
    assert torch.equal(gate(x2), QLinear.from_matrix(a, kernel=kernel)(x2))
    assert count_kernel_calls(lambda: (gate(x1), gate(x1))) == 2  # the same part twice: a new input each time


@torch_only
def test_the_heads_highest_scores_are_the_float32_product():
    vocab, hidden = 4096, 256
    m = matrix("Q8_0", rows=vocab, cols=hidden, seed=8)
    rows = torch.nn.Parameter(m.dequantize(), requires_grad=False)  # the file's de-quantized values
    head = QLMHead.from_matrix(m, weight=rows, kernel=TORCH)
    assert head.exact_scores == EXACT_SCORES
    x = torch.randn(3, 1, hidden)
    got = head(x)
    exact = F.linear(x, rows)
    approx = QLinear.from_matrix(m, kernel=TORCH)(x)
    for position in range(3):
        g, e, a = got[position, 0], exact[position, 0], approx[position, 0]
        # the kernel's scores are bfloat16: many tie at the EXACT_SCORES-th, and which of those are recomputed is
        # the top set's choice (the library's or torch's topk's)
        kth = a.topk(EXACT_SCORES).values.min()
        recomputed = torch.isclose(g, e, rtol=1e-6, atol=1e-6)
        assert recomputed[a > kth].all()  # every score above the edge is the float32 product
        assert torch.equal(g[a < kth], a[a < kth])  # every score below it is the kernel's
        at_edge = a == kth
        assert (recomputed[at_edge] | (g[at_edge] == a[at_edge])).all()
        assert int(recomputed[a >= kth].sum()) >= EXACT_SCORES
        assert torch.equal(g.topk(10).indices, e.topk(10).indices)


def test_a_tied_head_shares_the_embedding_parameter(kernel):
    m = matrix("Q8_0", rows=512, cols=64, seed=9)
    embedding = torch.nn.Embedding(512, 64)
    embedding.weight.data = m.dequantize()
    head = QLMHead.from_matrix(m, kernel=kernel)
    assert head.tied and head.weight is None
    head.tie(embedding.weight)
    model = torch.nn.ModuleDict({"embed": embedding, "head": head})
    assert head.weight is embedding.weight and len(list(model.parameters())) == 1
    assert quantized_parameters(model) == 0  # the head's float rows are the embedding, counted there
    assert quantized_nbytes(model) == head.packed.nbytes + head.scale_zeros.nbytes
    with pytest.raises(ValueError, match="float32"):
        head.tie(torch.nn.Parameter(torch.zeros(512, 64, dtype=torch.bfloat16)))


def test_parameter_count_covers_the_four_bit_matrices(kernel):
    a, b, c = matrix(rows=64, seed=1), matrix(rows=32, seed=2), matrix(rows=16, cols=64, seed=3)
    fused = FusedQLinear.from_matrices([a, b], kernel)
    model = torch.nn.ModuleDict({"fused": fused, "a": fused.parts()[0], "c": QLinear.from_matrix(c, kernel=kernel)})
    assert quantized_parameters(model) == 96 * 512 + 16 * 64
