"""GGUF 4-bit blocks kept as they are stored: the file's 4-bit values and block scales, in the grouped layout torch's
int4 CPU kernel runs (core/model/quant/qlinear.py).

Every layout here says w[n, k] = (q[n, k] - 8) * scale[n, g] + zero[n, g] with q in 0..15 and g = k // 32 (one
scale and one zero per group of 32 along the input dimension: torch's `_weight_int4pack_mm_for_cpu` convention, its
own tests' `_group_quantize_tensor`). The GGUF block types map onto it without changing a single 4-bit value:

    Q4_0  w = d * (q - 8)                  scale = d              zero = 0
    Q4_1  w = d * q + m                    scale = d              zero = m + 8 d
    Q4_K  w = d * sc_j * q - dmin * m_j    scale = d * sc_j       zero = 8 d sc_j - dmin m_j   (sub-block j of 32)
    Q8_0  w = d * q, q in -127..127        two 4-bit halves, q = 16 hi + lo: hi in -8..7 (scale 16 d, zero 0) and
                                           lo in 0..15 (scale d, zero 8 d), side by side along the input dimension

What is exact: the 4-bit (and Q8_0's 8-bit) values are the file's. The scales and zeros are computed in float32
from the file's float16 d / dmin and 6-bit sub-block scales (exact products; a zero's sum rounds at most once, to
float32), so `GroupedInt4.dequantize()` equals gguf-py's de-quantization to the last float32 bit or one rounding of
it. torch's int4 kernel reads the scales and zeros in bfloat16 (its activation dtype): that rounding, relative error
at most 2^-8 each, is the only change to the weights, bounded per element by `scale_bound()`
(tests/unit/test_gguf_quant.py asserts it per block type). tokentui's AVX2 kernel (core/model/native/q4_native.py) reads
them in float32, and puts a Q8_0 matrix's halves back together as its int8 values.

Why hand-written: gguf-py de-quantizes straight to floats (it has no API that returns the 4-bit values and the
scales apart); the block layouts below are ggml's (ggml-common.h), as gguf-py's `dequantize_blocks` reads them, and
its own `Q4_K.get_scale_min` unpacks the 6-bit scales.

Which matrices: a GGUF tensor is kept quantized when its block type is 4-bit (Q4_0, Q4_1, Q4_K) or it is a Q8_0 LM
head, and transformers' own tensor processor for the architecture does nothing to it but reorder its rows (checked
by running the processor on the row numbers: llama's q/k rows are permuted back from llama.cpp's rope layout). Any
other tensor is de-quantized exactly as transformers does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GROUP = 32  # the kernel's group along the input dimension = the GGUF block (and Q4_K sub-block) size
FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")  # block types whose values the int4 kernel takes as they are
SPLIT_EIGHT_BIT = ("Q8_0",)  # held as two 4-bit halves (the LM head only: core/model/load/gguf_load.py)
KERNEL_SCALE_DTYPE = torch.bfloat16  # what torch's int4 kernel reads scales in (--quantize rounds to it)
BF16_ROUNDOFF = 2.0 ** -8  # unit roundoff of bfloat16 (8 significant bits): |bf16(x) - x| <= 2^-8 |x|


@dataclass(frozen=True)
class GroupedInt4:
    """One weight matrix [out, in] as 4-bit values with a scale and a zero per group of 32 along `in`:
    w[n, k] = (q[n, k] - 8) * scale[n, k // 32] + zero[n, k // 32].

    q: uint8 [N, K] (0..15); scale, zero: float32 [N, K // 32]. `source` is the GGUF block type; `halves` is True for
    a Q8_0 matrix split into two 4-bit halves (then K is twice the matrix's input size: `in_features` says it)."""

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    source: str
    halves: bool = False

    def __post_init__(self) -> None:
        n, k = self.q.shape
        if self.q.dtype != torch.uint8 or k % GROUP:
            raise ValueError(f"4-bit values must be uint8 [N, K] with K a multiple of {GROUP}, got "
                             f"{self.q.dtype} {tuple(self.q.shape)}")
        for name in ("scale", "zero"):
            value = getattr(self, name)
            if value.dtype != torch.float32 or tuple(value.shape) != (n, k // GROUP):
                raise ValueError(f"{name} must be float32 [{n}, {k // GROUP}], got {value.dtype} "
                                 f"{tuple(value.shape)}")

    @property
    def out_features(self) -> int:
        return int(self.q.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.q.shape[1]) // (2 if self.halves else 1)

    def dequantize(self, scale_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The matrix [out, in] in float32, computed as the kernel does (one fused multiply-add per weight, in
        float32) from the scales and zeros rounded to `scale_dtype` (float32: the file's values)."""
        scale = self.scale.to(scale_dtype).float().repeat_interleave(GROUP, dim=1)
        zero = self.zero.to(scale_dtype).float().repeat_interleave(GROUP, dim=1)
        w = torch.addcmul(zero, self.q.float() - 8.0, scale)
        if self.halves:  # [hi | lo] side by side: the matrix is their sum
            half = w.shape[1] // 2
            w = w[:, :half] + w[:, half:]
        return w

    def scale_bound(self) -> torch.Tensor:
        """Per group [N, K // 32]: the largest change to a weight that rounding scale and zero to bfloat16 can make,
        |q - 8| |scale| u + |zero| u with u = 2^-8 and |q - 8| <= 8. (For Q8_0 halves: the bound of each half;
        a weight's change is at most the sum of its two halves'.)"""
        return BF16_ROUNDOFF * (8.0 * self.scale.abs() + self.zero.abs())

    def rows(self, order: np.ndarray) -> "GroupedInt4":
        """The same matrix with its rows in `order` (a permutation of range(out))."""
        index = torch.from_numpy(np.ascontiguousarray(order, dtype=np.int64))
        return GroupedInt4(self.q.index_select(0, index), self.scale.index_select(0, index),
                           self.zero.index_select(0, index), self.source, self.halves)

    @property
    def nbytes(self) -> int:
        """Bytes the kernel reads for this matrix: 4 bits a value plus a bfloat16 scale and zero per group."""
        n, k = self.q.shape
        return n * k // 2 + n * (k // GROUP) * 2 * KERNEL_SCALE_DTYPE.itemsize


# ---------------------------------------------------------------------------------------------- block readers
def _f16(raw: np.ndarray) -> np.ndarray:
    """float16 fields (two bytes each, little-endian as ggml writes them) -> float32."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes of a 32-value block -> [..., 32] values: the low nibbles are values 0-15, the high 16-31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q4_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # block_q4_0: d (f16), qs[16]
    d = _f16(blocks[..., 0:2])
    return _nibbles(blocks[..., 2:18]), d, np.zeros_like(d)


def _q4_1(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # block_q4_1: d (f16), m (f16), qs[16]
    d, m = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
    return _nibbles(blocks[..., 4:20]), d, m + np.float32(8.0) * d


def _q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # block_q4_K (256 values): d (f16), dmin (f16), scales[12] (eight 6-bit scales and mins), qs[128]; qs holds four
    # chunks of 32 bytes, each two sub-blocks of 32: the low nibbles the first, the high nibbles the second
    from gguf.quants import Q4_K

    rows, nb = blocks.shape[:2]
    flat = blocks.reshape(rows * nb, 144)
    d, dmin = _f16(flat[:, 0:2]), _f16(flat[:, 2:4])
    sc, mins = Q4_K.get_scale_min(flat[:, 4:16])
    scale = d[:, None] * sc.astype(np.float32)  # [blocks, 8]
    zero = np.float32(8.0) * scale - dmin[:, None] * mins.astype(np.float32)
    qs = flat[:, 16:].reshape(rows * nb, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(rows, nb * 8, GROUP)
    return q, scale.reshape(rows, nb * 8), zero.reshape(rows, nb * 8)


def _q8_0_halves(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # block_q8_0: d (f16), qs[32] (int8). q = 16 hi + lo with lo = q mod 16 in 0..15 and hi = q // 16 in -8..7:
    # hi is stored as hi + 8 (scale 16 d, zero 0), lo as itself (scale d, zero 8 d); the halves go side by side
    d = _f16(blocks[..., 0:2])
    q = np.ascontiguousarray(blocks[..., 2:34]).view(np.int8).astype(np.int16)
    hi, lo = np.floor_divide(q, 16), np.mod(q, 16)
    rows = blocks.shape[0]
    values = np.concatenate([(hi + 8).reshape(rows, -1), lo.reshape(rows, -1)], axis=1).astype(np.uint8)
    scale = np.concatenate([np.float32(16.0) * d, d], axis=1)
    zero = np.concatenate([np.zeros_like(d), np.float32(8.0) * d], axis=1)
    return values, scale, zero


# block type -> (bytes per block, values per block, reader)
_READERS = {"Q4_0": (18, 32, _q4_0), "Q4_1": (20, 32, _q4_1), "Q4_K": (144, 256, _q4_k),
            "Q8_0": (34, 32, _q8_0_halves)}


def readable(kind: str) -> bool:
    return kind in _READERS


def read_blocks(kind: str, data: np.ndarray, rows: int, cols: int) -> GroupedInt4:
    """A GGUF tensor's raw blocks ([rows, bytes per row] uint8, as gguf-py's GGUFReader maps them; `cols` values a
    row) as a GroupedInt4 in the file's row order."""
    size, per_block, reader = _READERS[kind]
    if cols % per_block:
        raise ValueError(f"{kind} rows of {cols} values are not whole blocks of {per_block}")
    blocks = np.asarray(data, dtype=np.uint8).reshape(rows, cols // per_block, size)
    values, scale, zero = reader(blocks)
    return GroupedInt4(torch.from_numpy(np.ascontiguousarray(values.reshape(rows, -1), dtype=np.uint8)),
                       torch.from_numpy(np.ascontiguousarray(scale.reshape(rows, -1), dtype=np.float32)),
                       torch.from_numpy(np.ascontiguousarray(zero.reshape(rows, -1), dtype=np.float32)),
                       kind, halves=kind in SPLIT_EIGHT_BIT)


def row_order(processor, name: str, rows: int, **kwargs) -> np.ndarray | None:
    """What transformers' tensor `processor` does to the rows of GGUF tensor `name`, found by running it on the row
    numbers: the permutation it applies, or None when it does something else (reshapes, splits, changes values,
    renames in a way the caller does not expect) — such a tensor is de-quantized as transformers does."""
    probe = np.repeat(np.arange(rows, dtype=np.int64)[:, None], 2, axis=1)
    try:
        result = processor.process(weights=probe, name=name, **kwargs)
    except Exception:  # a processor that needs the real values (or their shape): not a pure row permutation
        return None
    out = np.asarray(result.weights)
    if result.name != name or out.shape != probe.shape or not np.array_equal(out[:, 0], out[:, 1]):
        return None
    order = out[:, 0]
    if not np.array_equal(np.sort(order), np.arange(rows)):
        return None
    return order
