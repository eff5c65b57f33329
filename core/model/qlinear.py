"""Linear layers whose weights stay 4-bit: torch's int4 CPU kernel on the packed groups of core/model/gguf_quant.py.

`QLinear` stands in for an `nn.Linear`: y = x W^T (+ b), W kept as GroupedInt4 packed by
`torch._convert_weight_to_int4pack_for_cpu` and multiplied by `torch._weight_int4pack_mm_for_cpu`. That kernel
(aten/src/ATen/native/cpu/int4mm_kernel.cpp) de-quantizes each weight into float32 registers from bfloat16 scales
and zeros, multiplies by bfloat16 activations and sums in float32; it writes bfloat16. Measured (BENCHMARKS.md), it
is the only fast path of its kind in torch 2.13 on x86: with float16 or float32 activations it falls back to scalar
code (~35x slower). So the activations going into a 4-bit product are rounded to bfloat16, and so is its output;
everything between the products (norms, attention, the residual stream, the KV cache) stays in the model's own
dtype (float32), cast back after each product.

Scores are the exception: a bfloat16 logit of ~20 is only good to ±0.06, which would tie candidates and move
probabilities by percents. `QLMHead` therefore computes every score with the kernel and then recomputes the
`EXACT_SCORES` highest in float32 from the head's own float32 rows (for a tied head: the embedding table, which holds
the file's de-quantized values): the candidates the dashboard shows, the greedy pick and every token a sampler could
plausibly draw are scored by the file's weights in float32; the rest stay within bfloat16 rounding.

`FusedQLinear` multiplies sibling projections that read the same input (q/k/v, gate/up) as one matrix: one kernel
call instead of three or two (fewer, larger calls: core/model/speed.py's overhead floor). Each sibling is a
`QLinearPart` in the model where the original `nn.Linear` was, so the model's own forward code is unchanged: the
first part called with an input computes the fused product, the others take their columns of it (same input tensor
object: the identity check of SharedProduct, core/model/fused_linear.py). Under torch.compile the parts each
compute the fused product, which the compiler then computes once (common subexpressions are merged in the traced
graph).
"""

from __future__ import annotations

import torch
from torch import nn

from .fused_linear import SharedProduct
from .gguf_quant import GROUP, KERNEL_SCALE_DTYPE, GroupedInt4

EXACT_SCORES = 256  # highest scores per position recomputed in float32 by QLMHead
ACTIVATION_DTYPE = torch.bfloat16


def kernel_available() -> bool:
    """torch's int4 CPU kernel (torch >= 2.5) is there."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")


def pack(matrix: GroupedInt4) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed 4-bit weights in the kernel's layout [N, K/2] uint8, scales and zeros [K/32, N, 2] bfloat16).

    The packed layout depends on the CPU capability torch dispatches to (AVX512 and AVX2 interleave differently),
    so packed tensors are only reused by the same torch build on the same kind of CPU (core/model/gguf_load.py keys
    its cache on both)."""
    if matrix.out_features % 16:
        raise ValueError(f"the int4 kernel needs a multiple of 16 output features, got {matrix.out_features}")
    packed = torch._convert_weight_to_int4pack_for_cpu(matrix.q.to(torch.int32), 1)
    scale_zeros = torch.stack([matrix.scale, matrix.zero], dim=-1).transpose(0, 1).contiguous()
    return packed, scale_zeros.to(KERNEL_SCALE_DTYPE)


@torch.library.custom_op("tokentui::int4_mm", mutates_args=())
def _int4_mm(a: torch.Tensor, packed: torch.Tensor, scale_zeros: torch.Tensor) -> torch.Tensor:
    """torch's int4 CPU kernel as an op torch.compile calls as it is (see int4_matmul)."""
    return torch._weight_int4pack_mm_for_cpu(a, packed, GROUP, scale_zeros)


@_int4_mm.register_fake
def _(a, packed, scale_zeros):
    return a.new_empty((a.shape[0], packed.shape[0]))


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scale_zeros: torch.Tensor, in_features: int,
                halves: bool) -> torch.Tensor:
    """x [..., in] (any float dtype) -> bfloat16 [M, N] with M the product of x's leading dimensions.

    halves: the packed matrix is [hi | lo] of a Q8_0 matrix side by side (gguf_quant.py), so the activations go
    in twice. Under torch.compile the kernel is called through an opaque custom op, so the compiled step multiplies
    with the same kernel as the eager one (left to itself, inductor swaps in int4 code of its own)."""
    a = x.reshape(-1, in_features).to(ACTIVATION_DTYPE)
    if halves:
        a = torch.cat([a, a], dim=1)
    if torch.compiler.is_compiling():
        return _int4_mm(a.contiguous(), packed, scale_zeros)
    return torch._weight_int4pack_mm_for_cpu(a.contiguous(), packed, GROUP, scale_zeros)


