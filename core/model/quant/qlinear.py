"""Linear layers whose weights stay 4-bit: the packed groups of core/model/quant/gguf_quant.py through a 4-bit kernel.

`QLinear` stands in for an `nn.Linear`: y = x W^T (+ b), W a GroupedInt4 packed for one of the kernels of
core/model/quant/int4_kernel.py (`chosen_kernel` below picks it):

- torch's int4 CPU kernel (`_weight_int4pack_mm_for_cpu`, aten/src/ATen/native/cpu/int4mm_kernel.cpp) de-quantizes
  each weight into float32 registers from bfloat16 scales and zeros, multiplies by bfloat16 activations and sums in
  float32; it writes bfloat16 (with float16 or float32 activations it falls back to scalar code, ~35x slower:
  BENCHMARKS.md). So with it the activations going into a 4-bit product are rounded to bfloat16, and so is its
  output.
- tokentui's AVX2 kernels (core/model/native/q4_native.py) keep the scales and the output in float32; "avx2-fp32" keeps
  the activations float32 too, "avx2-int16" (the default where it builds) rounds each group of 32 to int16 with a
  float32 scale (each within 1.5e-5 of the group's largest).

Everything between the products (norms, attention, the residual stream, the KV cache) stays in the model's own
dtype (float32), cast back after each product.

Scores: a bfloat16 logit of ~20 is only good to ±0.06, which would tie candidates and move probabilities by
percents. With torch's kernel `QLMHead` therefore computes every score with the kernel and then recomputes the
`EXACT_SCORES` highest in float32 from the head's own float32 rows (for a tied head: the embedding table, which holds
the file's de-quantized values): the candidates the dashboard shows, the greedy pick and every token a sampler could
plausibly draw are scored by the file's weights in float32; the rest stay within bfloat16 rounding. The int16
kernel's scores are recomputed the same way (they are within ~1e-4 already). With "avx2-fp32" every score is
float32 from the file's weights already, and none is recomputed. Where tokentui's library is loaded the recomputing
is one call of it (core/model/native/exact_head.cpp: the same top set, each product summed in float64 and rounded
once); elsewhere, and under torch.compile, torch's topk, index_select and bmm.

`FusedQLinear` multiplies sibling projections that read the same input (q/k/v, gate/up) as one matrix: one kernel
call instead of three or two (fewer, larger calls: core/model/speed.py's overhead floor). Each sibling is a
`QLinearPart` in the model where the original `nn.Linear` was, so the model's own forward code is unchanged: the
first part called with an input computes the fused product, the others take their columns of it (same input tensor
object: the identity check of SharedProduct, core/model/quant/fused_linear.py). Under torch.compile the parts each
compute the fused product, which the compiler then computes once (common subexpressions are merged in the traced
graph).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from .fused_linear import SharedProduct
from .gguf_quant import GROUP, GroupedInt4
from .int4_kernel import Int4Kernel, TorchInt4
from ..native.q4_native import NativeQ4, NativeQ4I16, library_name

EXACT_SCORES = 256  # highest scores per position recomputed in float32 by QLMHead (a kernel that rounds activations)
KERNEL_ENV = "TOKENTUI_INT4_KERNEL"  # "torch-int4", "avx2-fp32" or "avx2-int16": the kernel (default: chosen_kernel)
KERNELS: dict[str, Int4Kernel] = {k.name: k for k in (TorchInt4(), NativeQ4(), NativeQ4I16())}
NATIVE = (NativeQ4.name, NativeQ4I16.name)  # tokentui's own kernels (one library, core/model/native/q4_native.py)


def kernel_available() -> bool:
    """Some 4-bit kernel runs here (torch's int4 CPU kernel, torch >= 2.5, is the one every x86 / ARM torch has)."""
    return TorchInt4.available() or NativeQ4.unavailable() is None


def chosen_kernel() -> Int4Kernel:
    """The kernel new 4-bit matrices are packed for: `TOKENTUI_INT4_KERNEL` when set, else tokentui's AVX2 int16
    kernel wherever it builds (every x86 CPU with AVX2: its activations are within 1.5e-5 of their group's largest,
    where torch's kernel rounds them to bfloat16, and the native decode step, core/model/native/native_step.py, runs on
    it: faster than torch's kernel even where that one has its AVX-512 path, BENCHMARKS.md), else torch's (on
    other CPUs the only one). "avx2-fp32" keeps the activations float32 (exact up to float32 sums, slower).
    Raises ValueError for an unknown or unavailable choice (core/model/load/gguf_load.py and quantize.py make it one
    line)."""
    asked = os.environ.get(KERNEL_ENV, "").strip()
    if asked:
        if asked not in KERNELS:
            raise ValueError(f"{KERNEL_ENV}={asked!r}: expected one of {', '.join(KERNELS)}")
        if asked in NATIVE and (why := NativeQ4.unavailable()) is not None:
            raise ValueError(f"{KERNEL_ENV}={asked}: tokentui's AVX2 kernel cannot run here: {why}")
        return KERNELS[asked]
    if wants_native() and NativeQ4.unavailable() is None:
        return KERNELS[NativeQ4I16.name]
    return KERNELS[TorchInt4.name]


def wants_native() -> bool:
    """`chosen_kernel` tries tokentui's AVX2 kernel (so it may build it): asked for, or the default here (an x86
    CPU that torch runs with AVX2 or AVX-512)."""
    asked = os.environ.get(KERNEL_ENV, "").strip()
    return asked in NATIVE or (not asked and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"))


def pack(matrix: GroupedInt4, kernel: Int4Kernel) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed 4-bit values, scales) of `matrix` in `kernel`'s layout."""
    return kernel.pack(matrix)


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, in_features: int, halves: bool,
                kernel: Int4Kernel) -> torch.Tensor:
    """x [..., in] (any float dtype) -> [M, N] in the kernel's activation dtype, M the product of x's leading
    dimensions.

    halves: the matrix is [hi | lo] of a Q8_0 matrix side by side (gguf_quant.py); on a kernel that multiplies
    the two halves as they are, the activations go in twice."""
    a = x.reshape(-1, in_features).to(kernel.activation_dtype)
    if halves and kernel.eight_bit_halves:
        a = torch.cat([a, a], dim=1)
    return kernel.mm(a.contiguous(), packed, scales)


