"""tokentui's AVX2 4-bit kernel (core/model/native/q4_native.py, core/model/native/q4_avx2.cpp) against F.linear on the
file's de-quantized weights in float64: equal up to float32 summation, for every block type, tile and tail of rows;
the same bits at any thread count; the packed layout as its comment says; an opaque op under torch.compile; and the
kernel choice (TOKENTUI_INT4_KERNEL, the fall-back when it cannot be built)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tokentui.core.model.quant.gguf_quant import GROUP, GroupedInt4, read_blocks
from tokentui.core.model.quant.int4_kernel import TorchInt4
from tokentui.core.model.native.q4_native import NativeQ4, NativeQ4I16, pack_values
from tokentui.core.model.quant.qlinear import KERNEL_ENV, KERNELS, QLinear, QLMHead, chosen_kernel
from test_gguf_quant import COLS, ROWS, gguf_weights, raw_blocks
from test_qlinear import matrix

NATIVE = KERNELS[NativeQ4.name]
needs_native = pytest.mark.skipif(NativeQ4.unavailable() is not None,
                                  reason=f"tokentui's AVX2 kernel: {NativeQ4.unavailable()}")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def f32_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float32 sums of K products: at most ~K u sum |x||w| (u = 2^-24), with room for the scale's own rounding."""
    return 2.0 * x.shape[-1] * 2.0 ** -24 * (x.abs().double() @ w.abs().double().t()) + 1e-7


def test_the_packed_layout_is_the_one_its_comment_gives():
    q = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    packed = pack_values(q)
    assert packed.shape == (3, 32) and packed.dtype == torch.uint8
    words = packed.view(torch.int32).view(3, 2, 4).to(torch.int64) & 0xFFFFFFFF  # [N, G, word j]
    for n in range(3):
        for g in range(2):
            for j in range(4):
                for p in range(8):
                    k = GROUP * g + 8 * (p % 4) + j + 4 * (p // 4)
                    assert (int(words[n, g, j]) >> (4 * p)) & 0xF == int(q[n, k])


def file_matrix(kind: str, seed: int, rows: int = 40):
    """(the first `rows` rows of a `kind` matrix as GroupedInt4, gguf-py's de-quantization of them: the oracle)."""
    raw = raw_blocks(kind, seed)
    m = read_blocks(kind, raw, ROWS, COLS)
    part = GroupedInt4(m.q[:rows], m.scale[:rows], m.zero[:rows], m.source, m.halves)
    return part, gguf_weights(kind, raw)[:rows]


@needs_native
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K", "Q8_0"])
@pytest.mark.parametrize("rows_of_x", [1, 3, 4, 9, 16, 37])
def test_the_product_is_the_files_weights_times_x_in_float32(kind, rows_of_x):
    m, w = file_matrix(kind, seed=rows_of_x)  # 40 rows: not a multiple of the kernel's 16-row chunks
    layer = QLinear.from_matrix(m, kernel=NATIVE)
    # 1, 3: single rows; 4: one tile of four; 9: two tiles and a tail; 16, 37: a prefill's de-quantized blocks
    x = torch.randn(rows_of_x, m.in_features)
    exact = F.linear(x.double(), w.double())
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (rows_of_x, m.out_features)
    assert ((got.double() - exact).abs() <= f32_bound(x, w)).all()
    if kind == "Q8_0":  # the file's int8 values put back together: one byte a weight, one product
        assert layer.packed.dtype == torch.int8 and tuple(layer.packed.shape) == (40, m.in_features)


@needs_native
@pytest.mark.skipif(not TorchInt4.available(), reason="no torch int4 CPU kernel")
def test_it_is_closer_to_the_file_than_the_bfloat16_kernel():
    m, w = file_matrix("Q4_1", seed=5, rows=64)
    x = torch.randn(3, m.in_features)
    exact = F.linear(x.double(), w.double())
    ours = (QLinear.from_matrix(m, kernel=NATIVE)(x).double() - exact).abs().max()
    theirs = (QLinear.from_matrix(m, kernel=KERNELS[TorchInt4.name])(x).double() - exact).abs().max()
    assert theirs > 100 * ours  # so the float32 bound above tells the two apart


@needs_native
def test_the_same_bits_at_any_thread_count():
    m = matrix("Q4_1", rows=1024, cols=512, seed=3)
    layer = QLinear.from_matrix(m, kernel=NATIVE)
    x = torch.randn(5, m.in_features)
    one = layer(x)
    torch.set_num_threads(2)  # one_torch_thread puts it back
    assert torch.equal(layer(x), one)


@needs_native
def test_a_head_on_this_kernel_recomputes_nothing_and_ranks_as_float32():
    m = matrix("Q4_1", rows=2048, cols=256, seed=8)
    rows = torch.nn.Parameter(m.dequantize(), requires_grad=False)
    head = QLMHead.from_matrix(m, weight=rows, kernel=NATIVE)
    assert head.exact_scores == 0
    x = torch.randn(2, 1, 256)
    got, exact = head(x), F.linear(x.double(), rows.double())
    assert ((got.double() - exact).abs() <= f32_bound(x, rows)).all()
    assert torch.equal(got[:, 0].topk(10).indices, exact[:, 0].topk(10).indices)


@needs_native
def test_bad_operands_are_refused_by_the_op():
    m = matrix("Q4_1", rows=16, cols=64)
    packed, dm = NATIVE.pack(m)
    with pytest.raises(RuntimeError, match="float32"):
        NATIVE.mm(torch.randn(1, 64, dtype=torch.bfloat16), packed, dm)
    with pytest.raises(RuntimeError, match="K / 2"):
        NATIVE.mm(torch.randn(1, 96), packed, dm)


@needs_native
def test_it_is_one_opaque_op_under_torch_compile():
    m = matrix("Q4_1", rows=64, cols=128, seed=2)
    layer = QLinear.from_matrix(m, kernel=NATIVE)
    x = torch.randn(1, 128)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)  # its shape function, no graph break
    assert torch.equal(compiled(x), layer(x))


