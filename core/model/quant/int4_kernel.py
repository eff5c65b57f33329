"""The 4-bit matrix products a QLinear runs (core/model/quant/qlinear.py), behind one interface: `Int4Kernel`.

A kernel packs a GroupedInt4 (core/model/quant/gguf_quant.py: w = (q - 8) scale + zero per group of 32) into its own layout
and multiplies activations [M, K] by it. Three kernels:

- `TorchInt4` ("torch-int4"): torch's `_weight_int4pack_mm_for_cpu`. Its scales and zeros are bfloat16, and so are
  its activations and its output (with float32 or float16 activations it falls back to scalar code). Its packed
  layout depends on the CPU capability torch dispatches to. Fast with AVX-512; on AVX2-only CPUs its path is slow.
- `NativeQ4` ("avx2-fp32", core/model/native/q4_native.py): tokentui's own AVX2 kernel (core/model/native/q4_avx2.cpp),
  built with the C++ compiler on the first start. Scales, activations and output are float32, so its product is
  the file's de-quantized weights times the activations up to float32 summation order.
- `NativeQ4I16` ("avx2-int16", the same file): the same weights multiplied as integers by the activations rounded to
  int16, a float32 scale per group of 32 (core/model/native/i16_kernels.h): each activation within 1.5e-5 of its
  group's largest, ~1.7x the float32 kernel's speed.

Which one a model gets: core/model/quant/qlinear.py's `chosen_kernel`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from .gguf_quant import GROUP, GroupedInt4


class Int4Kernel(ABC):
    """One 4-bit product. `scale_dtype`: what it rounds the scales to; `activation_dtype`: the dtype its activations
    go in as; `activations`: what it rounds them to inside (the model event's words: "float32" for none);
    `exact_scores`: its float32 output needs no rescoring of the head's best candidates (QLMHead);
    `eight_bit_halves`: a Q8_0 matrix is multiplied as its two 4-bit halves side by side, so the activations go in
    twice (else the kernel's pack / mm take the halves as one 8-bit matrix); `layout`: the version of what `pack`
    makes (core/model/load/gguf_load.py keys its cache of packed tensors on it: bump it when `pack` changes)."""

    name: str
    scale_dtype: torch.dtype
    activation_dtype: torch.dtype
    activations: str
    eight_bit_halves: bool = True
    layout: int = 1

    @property
    def exact_scores(self) -> bool:
        return self.activations == "float32" and self.scale_dtype == torch.float32

    @abstractmethod
    def pack(self, matrix: GroupedInt4) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed 4-bit values, scales) in this kernel's layout."""

    @abstractmethod
    def mm(self, a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """a [M, K] contiguous in activation_dtype -> [M, N] in activation_dtype."""

    def __repr__(self) -> str:
        return f"<int4 kernel {self.name}>"


@torch.library.custom_op("tokentui::int4_mm", mutates_args=())
def _int4_mm(a: torch.Tensor, packed: torch.Tensor, scale_zeros: torch.Tensor) -> torch.Tensor:
    """torch's int4 CPU kernel as an op torch.compile calls as it is (left to itself, inductor swaps in int4 code of
    its own)."""
    return torch._weight_int4pack_mm_for_cpu(a, packed, GROUP, scale_zeros)


@_int4_mm.register_fake
def _(a, packed, scale_zeros):
    return a.new_empty((a.shape[0], packed.shape[0]))


class TorchInt4(Int4Kernel):
    name = "torch-int4"
    scale_dtype = torch.bfloat16
    activation_dtype = torch.bfloat16
    activations = "bfloat16"

    @staticmethod
    def available() -> bool:
        """torch's int4 CPU kernel (torch >= 2.5) is there."""
        return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
            torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")

    def pack(self, matrix: GroupedInt4) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed [N, K/2] uint8 in the kernel's layout, scales and zeros [K/32, N, 2] bfloat16).

        The packed layout depends on the CPU capability torch dispatches to (AVX512 and AVX2 interleave
        differently), so packed tensors are only reused by the same torch build on the same kind of CPU
        (core/model/load/gguf_load.py keys its cache on both)."""
        if matrix.out_features % 16:
            raise ValueError(f"the int4 kernel needs a multiple of 16 output features, got {matrix.out_features}")
        packed = torch._convert_weight_to_int4pack_for_cpu(matrix.q.to(torch.int32), 1)
        scale_zeros = torch.stack([matrix.scale, matrix.zero], dim=-1).transpose(0, 1).contiguous()
        return packed, scale_zeros.to(self.scale_dtype)

    def mm(self, a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return _int4_mm(a, packed, scales)
        return torch._weight_int4pack_mm_for_cpu(a, packed, GROUP, scales)