class QLinear(nn.Module):
    """y = x W^T (+ b) with W 4-bit (see the module docstring); x [..., in] -> y [..., out] in x's dtype."""

    def __init__(self, in_features: int, out_features: int, packed: torch.Tensor, scale_zeros: torch.Tensor, *,
                 source: str, kernel: Int4Kernel, halves: bool = False, bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.source, self.halves, self.kernel = source, bool(halves), kernel
        # the packed weights are not Parameters (nothing trains them, and they are not float): buffers that move
        # with the module and are left out of the model's state dict (tokentui caches them itself)
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("scale_zeros", scale_zeros, persistent=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    @classmethod
    def from_matrix(cls, matrix: GroupedInt4, bias: torch.Tensor | None = None, kernel: Int4Kernel | None = None,
                    **kwargs) -> "QLinear":
        kernel = kernel or chosen_kernel()
        packed, scale_zeros = pack(matrix, kernel)
        return cls(matrix.in_features, matrix.out_features, packed, scale_zeros, source=matrix.source,
                   kernel=kernel, halves=matrix.halves, bias=bias, **kwargs)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        y = int4_matmul(x, self.packed, self.scale_zeros, self.in_features, self.halves, self.kernel)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y + self.bias if self.bias is not None else y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._product(x)

    @property
    def weight_nbytes(self) -> int:
        """Bytes the kernel reads per call: the packed values and the bfloat16 scales and zeros."""
        return self.packed.nbytes + self.scale_zeros.nbytes

    def extra_repr(self) -> str:
        kind = f"{self.source} 4-bit"
        if self.halves:
            kind = f"{self.source} as two 4-bit halves" if self.kernel.eight_bit_halves else f"{self.source} 8-bit"
        return (f"in_features={self.in_features}, out_features={self.out_features}, {kind}, group={GROUP}, "
                f"kernel={self.kernel.name}")


class QLMHead(QLinear):
    """The LM head: every score from the 4-bit kernel, then the EXACT_SCORES highest of each position recomputed in
    float32 from `weight` ([vocab, hidden] float32: the file's de-quantized values). A tied head is made with
    weight=None and given the input embedding's own Parameter by `tie` (so the model stays tied, one table)."""

    def __init__(self, *args, weight: nn.Parameter | None = None, exact_scores: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.tied = weight is None
        self.register_parameter("weight", None)
        if weight is not None:
            self.tie(weight)
        # None: EXACT_SCORES, or none where the kernel's float32 scores are the float rows' own already (a GGUF head,
        # whose float rows are its de-quantized 4-bit values); --quantize asks for them (its float rows are not)
        if exact_scores is None:
            exact_scores = 0 if self.kernel.exact_scores else EXACT_SCORES
        self.exact_scores = min(int(exact_scores), self.out_features)

    def tie(self, weight: nn.Parameter) -> None:
        if tuple(weight.shape) != (self.out_features, self.in_features) or weight.dtype != torch.float32:
            raise ValueError(f"the head's float rows must be float32 [{self.out_features}, {self.in_features}], "
                             f"got {weight.dtype} {tuple(weight.shape)}")
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self._product(x)  # [..., V]
        if not self.exact_scores:
            return scores
        flat, rows = scores.reshape(-1, self.out_features), x.reshape(-1, self.in_features)
        if _exact_in_one_call(flat, self.weight):  # core/model/native/exact_head.cpp: the same, in place
            torch.ops.tokentui_q4.exact_top(flat, rows.to(self.weight.dtype).contiguous(), self.weight, self.bias,
                                            self.exact_scores)
            return scores
        top = flat.topk(self.exact_scores, dim=-1, sorted=False).indices  # [M, R]
        picked = self.weight.index_select(0, top.reshape(-1)).view(*top.shape, self.in_features)  # [M, R, in]
        exact = torch.bmm(picked, rows.to(self.weight.dtype).unsqueeze(-1)).squeeze(-1)  # [M, R]
        if self.bias is not None:
            exact = exact + self.bias[top]
        return flat.scatter(1, top, exact.to(flat.dtype)).reshape(scores.shape)


def _exact_in_one_call(flat: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether QLMHead's exact scores are one call of tokentui's library (exact_head.cpp): on the CPU, float32
    throughout, the library loaded, and not under torch.compile (which traces the torch version)."""
    return (flat.device.type == "cpu" and flat.dtype == torch.float32 and weight.dtype == torch.float32
            and flat.is_contiguous() and weight.is_contiguous() and library_name() is not None
            and not torch.compiler.is_compiling())


class FusedQLinear(SharedProduct, nn.Module):
    """Sibling projections of one input as one 4-bit matrix (their rows stacked); `parts` are the modules the model
    calls. Holds the last product until every part has taken its columns (SharedProduct: core/model/quant/fused_linear.py,
    the float weights' version of the same layout)."""

    def __init__(self, matrix_packed: torch.Tensor, scale_zeros: torch.Tensor, in_features: int,
                 widths: list[int], source: str, kernel: Int4Kernel):
        super().__init__()
        self.in_features, self.widths, self.source = int(in_features), [int(w) for w in widths], source
        self.kernel = kernel
        self.register_buffer("packed", matrix_packed, persistent=False)
        self.register_buffer("scale_zeros", scale_zeros, persistent=False)
        self._reset_shared()

    @classmethod
    def from_matrices(cls, matrices: list[GroupedInt4], kernel: Int4Kernel | None = None) -> "FusedQLinear":
        stacked = GroupedInt4(torch.cat([m.q for m in matrices]), torch.cat([m.scale for m in matrices]),
                              torch.cat([m.zero for m in matrices]), matrices[0].source)
        kernel = kernel or chosen_kernel()
        packed, scale_zeros = pack(stacked, kernel)
        return cls(packed, scale_zeros, stacked.in_features, [m.out_features for m in matrices],
                   "+".join(sorted({m.source for m in matrices})), kernel)

    def parts(self, biases: list[torch.Tensor | None] | None = None) -> list["QLinearPart"]:
        biases = biases or [None] * len(self.widths)
        starts = [sum(self.widths[:i]) for i in range(len(self.widths))]
        return [QLinearPart(self, i, start, width, bias)
                for i, (start, width, bias) in enumerate(zip(starts, self.widths, biases))]

    def product(self, x: torch.Tensor) -> torch.Tensor:
        y = int4_matmul(x, self.packed, self.scale_zeros, self.in_features, False, self.kernel)
        return y.to(x.dtype).reshape(*x.shape[:-1], sum(self.widths))

    @property
    def weight_nbytes(self) -> int:
        return self.packed.nbytes + self.scale_zeros.nbytes


class QLinearPart(nn.Module):
    """One projection of a FusedQLinear: columns [start, start + width) of the fused product."""

    def __init__(self, fused: FusedQLinear, index: int, start: int, width: int, bias: torch.Tensor | None):
        super().__init__()
        # a plain attribute, not a submodule: the fused matrix is registered once, by whoever owns the parts
        object.__setattr__(self, "fused", fused)
        self.index, self.start, self.in_features, self.out_features = index, start, fused.in_features, width
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fused.columns_for(self.index, x)[..., self.start:self.start + self.out_features]
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, columns {self.start}-"
                f"{self.start + self.out_features - 1} of a fused {self.fused.source} 4-bit matrix")


def quantized_modules(model: nn.Module) -> list[nn.Module]:
    """The 4-bit matrices of `model`, each once: QLinear / QLMHead modules and FusedQLinear groups."""
    found: dict[int, nn.Module] = {}
    for module in model.modules():
        if isinstance(module, QLinearPart):
            found.setdefault(id(module.fused), module.fused)
        elif isinstance(module, (QLinear, FusedQLinear)):
            found.setdefault(id(module), module)
    return list(found.values())


def quantized_parameters(model: nn.Module) -> int:
    """Weights held 4-bit (not Parameters, so `model.parameters()` leaves them out); a QLMHead's float rows are a
    Parameter and counted there, so it adds nothing here."""
    total = 0
    for module in quantized_modules(model):
        if isinstance(module, QLMHead):
            continue
        widths = module.widths if isinstance(module, FusedQLinear) else [module.out_features]
        total += module.in_features * sum(widths)
    return total


def quantized_nbytes(model: nn.Module) -> int:
    """Bytes all 4-bit matrices hold (what the kernels read for one position)."""
    return sum(module.weight_nbytes for module in quantized_modules(model))


def step_weight_bytes(model: nn.Module) -> int:
    """Bytes of weights one decode step of a 4-bit `model` reads: the 4-bit matrices, every float parameter that is
    multiplied whole, one embedding row in, and the head's float rows a QLMHead recomputes."""
    embed = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    exact = out.exact_scores if isinstance(out, QLMHead) else 0
    rows_only = {id(embed)} | ({id(out.weight)} if isinstance(out, QLMHead) else set())  # read a row at a time
    read = sum(module.weight_nbytes for module in quantized_modules(model))
    read += sum(p.nbytes for p in model.parameters() if id(p) not in rows_only)
    if out is not None and not isinstance(out, QLMHead) and getattr(out, "weight", None) is embed:
        read += embed.nbytes  # a float head tied to the embedding multiplies the whole table
    return int(read + embed[0].nbytes * (1 + exact))