def test_the_kernel_can_be_named_and_a_bad_name_is_one_line(monkeypatch):
    monkeypatch.setenv(KERNEL_ENV, TorchInt4.name)
    assert chosen_kernel() is KERNELS[TorchInt4.name]
    monkeypatch.setenv(KERNEL_ENV, "fastest")
    with pytest.raises(ValueError, match=r"TOKENTUI_INT4_KERNEL='fastest': expected one of torch-int4, avx2-fp32"):
        chosen_kernel()
    monkeypatch.delenv(KERNEL_ENV)
    want = NativeQ4I16.name if (torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
                             and NativeQ4.unavailable() is None) else TorchInt4.name
    assert chosen_kernel().name == want


def test_without_a_compiler_it_says_why_and_torch_kernel_is_used(tmp_path):
    script = ("from tokentui.core.model.native.q4_native import NativeQ4\n"
              "from tokentui.core.model.quant.qlinear import chosen_kernel\n"
              "print(NativeQ4.unavailable()); print(chosen_kernel().name)\n")
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "TOKENTUI_CACHE_DIR": str(tmp_path)}
    env.pop(KERNEL_ENV, None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    why, name = done.stdout.strip().splitlines()
    if "no AVX2" not in why:
        assert why.startswith("could not build it:") and "no-such-compiler" in why
    assert name == TorchInt4.name and not list(tmp_path.glob("kernels/*.so"))


def test_a_bad_kernel_name_stops_the_command_in_one_line():
    from cli_run import one_line_error, tokentui

    result = tokentui("--headless", "--max-new-tokens", "1", env_extra={KERNEL_ENV: "fastest"}, timeout=300)
    one_line_error(result, f"{KERNEL_ENV}='fastest': expected one of torch-int4, avx2-fp32", code=2)
