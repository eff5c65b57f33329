"""tokentui's int16 4-bit kernel ("avx2-int16", core/model/native/q4_native.py, core/model/native/i16_kernels.h): the
activations rounded to int16 with a float32 scale per group of 32, the file's weights multiplied as integers. Against
F.linear on the file's de-quantized weights in float64: within the rounding's own bound (each activation within half
a step of its group's scale) for every block type, tile and tail of rows, exact float32 for a prefill's rows; far
closer than torch's bfloat16 kernel; the same bits at any thread count; the layout its comment gives; an opaque op
under torch.compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from test_q4_native import f32_bound, file_matrix, needs_native
from test_qlinear import matrix
from tokentui.core.model.quant.gguf_quant import GROUP
from tokentui.core.model.quant.int4_kernel import TorchInt4
from tokentui.core.model.native.q4_native import NativeQ4, NativeQ4I16, pack_values_i16
from tokentui.core.model.quant.qlinear import KERNELS, QLinear, QLMHead

INT16 = KERNELS[NativeQ4I16.name]
pytestmark = [needs_native, pytest.mark.usefixtures("one_torch_thread")]


def rounding_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """|x w^T - x16 sx w^T| per output: each activation within sx / 2 of x, sx = its group's max |x| / 32767."""
    groups = x.double().abs().view(*x.shape[:-1], -1, GROUP).amax(-1) / 32767  # [M, G]
    half_step = (groups / 2).repeat_interleave(GROUP, dim=-1)  # [M, K]
    return half_step @ w.abs().double().t() * (1 + 1e-5)


def test_the_packed_layout_is_the_one_its_comment_gives():
    q = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    packed = pack_values_i16(q)
    assert packed.shape == (3, 32) and packed.dtype == torch.uint8
    for n in range(3):
        for g in range(2):
            for j in range(16):
                byte = int(packed[n, 16 * g + j])
                assert byte & 0xF == int(q[n, 32 * g + j]) and byte >> 4 == int(q[n, 32 * g + 16 + j])


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K", "Q8_0"])
@pytest.mark.parametrize("rows_of_x", [1, 3, 4, 9, 16, 37])
def test_the_product_is_the_files_weights_times_x_within_the_int16_rounding(kind, rows_of_x):
    m, w = file_matrix(kind, seed=rows_of_x)
    layer = QLinear.from_matrix(m, kernel=INT16)
    x = torch.randn(rows_of_x, m.in_features)
    x[0, :GROUP] *= 50  # a group with a large value: its scale is coarser, and the bound says by how much
    exact = F.linear(x.double(), w.double())
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (rows_of_x, m.out_features)
    error = (got.double() - exact).abs()
    if rows_of_x >= 16:  # a prefill's rows: the de-quantized weights through torch's float32 product
        assert (error <= f32_bound(x, w)).all()
    else:
        assert (error <= rounding_bound(x, w) + f32_bound(x, w)).all()
        # the rounding is real: far from the float32 kernel's own distance (not float32 in disguise)
        float32 = QLinear.from_matrix(m, kernel=KERNELS[NativeQ4.name])(x).double()
        assert float(error.max()) > 10 * float((float32 - exact).abs().max())
    if kind == "Q8_0":
        assert layer.packed.dtype == torch.int8 and tuple(layer.packed.shape) == (40, m.in_features)


@pytest.mark.skipif(not TorchInt4.available(), reason="no torch int4 CPU kernel")
def test_it_is_far_closer_to_the_file_than_the_bfloat16_kernel():
    m, w = file_matrix("Q4_1", seed=5, rows=64)
    x = torch.randn(3, m.in_features)
    exact = F.linear(x.double(), w.double())
    ours = (QLinear.from_matrix(m, kernel=INT16)(x).double() - exact).abs().max()
    theirs = (QLinear.from_matrix(m, kernel=KERNELS[TorchInt4.name])(x).double() - exact).abs().max()
    assert theirs > 20 * ours


def test_the_same_bits_at_any_thread_count():
    m = matrix("Q4_1", rows=1024, cols=512, seed=3)
    layer = QLinear.from_matrix(m, kernel=INT16)
    x = torch.randn(5, m.in_features)
    one = layer(x)
    torch.set_num_threads(2)  # one_torch_thread puts it back
    assert torch.equal(layer(x), one)


def test_a_head_on_this_kernel_scores_its_best_candidates_in_float32():
    m = matrix("Q4_1", rows=2048, cols=256, seed=8)
    rows = torch.nn.Parameter(m.dequantize(), requires_grad=False)
    head = QLMHead.from_matrix(m, weight=rows, kernel=INT16)
    assert head.exact_scores == 256
    x = torch.randn(2, 1, 256)
    got, exact = head(x), F.linear(x.double(), rows.double())
    top = exact[:, 0].topk(10).indices
    assert torch.equal(got[:, 0].topk(10).indices, top)
    assert (got[:, 0].gather(1, top).double() - exact[:, 0].gather(1, top)).abs().max() < 1e-5


def test_it_is_one_opaque_op_under_torch_compile():
    m = matrix("Q4_1", rows=64, cols=128, seed=2)
    layer = QLinear.from_matrix(m, kernel=INT16)
    x = torch.randn(1, 128)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), layer(x))


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_a_nan_or_an_infinity_in_the_activations_comes_out_non_finite(kind):
    """As float32's product would: a group holding one is not rounded into finite integers (selection's NaN / inf
    check reads the scores, core/steps/select.py)."""
    m, _ = file_matrix(kind, seed=4)
    layer = QLinear.from_matrix(m, kernel=INT16)
    for bad in (float("nan"), float("inf")):
        x = torch.randn(3, m.in_features)
        x[1, 40] = bad
        y = layer(x)
        assert not torch.isfinite(y[1]).any()
        assert torch.isfinite(y[0]).all() and torch.isfinite(y[2]).all()
