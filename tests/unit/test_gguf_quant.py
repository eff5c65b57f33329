"""The GGUF block readers (core/model/quant/gguf_quant.py) against gguf-py's own de-quantization, per block type: the 4-bit
values are the file's, the float32 scales reproduce its weights, and the bfloat16 scales the kernel reads change a
weight by no more than the documented bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from tokentui.core.model.quant.gguf_quant import BF16_ROUNDOFF, GROUP, GroupedInt4, read_blocks, row_order

ROWS, COLS = 48, 512


def raw_blocks(kind: str, seed: int = 0) -> np.ndarray:
    """A [ROWS, bytes per row] tensor of `kind` blocks as a GGUF file holds it. gguf-py quantizes Q4_0, Q4_1 and
    Q8_0; for Q4_K (which it only de-quantizes) the blocks are random bytes with sane float16 d / dmin."""
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal((ROWS, COLS)) * 0.05 + rng.standard_normal((ROWS, 1)) * 0.01).astype(np.float32)
    if kind != "Q4_K":
        return quants.quantize(weights, GGMLQuantizationType[kind])
    blocks = rng.integers(0, 256, size=(ROWS, COLS // 256, 144), dtype=np.uint8)
    blocks[..., 0:2] = rng.uniform(1e-4, 4e-3, (ROWS, COLS // 256, 1)).astype(np.float16).view(np.uint8)
    blocks[..., 2:4] = rng.uniform(1e-4, 2e-3, (ROWS, COLS // 256, 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(ROWS, -1)


def gguf_weights(kind: str, raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType[kind]).astype(np.float32))


def per_weight(group_values: torch.Tensor) -> torch.Tensor:
    return group_values.repeat_interleave(GROUP, dim=1)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K", "Q8_0"])
def test_float32_scales_give_the_files_weights(kind):
    raw = raw_blocks(kind)
    matrix = read_blocks(kind, raw, ROWS, COLS)
    expected = gguf_weights(kind, raw)
    got = matrix.dequantize()
    assert got.shape == expected.shape == (ROWS, COLS) and matrix.in_features == COLS
    # at most one float32 rounding of the zero's sum apart (Q8_0's halves add up exactly)
    ulps = 2.0 ** -22 * per_weight(8 * matrix.scale.abs() + matrix.zero.abs())
    if matrix.halves:
        ulps = torch.zeros_like(expected)
    assert ((got - expected).abs() <= ulps).all(), (got - expected).abs().max()


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_the_four_bit_values_are_the_files_bytes(kind):
    raw = raw_blocks(kind, seed=3)
    matrix = read_blocks(kind, raw, ROWS, COLS)
    header = {"Q4_0": 2, "Q4_1": 4}[kind]
    blocks = raw.reshape(ROWS, COLS // 32, header + 16)
    q = matrix.q.numpy().reshape(ROWS, COLS // 32, 32)
    repacked = q[..., :16] | (q[..., 16:] << 4)  # ggml: value j in the low nibble of byte j, value j + 16 in its high
    assert np.array_equal(repacked, blocks[..., header:])
    assert matrix.q.max() <= 15


def test_q8_0_halves_hold_the_files_eight_bit_values():
    raw = raw_blocks("Q8_0", seed=5)
    matrix = read_blocks("Q8_0", raw, ROWS, COLS)
    assert matrix.halves and matrix.q.shape == (ROWS, 2 * COLS)
    hi, lo = matrix.q[:, :COLS].to(torch.int16) - 8, matrix.q[:, COLS:].to(torch.int16)
    stored = torch.from_numpy(raw.reshape(ROWS, COLS // 32, 34)[..., 2:].copy().view(np.int8).reshape(ROWS, COLS))
    assert torch.equal(16 * hi + lo, stored.to(torch.int16))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K", "Q8_0"])
def test_bfloat16_scales_stay_within_the_documented_bound(kind):
    raw = raw_blocks(kind, seed=7)
    matrix = read_blocks(kind, raw, ROWS, COLS)
    exact, rounded = matrix.dequantize(), matrix.dequantize(torch.bfloat16)
    bound = per_weight(matrix.scale_bound())
    if matrix.halves:
        bound = bound[:, :COLS] + bound[:, COLS:]
    error = (rounded - exact).abs()
    assert (error <= bound * (1 + 1e-6) + 1e-12).all()
    assert (error / bound).max() > 0.2  # the bound is near what rounding does, not a vacuous one
    assert error.max() > 0  # and bfloat16 does round these scales (the test would not notice a float32 kernel)


def test_rows_reorders_values_and_scales_together():
    matrix = read_blocks("Q4_1", raw_blocks("Q4_1", seed=9), ROWS, COLS)
    order = np.random.default_rng(0).permutation(ROWS)
    assert torch.equal(matrix.rows(order).dequantize(), matrix.dequantize()[torch.from_numpy(order)])


def test_row_order_is_what_transformers_llama_processor_does_to_q_and_k():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    processor = LlamaTensorProcessor(config={"num_attention_heads": 4, "num_key_value_heads": 2})
    raw = raw_blocks("Q4_1", seed=11)
    matrix = read_blocks("Q4_1", raw, ROWS, COLS)
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_up.weight"):
        order = row_order(processor, name, ROWS)
        expected = processor.process(weights=gguf_weights("Q4_1", raw).numpy(), name=name).weights
        assert np.array_equal(matrix.rows(order).dequantize().numpy(), matrix.dequantize().numpy()[order])
        assert np.allclose(matrix.rows(order).dequantize().numpy(), expected, rtol=0, atol=1e-6)
    assert not np.array_equal(row_order(processor, "blk.0.attn_q.weight", ROWS), np.arange(ROWS))


def test_row_order_refuses_what_is_not_a_row_permutation():
    class Reshaping:
        def process(self, weights, name, **_):
            from transformers.modeling_gguf_pytorch_utils import GGUFTensor
            return GGUFTensor(weights.reshape(2, -1, weights.shape[1]).sum(0), name, {})

    class Scaling:
        def process(self, weights, name, **_):
            from transformers.modeling_gguf_pytorch_utils import GGUFTensor
            return GGUFTensor(weights + 1, name, {})

    class NeedsRealShapes:
        def process(self, weights, name, **_):
            raise ValueError("cannot reshape array")

    for processor in (Reshaping(), Scaling(), NeedsRealShapes()):
        assert row_order(processor, "blk.0.attn_qkv.weight", ROWS) is None


def test_layouts_are_validated_where_they_are_made():
    with pytest.raises(ValueError, match="multiple of 32"):
        GroupedInt4(torch.zeros(16, 40, dtype=torch.uint8), torch.zeros(16, 1), torch.zeros(16, 1), "Q4_0")
    with pytest.raises(ValueError, match="scale must be float32"):
        GroupedInt4(torch.zeros(16, 64, dtype=torch.uint8), torch.zeros(16, 3), torch.zeros(16, 2), "Q4_0")
    assert BF16_ROUNDOFF == 2.0 ** -8
