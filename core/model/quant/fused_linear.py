"""Sibling projections of one input as one matrix product: q/k/v and gate/up (the eager decode step's launches).

Why: a Llama-family layer multiplies the same normalised input by q, k and v, and the next one by gate and up:
five matrix products per layer where two would do. On a GPU each product is a kernel launch, and at decode (one
row) a launch costs about as much as the arithmetic, so the engine fuses eager decode on CUDA. On CPU the float32
step measured ~5 % slower fused (MKL's matrix-vector kernel gains nothing from the larger matrices), so it does not
fuse there; the 4-bit path fuses on CPU with its own kernel (core/model/quant/qlinear.py), where that measured faster.
The counts per decode step, before and after: BENCHMARKS.md, "GPU path, round 2 (issue 27)"
(benchmarks/step_kernels.py); the CPU measurement: docs/design-record.md, "q/k/v and gate/up fused on CUDA only".

How (the layout core/model/quant/qlinear.py uses for 4-bit weights): `FusedLinear` is an nn.Linear whose weight is the
siblings' weights stacked ([sum of outs, in]; their biases likewise), registered on the siblings' parent. Each
sibling is replaced by a `LinearPart` where the nn.Linear was, so the model's own forward code is unchanged: the
first part called with an input computes the fused product, the others take their columns of it (the same input
tensor object: an identity check, so a part called with any other input recomputes, and the result is always the
product of the input it was given). The values are the same numbers as before, stored once (the old tensors are
freed); only the products' summation may differ by float rounding, as with core/model/quant/weight_layout.py.

Which siblings: exact `nn.Linear` children (not a quantized or adapter subclass) of one module, named as
`GROUPS` lists, with the same input width, dtype and device, all with a bias or none, no hooks (an offloading or
adapter hook wraps one module's call), and weights not shared with another module. Anything else stays as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # siblings that read the same input


class SharedProduct:
    """The identity-checked product shared by the parts of a fused matrix (FusedLinear here, FusedQLinear in
    core/model/quant/qlinear.py): `product(x)` is the subclass's; `widths` its parts' output widths."""

    widths: list[int]

    def _reset_shared(self) -> None:
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._taken: set[int] = set()

    def product(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def columns_for(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """The fused product of `x`, computed by the first part that asks for it (eager) or by each (compiled:
        the compiler merges the identical products)."""
        if torch.compiler.is_compiling():
            return self.product(x)
        if x is not self._input or index in self._taken:
            self._input, self._output, self._taken = x, self.product(x), set()
        out = self._output
        self._taken.add(index)
        if len(self._taken) == len(self.widths):  # every part served: let go of the input and the product
            self._reset_shared()
        return out


class FusedLinear(SharedProduct, nn.Linear):
    """Sibling nn.Linear projections of one input as one nn.Linear (their rows stacked, in the siblings' order)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, widths: list[int], names: list[str]):
        nn.Module.__init__(self)
        if weight.dim() != 2 or weight.shape[0] != sum(widths):
            raise ValueError(f"a fused weight of {sum(widths)} rows was expected, got {tuple(weight.shape)}")
        self.in_features, self.out_features = int(weight.shape[1]), int(weight.shape[0])
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.widths, self.names = [int(w) for w in widths], list(names)
        self._reset_shared()

    def product(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)  # [..., sum(widths)]

    def parts(self) -> list["LinearPart"]:
        starts = [sum(self.widths[:i]) for i in range(len(self.widths))]
        return [LinearPart(self, i, start, width) for i, (start, width) in enumerate(zip(starts, self.widths))]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fused {'+'.join(self.names)}"


class LinearPart(nn.Module):
    """One projection of a fused matrix: columns [start, start + width) of its product. `weight` / `bias` read the
    fused matrix's rows (views: what the replaced nn.Linear held)."""

    def __init__(self, fused: FusedLinear, index: int, start: int, width: int):
        super().__init__()
        # a plain attribute, not a submodule: the fused matrix is registered once, on the parent
        object.__setattr__(self, "fused", fused)
        self.index, self.start, self.in_features, self.out_features = index, start, fused.in_features, width

    @property
    def weight(self) -> torch.Tensor:
        return self.fused.weight[self.start:self.start + self.out_features]

    @property
    def bias(self) -> torch.Tensor | None:
        bias = self.fused.bias
        return None if bias is None else bias[self.start:self.start + self.out_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.columns_for(self.index, x)[..., self.start:self.start + self.out_features]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, rows {self.start}-"
                f"{self.start + self.out_features - 1} of {'+'.join(self.fused.names)}")


def wanted(device_type: str, weight_layout: str, compile: bool) -> bool:
    """Whether the engine fuses a model's siblings: eager decode on CUDA with the default layout (on CPU fusing
    measured slower; --compile fuses in the compiler; --weight-layout stock leaves the model as loaded)."""
    return device_type == "cuda" and weight_layout == "auto" and not compile


@dataclass(frozen=True)
class FuseReport:
    """What `fuse_siblings` did: fused groups and the projections they replaced."""

    groups: int = 0
    projections: int = 0


def _hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or getattr(module, "_hf_hook", None))


def _fusable(parent: nn.Module, names: tuple[str, ...], shared: set[int]) -> list[nn.Linear] | None:
    linears = [parent._modules.get(name) for name in names]
    if not all(type(m) is nn.Linear for m in linears):
        return None
    first = linears[0].weight
    same = all(m.in_features == linears[0].in_features and m.weight.dtype == first.dtype
               and m.weight.device == first.device and (m.bias is None) == (linears[0].bias is None)
               for m in linears)
    if not same or first.device.type == "meta" or any(_hooked(m) for m in linears):
        return None
    if any(id(m.weight) in shared or (m.bias is not None and id(m.bias) in shared) for m in linears):
        return None
    return linears


def _shared_parameters(model: nn.Module) -> set[int]:
    """Parameters held by more than one module (a tied weight): never fused away."""
    seen: dict[int, int] = {}
    for module in model.modules():
        for parameter in module._parameters.values():
            if parameter is not None:
                seen[id(parameter)] = seen.get(id(parameter), 0) + 1
    return {key for key, count in seen.items() if count > 1}


def fuse_siblings(model: nn.Module) -> FuseReport:
    """Fuse every group of `GROUPS` siblings in `model` that qualifies (module docstring), in place."""
    shared = _shared_parameters(model)
    groups = projections = 0
    for parent in list(model.modules()):
        for names in GROUPS:
            linears = _fusable(parent, names, shared)
            if linears is None:
                continue
            with torch.no_grad():
                weight = torch.cat([m.weight for m in linears])  # [sum of outs, in]
                bias = torch.cat([m.bias for m in linears]) if linears[0].bias is not None else None
            fused = FusedLinear(weight, bias, [m.out_features for m in linears], list(names))
            parent.add_module("fused_" + "_".join(n.removesuffix("_proj") for n in names), fused)
            for name, part in zip(names, fused.parts()):
                setattr(parent, name, part)  # the nn.Linear and its tensors are dropped
            groups += 1
            projections += len(names)
    return FuseReport(groups, projections)
