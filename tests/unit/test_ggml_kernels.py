"""ggml's CPU kernels inside tokentui's library (core/model/native/ggml_ops.cpp) and the modules on them
(core/model/quant/ggml_linear.py), held to gguf-py's own quantizer and de-quantizer (an implementation of the formats
independent of ggml's C) and to float64 arithmetic: per format, the stored bytes de-quantize to exactly
gguf.dequantize's values; a product is the activations converted to the format's vec_dot_type (llama.cpp's table)
times the de-quantized matrix, to float32 rounding, and so within that 8-bit (or 16-bit) rounding of x W^T; an
embedding row is the de-quantized row. Skipped in one line where ggml's library cannot be had (failed under
TOKENTUI_REQUIRE_LLAMA_SERVER=1)."""

from __future__ import annotations

import contextlib
import os
import warnings

import gguf
import numpy as np
import pytest
import torch

from tokentui.core.model.native import ggml_build
from tokentui.core.model.quant import ggml_linear
from tokentui.core.model.quant.ggml_linear import GGMLEmbedding, GGMLLinear, GGMLMatrix

FORMATS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
# llama.cpp's activation format for each weight format (ggml-cpu.c's type_traits_cpu[...].vec_dot_type)
ACTIVATIONS = {"F32": "F32", "F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q4_0": "Q8_0", "Q4_1": "Q8_1",
               "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K"}
ROWS, COLS = 48, 512  # COLS: two K-quant blocks a row


def ggml_or_skip():
    """Bind ggml's library (the user's cached build, shared with the GGUF fixtures; $TOKENTUI_GGML_LIB as is), or
    skip with one line (fail under TOKENTUI_REQUIRE_LLAMA_SERVER=1)."""
    why = None
    try:
        try:
            from gguf_fixtures import ggml_library  # the build the GGUF fixtures use, in the user's cache
        except ImportError:
            ggml_library = ggml_build.library
        path = ggml_library()
    except ggml_build.GGMLUnavailable as exc:
        why = str(exc)
    else:
        os.environ[ggml_build.ENV_LIB] = str(path)  # what a model load in the same session then binds too
        why = ggml_linear.load(lambda _: None)
    if why is not None:
        if os.environ.get("TOKENTUI_REQUIRE_LLAMA_SERVER") == "1":
            pytest.fail(f"ggml's CPU library: {why}", pytrace=False)
        pytest.skip(f"ggml's CPU library: {why}")


@pytest.fixture(scope="module", autouse=True)
def ggml():
    with bound_ggml():
        yield


@contextlib.contextmanager
def bound_ggml():
    """ggml's library bound (`ggml_or_skip`) meanwhile, $TOKENTUI_GGML_LIB put back after."""
    saved = os.environ.get(ggml_build.ENV_LIB)
    try:
        ggml_or_skip()
        yield
    finally:
        if saved is None:
            os.environ.pop(ggml_build.ENV_LIB, None)
        else:
            os.environ[ggml_build.ENV_LIB] = saved


def values(rows: int = ROWS, cols: int = COLS, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g)  # rows of different scales


def gguf_bytes(w: torch.Tensor, fmt: str) -> torch.Tensor | None:
    """gguf-py's own quantization of w as [rows, row_bytes] uint8 (None where gguf-py has no quantizer)."""
    try:
        out = gguf.quantize(w.numpy(), gguf.GGMLQuantizationType[fmt])
    except NotImplementedError:
        return None
    return torch.from_numpy(np.ascontiguousarray(out).view(np.uint8).reshape(w.shape[0], -1))


def stored(w: torch.Tensor, fmt: str) -> GGMLMatrix:
    """w in format fmt: gguf-py's bytes where it quantizes the format, else ggml's reference quantization (the
    K-quants). gguf-py's bytes are copied into torch's memory (aligned, as a GGUF's tensors are: numpy's is only to
    16 bytes, which ggml's graph does not take: test_a_matrix_off_ggmls_alignment_prefills_through_the_product)."""
    raw = gguf_bytes(w, fmt)
    return GGMLMatrix(raw.clone(), fmt, *w.shape) if raw is not None else GGMLMatrix.quantize(w, fmt)


def gguf_values(raw: torch.Tensor, fmt: str) -> torch.Tensor:
    """gguf-py's de-quantization of the bytes, float32 [rows, cols]."""
    out = gguf.dequantize(raw.numpy(), gguf.GGMLQuantizationType[fmt])
    return torch.from_numpy(np.asarray(out, dtype=np.float32)).reshape(raw.shape[0], -1)