class QLinear(nn.Module):
    """y = x W^T (+ b) with W 4-bit (see the module docstring); x [..., in] -> y [..., out] in x's dtype."""

    def __init__(self, in_features: int, out_features: int, packed: torch.Tensor, scale_zeros: torch.Tensor, *,
                 source: str, halves: bool = False, bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.source, self.halves = source, bool(halves)
        # the packed weights are not Parameters (nothing trains them, and they are not float): buffers that move
        # with the module and are left out of the model's state dict (tokentui caches them itself)
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("scale_zeros", scale_zeros, persistent=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    @classmethod
    def from_matrix(cls, matrix: GroupedInt4, bias: torch.Tensor | None = None, **kwargs) -> "QLinear":
        packed, scale_zeros = pack(matrix)
        return cls(matrix.in_features, matrix.out_features, packed, scale_zeros, source=matrix.source,
                   halves=matrix.halves, bias=bias, **kwargs)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        y = int4_matmul(x, self.packed, self.scale_zeros, self.in_features, self.halves)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y + self.bias if self.bias is not None else y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._product(x)

    @property
    def weight_nbytes(self) -> int:
        """Bytes the kernel reads per call: the packed values and the bfloat16 scales and zeros."""
        return self.packed.nbytes + self.scale_zeros.nbytes

    def extra_repr(self) -> str:
        kind = f"{self.source} as two 4-bit halves" if self.halves else f"{self.source} 4-bit"
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind}, group={GROUP}"


class QLMHead(QLinear):
    """The LM head: every score from the 4-bit kernel, then the EXACT_SCORES highest of each position recomputed in
    float32 from `weight` ([vocab, hidden] float32: the file's de-quantized values). A tied head is made with
    weight=None and given the input embedding's own Parameter by `tie` (so the model stays tied, one table)."""

    def __init__(self, *args, weight: nn.Parameter | None = None, exact_scores: int = EXACT_SCORES, **kwargs):
        super().__init__(*args, **kwargs)
        self.tied = weight is None
        self.register_parameter("weight", None)
        if weight is not None:
            self.tie(weight)
        self.exact_scores = min(int(exact_scores), self.out_features)

    def tie(self, weight: nn.Parameter) -> None:
        if tuple(weight.shape) != (self.out_features, self.in_features) or weight.dtype != torch.float32:
            raise ValueError(f"the head's float rows must be float32 [{self.out_features}, {self.in_features}], "
                             f"got {weight.dtype} {tuple(weight.shape)}")
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self._product(x)  # [..., V]
        flat, rows = scores.reshape(-1, self.out_features), x.reshape(-1, self.in_features)
        top = flat.topk(self.exact_scores, dim=-1, sorted=False).indices  # [M, R]
        picked = self.weight.index_select(0, top.reshape(-1)).view(*top.shape, self.in_features)  # [M, R, in]
        exact = torch.bmm(picked, rows.to(self.weight.dtype).unsqueeze(-1)).squeeze(-1)  # [M, R]
        if self.bias is not None:
            exact = exact + self.bias[top]
        return flat.scatter(1, top, exact.to(flat.dtype)).reshape(scores.shape)


class FusedQLinear(SharedProduct, nn.Module):
    """Sibling projections of one input as one 4-bit matrix (their rows stacked); `parts` are the modules the model
    calls. Holds the last product until every part has taken its columns (SharedProduct: core/model/fused_linear.py,
    the float weights' version of the same layout)."""

    def __init__(self, matrix_packed: torch.Tensor, scale_zeros: torch.Tensor, in_features: int,
                 widths: list[int], source: str):
        super().__init__()
        self.in_features, self.widths, self.source = int(in_features), [int(w) for w in widths], source
        self.register_buffer("packed", matrix_packed, persistent=False)
        self.register_buffer("scale_zeros", scale_zeros, persistent=False)
        self._reset_shared()

    @classmethod
    def from_matrices(cls, matrices: list[GroupedInt4]) -> "FusedQLinear":
        stacked = GroupedInt4(torch.cat([m.q for m in matrices]), torch.cat([m.scale for m in matrices]),
                              torch.cat([m.zero for m in matrices]), matrices[0].source)
        packed, scale_zeros = pack(stacked)
        return cls(packed, scale_zeros, stacked.in_features, [m.out_features for m in matrices],
                   "+".join(sorted({m.source for m in matrices})))

    def parts(self, biases: list[torch.Tensor | None] | None = None) -> list["QLinearPart"]:
        biases = biases or [None] * len(self.widths)
        starts = [sum(self.widths[:i]) for i in range(len(self.widths))]
        return [QLinearPart(self, i, start, width, bias)
                for i, (start, width, bias) in enumerate(zip(starts, self.widths, biases))]

    def product(self, x: torch.Tensor) -> torch.Tensor:
        y = int4_matmul(x, self.packed, self.scale_zeros, self.in_features, halves=False)
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