def activation_values(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x as a product sees it: converted by ggml's CPU conversion to the activation format of weight format fmt,
    read back (gguf-py for the formats it knows; Q8_1 and Q8_K, activation-only formats gguf-py lacks, by their
    block layouts in ggml-common.h)."""
    act = ACTIVATIONS[fmt]
    if act == "F32":
        return x.clone()
    raw = torch.ops.tokentui_ggml.quantize(x, int(gguf.GGMLQuantizationType[act]), True).numpy()
    if act in ("F16", "BF16", "Q8_0"):
        return gguf_values(torch.from_numpy(raw), act)
    rows = x.shape[0]
    if act == "Q8_1":  # block: f16 d, f16 s (= d * sum q), int8 q[32]
        d, q, _ = q8_1_blocks(raw, rows)
    else:  # Q8_K block: f32 d, int8 q[256], int16 bsums[16]
        blocks = raw.reshape(rows, -1, 292)
        d = blocks[..., 0:4].copy().view(np.float32)
        q = blocks[..., 4:260].view(np.int8).astype(np.float32)
    return torch.from_numpy((d * q).reshape(rows, -1))


def q8_1_blocks(raw: np.ndarray, rows: int):
    """Q8_1 bytes [rows, ...] -> d [rows, B, 1], q [rows, B, 32] float32, s [rows, B] float32 (stored as f16)."""
    blocks = raw.reshape(rows, -1, 36)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    s = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)[..., 0]
    return d, blocks[..., 4:].view(np.int8).astype(np.float32), s


def q4_1_sum_term(x: torch.Tensor, matrix: GGMLMatrix) -> torch.Tensor:
    """What Q4_1's dot product adds to converted x W^T [M, N]: with W = d q + m a block, it takes the block's
    m * sum x from Q8_1's s, stored as f16 (ggml's vec_dot_q4_1_q8_1), not from the sum of its values."""
    raw = torch.ops.tokentui_ggml.quantize(x, int(gguf.GGMLQuantizationType.Q8_1), True).numpy()
    d, q, s = q8_1_blocks(raw, x.shape[0])
    exact_sums = (d * q).sum(-1)  # [M, B]
    m = matrix.raw.numpy().reshape(matrix.rows, -1, 20)[..., 2:4].copy().view(np.float16).astype(np.float64)[..., 0]
    return torch.from_numpy((s.astype(np.float64) - exact_sums) @ m.T)  # [M, N]


def test_the_formats_it_runs_are_the_libraries():
    names = {gguf.GGMLQuantizationType(t).name for t in torch.ops.tokentui_ggml.types()}
    assert names == ggml_linear.RUNNABLE
    assert set(FORMATS) <= names


@pytest.mark.parametrize("fmt", FORMATS)
def test_stored_bytes_dequantize_to_ggufs_values_and_ggmls_quantizer_is_ggufs(fmt):
    w = values()
    matrix = stored(w, fmt)
    assert torch.equal(matrix.dequantize(), gguf_values(matrix.raw, fmt))
    theirs = gguf_bytes(w, fmt)
    if theirs is not None:  # ggml's reference quantizer writes gguf-py's bytes
        assert torch.equal(GGMLMatrix.quantize(w, fmt).raw, theirs)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_product_is_the_converted_activations_times_the_dequantized_matrix(fmt):
    matrix = stored(values(), fmt)
    wd = gguf_values(matrix.raw, fmt).double()
    x = values(5, COLS, seed=1)
    y = torch.ops.tokentui_ggml.product(x, matrix.raw, matrix.type).double()  # [5, ROWS]
    converted = activation_values(x, fmt).double()
    expected = converted @ wd.T + (q4_1_sum_term(x, matrix) if fmt == "Q4_1" else 0)
    scale = float(expected.abs().max())
    assert float((y - expected).abs().max()) <= 1e-5 * scale
    # so within the activations' rounding of x W^T: |(x - x') . w| <= |x - x'| . |w|, per output
    exact = x.double() @ wd.T
    rounding = (x.double() - converted).abs() @ wd.abs().T
    assert bool(((y - exact).abs() <= rounding + 1e-5 * scale).all())
    # and what it moves the outputs by is small: under 1% of the largest output for 8-bit activations (and
    # BF16's 8-bit mantissa), 0.1% for F16's 11 bits
    bound = {"F32": 1e-5, "F16": 1e-3}.get(fmt, 1e-2)
    assert float((y - exact).abs().max()) < bound * float(exact.abs().max())


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_are_the_dequantized_rows(fmt):
    matrix = stored(values(), fmt)
    ids = torch.tensor([[3, 0], [47, 3]])
    table = GGMLEmbedding(matrix)
    out = table(ids)
    assert out.shape == (2, 2, COLS) and out.dtype == torch.float32
    assert torch.equal(out.reshape(4, COLS), gguf_values(matrix.raw, fmt)[ids.reshape(-1)])
    assert torch.equal(table.weight, gguf_values(matrix.raw, fmt))
    assert (table.num_embeddings, table.embedding_dim) == (ROWS, COLS)


@pytest.mark.parametrize("fmt", ["Q8_0", "Q6_K", "Q5_K", "Q4_K", "BF16"])
def test_linear_decodes_through_the_product_and_prefills_through_llama_cpps_matrix_product(fmt):
    """A few rows through ggml's product; many (a prompt's) through llama.cpp's own matrix product (a ggml graph:
    mul_mat, below) for a matrix as stored, through ggml's gemm still for a repacked one (Q4_K), as llama.cpp's
    prefill runs each."""
    matrix = stored(values(), fmt)
    bias = torch.randn(ROWS)
    layer = GGMLLinear(matrix, bias)
    assert (layer.in_features, layer.out_features) == (COLS, ROWS)
    wd = gguf_values(matrix.raw, fmt)
    assert torch.equal(layer.weight, wd)
    few = values(ggml_linear.PRODUCT_ROWS, COLS, seed=2).view(2, -1, COLS)
    ops = torch.ops.tokentui_ggml
    product = ops.product(few.reshape(-1, COLS), matrix.raw, matrix.type) if layer.packed is None \
        else ops.packed_product(few.reshape(-1, COLS), layer.packed, matrix.type, COLS)  # Q4_K: repacked (below)
    assert torch.equal(layer(few), (product + bias).view(2, -1, ROWS))
    many = values(ggml_linear.PRODUCT_ROWS + 3, COLS, seed=3)
    if layer.packed is None:
        assert torch.equal(layer(many), ops.mul_mat(many, matrix.raw, matrix.type) + bias)
    else:
        assert torch.equal(layer(many), ops.packed_product(many, layer.packed, matrix.type, COLS) + bias)
    half = layer(few.to(torch.bfloat16))  # another dtype: cast in, the result cast back
    assert half.dtype == torch.bfloat16 and half.shape == (2, ggml_linear.PRODUCT_ROWS // 2, ROWS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_llama_cpps_matrix_product_rounds_the_activations_as_the_product_does(fmt):
    """mul_mat (a one-node ggml graph on ggml's CPU backend: its tiled kernels, tinyBLAS or vec_dot, by format) gives
    what the product gives, the activations rounded to the same vec_dot_type, up to float32 summation order; at 1
    and 2 threads, for a prompt of 37 rows (not a multiple of the kernels' tiles) as for 64, and from activations
    that start off a 32-byte boundary."""
    ops = torch.ops.tokentui_ggml
    matrix = stored(values(ROWS + 3, COLS, seed=12), fmt)  # 51 weight rows: not a multiple of a tile either
    assert ops.mul_mat_takes(matrix.raw)  # the pinned build has ggml's graph and CPU backend
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for rows in (37, 64):
                x = values(rows, COLS, seed=40 + rows)
                ours, theirs = ops.mul_mat(x, matrix.raw, matrix.type), ops.product(x, matrix.raw, matrix.type)
                assert ours.shape == (rows, ROWS + 3) and ours.dtype == torch.float32
                assert float((ours - theirs).abs().max()) <= 1e-5 * float(theirs.abs().max()), (count, rows)
                offset = torch.empty(x.numel() + 1)[1:].view(rows, COLS).copy_(x)  # 4 bytes past an aligned start
                assert torch.equal(ops.mul_mat(offset, matrix.raw, matrix.type), ours)
    finally:
        torch.set_num_threads(threads)


def test_a_matrix_off_ggmls_alignment_prefills_through_the_product():
    """ggml's buffers start on 32 bytes: mul_mat refuses a matrix that does not, in one line, and a GGMLLinear over
    one (a GGUF whose general.alignment is smaller) multiplies a prompt's rows by the product instead."""
    aligned = stored(values(), "Q6_K")
    bytes_ = torch.empty(aligned.raw.numel() + 8, dtype=torch.uint8)[8:].view(aligned.raw.shape).copy_(aligned.raw)
    ops = torch.ops.tokentui_ggml
    assert bytes_.data_ptr() % 32 != 0 and not ops.mul_mat_takes(bytes_) and ops.mul_mat_takes(aligned.raw)
    off = GGMLMatrix(bytes_, "Q6_K", ROWS, COLS)
    many = values(ggml_linear.PRODUCT_ROWS + 5, COLS, seed=6)
    with pytest.raises(RuntimeError, match="mul_mat: the matrix's bytes are not 32-byte aligned"):
        ops.mul_mat(many, off.raw, off.type)
    assert torch.equal(GGMLLinear(off, repack=False)(many), ops.product(many, off.raw, off.type))
    assert torch.equal(GGMLLinear(aligned, repack=False)(many), ops.mul_mat(many, aligned.raw, aligned.type))


def test_a_prompts_q8_0_rows_go_through_tinyblas_with_the_bits_of_one_row_at_a_time():
    """Q8_0 is the format whose products of 2 or more rows run through llamafile's tinyBLAS (ggml_ops.cpp), where the
    bound library exports it (the pinned build, which these tests bind, does): each output is the same float32 as
    that row's own product through vec_dot (one activation row), at 1 and 2 threads and for row counts that leave
    tinyBLAS's tiles short."""
    ops = torch.ops.tokentui_ggml
    q8 = int(gguf.GGMLQuantizationType.Q8_0)
    assert list(ops.sgemm_types()) == [q8]
    matrix = stored(values(ROWS + 3, COLS, seed=11), "Q8_0")  # 51 rows: tinyBLAS's tiles do not divide them
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for rows in (2, 3, 5, 37):
                x = values(rows, COLS, seed=30 + rows)
                one_at_a_time = torch.cat([ops.product(x[i:i + 1], matrix.raw, q8) for i in range(rows)])
                assert torch.equal(ops.product(x, matrix.raw, q8), one_at_a_time), (count, rows)
    finally:
        torch.set_num_threads(threads)


def test_take_rows_permutes_the_stored_rows_only():
    matrix = stored(values(), "Q4_K")
    order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(4))
    taken = matrix.take_rows(order)
    assert torch.equal(taken.dequantize(), matrix.dequantize()[order])
    with pytest.raises(ValueError, match="permutation"):
        matrix.take_rows(torch.zeros(ROWS, dtype=torch.long))


def test_a_gguf_files_tensor_is_wrapped_without_a_copy(tmp_path):
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    w = values(8, 64)
    q8 = gguf.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("q8", q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("f32", w.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the read-only memory map's warning is not let through
        q8m, f32m = GGMLMatrix.from_gguf_tensor(tensors["q8"]), GGMLMatrix.from_gguf_tensor(tensors["f32"])
    assert (q8m.type_name, q8m.rows, q8m.cols, f32m.type_name) == ("Q8_0", 8, 64, "F32")
    assert q8m.raw.data_ptr() == tensors["q8"].data.ctypes.data  # the file's bytes, not a copy
    assert torch.equal(q8m.dequantize(), gguf_values(q8m.raw, "Q8_0")) and torch.equal(f32m.dequantize(), w)


@pytest.mark.parametrize("raw, fmt, cols, words", [
    (torch.zeros(4, 33, dtype=torch.uint8), "Q8_0", 32, "takes [4, 34] bytes"),
    (torch.zeros(4, 34, dtype=torch.int8), "Q8_0", 32, "uint8"),
    (torch.zeros(4, 34, dtype=torch.uint8), "Q8_0", 48, "multiple of Q8_0's block of 32"),
    (torch.zeros(4, 34, dtype=torch.uint8), "Q8_1", 32, "no CPU kernel"),
    (torch.zeros(4, 68, dtype=torch.uint8)[:, ::2], "Q8_0", 32, "contiguous"),
])
def test_a_matrix_that_does_not_fit_is_refused_in_one_line(raw, fmt, cols, words):
    with pytest.raises(ValueError) as err:
        GGMLMatrix(raw, fmt, 4, cols)
    assert words in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------- ggml's interleaved layout
PACKED = ("Q4_0", "Q4_K")  # what llama.cpp repacks on x86 with AVX2 (repack.cpp: q4_0_8x8_q8_0, q4_K_8x8_q8_K)


def packed_or_skip(fmt: str) -> None:
    if int(gguf.GGMLQuantizationType[fmt]) not in torch.ops.tokentui_ggml.packed_types():
        pytest.skip(f"ggml has no interleaved {fmt} kernel on this CPU / build (it stays on vec_dot)")


@pytest.mark.parametrize("fmt", PACKED)
def test_a_repacked_matrix_multiplies_as_vec_dot_and_dequantizes_to_the_files_values(fmt):
    """llama.cpp's repacked kernels sum the same 8-bit products in another order: within float32 rounding of
    vec_dot's result, for a decode step's one row and gemm's rows 4 at a time (plus the rest through gemv), a
    prefill's many rows too (which a matrix as stored multiplies by llama.cpp's matrix product: mul_mat)."""
    packed_or_skip(fmt)
    matrix = stored(values(), fmt)
    layer, plain = GGMLLinear(matrix), GGMLLinear(matrix, repack=False)
    assert (layer.kernel, plain.kernel, plain.packed) == (f"{fmt[0].lower()}{fmt[1:]}x8 gemv", "vec_dot", None)
    assert layer.packed.shape == matrix.raw.shape and not torch.equal(layer.packed, matrix.raw)
    ops = torch.ops.tokentui_ggml
    assert torch.equal(ops.unpack(layer.packed, matrix.type, COLS), matrix.raw)  # the file's bytes exactly
    assert torch.equal(layer.weight, gguf_values(matrix.raw, fmt))
    for rows in (1, 3, 4, 7, ggml_linear.PRODUCT_ROWS, ggml_linear.PRODUCT_ROWS + 9):
        x = values(rows, COLS, seed=10 + rows)
        ours, theirs = layer(x), ops.product(x, matrix.raw, matrix.type)  # vec_dot, whatever the rows
        assert not torch.equal(ours, theirs) or rows == 1  # another kernel (one row may happen to agree)
        assert float((ours - theirs).abs().max()) <= 1e-5 * float(theirs.abs().max())
    many = values(ggml_linear.PRODUCT_ROWS + 9, COLS, seed=5)
    stored_rows = plain(many)  # a matrix as stored: llama.cpp's matrix product, the same 8-bit activations
    assert torch.equal(stored_rows, ops.mul_mat(many, matrix.raw, matrix.type))
    assert float((layer(many) - stored_rows).abs().max()) <= 1e-5 * float(stored_rows.abs().max())


@pytest.mark.parametrize("fmt", PACKED)
def test_a_repacked_products_bits_do_not_depend_on_the_threads(fmt):
    """The rows split over the threads in chunks of each thread's share (fork_rule.h's shared_for: 1,600 rows of 512
    values are 200 groups of 8, two shares of 100 at 2 threads): each group of 8 rows is one gemv (or gemm) whatever
    thread runs it, so one and two threads give the same bits, for a decode row, gemm's rows 4 at a time with the
    rest through gemv, and many rows."""
    packed_or_skip(fmt)
    layer = GGMLLinear(stored(values(1600, COLS, seed=3), fmt))
    assert layer.packed is not None
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2):
            torch.set_num_threads(count)
            results.append([layer(values(rows, COLS, seed=20 + rows)) for rows in (1, 6, 37)])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_what_is_not_repacked_stays_on_vec_dot(monkeypatch):
    packed_or_skip("Q4_0")
    assert GGMLLinear(stored(values(44), "Q4_0")).kernel == "vec_dot"  # 44 rows: not groups of 8
    assert GGMLLinear(stored(values(), "Q8_0")).kernel == "vec_dot"  # no interleaved kernel bound for it
    monkeypatch.setenv(ggml_linear.REPACK_ENV, "0")
    assert GGMLLinear(stored(values(), "Q4_0")).kernel == "vec_dot"
    with pytest.raises(RuntimeError, match="multiple of 8"):
        torch.ops.tokentui_ggml.repack(stored(values(44), "Q4_0").raw, int(gguf.GGMLQuantizationType.Q4_0), COLS)


def test_a_repacked_files_pages_are_given_back_and_read_again(tmp_path):
    packed_or_skip("Q4_0")
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    w = values(64, 4096)
    q4 = gguf.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_0)
    writer.add_tensor("q4", q4, raw_shape=q4.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    matrix = GGMLMatrix.from_gguf_tensor(gguf.GGUFReader(str(path)).tensors[0])
    before = matrix.raw.clone()
    assert torch.ops.tokentui_ggml.release(matrix.raw) > 0  # the file's read-only map: its whole pages
    assert torch.equal(matrix.raw, before)  # read from the file again
    assert torch.ops.tokentui_ggml.release(before) == 0  # anonymous memory: left alone
    layer = GGMLLinear(matrix)
    assert layer.kernel == "q4_0x8 gemv" and torch.equal(layer.weight, gguf_values(before, "Q4_0"))
