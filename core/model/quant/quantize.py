"""`--quantize int4`: a float model's matrices quantized here, weight-only, to the 4-bit layout a 4-bit GGUF runs in.

Why: decode on a CPU reads every weight once a step, so 4-bit weights read ~6x fewer bytes than float32 ones. The
embedded model gets that from its file (core/model/load/gguf_load.py); any other causal LM can have it here, with the
same modules (core/model/quant/qlinear.py: the same 4-bit kernel, q/k/v and gate/up fused) and, for Llama-family
models, the same lean decode step (core/model/decode/lean_step.py).

What it does to the numbers (an instrument says so: the model event's `quantization`, the model panel):
* Each matrix is split into groups of 32 weights along its input, and each group is stored as 16 levels,
  w = (q - 8) * scale + zero with q in 0..15, scale = (max - min) / 15 and zero = min + 8 * scale, both rounded to
  bfloat16 (what the kernel reads) before the levels are chosen: the kernel's weights are exactly the de-quantized
  ones of `GroupedInt4.dequantize(bfloat16)`, each within scale / 2 of the float weight plus the bfloat16 rounding
  of the group's two constants (tests/unit/test_quantize.py asserts the bound).
  (bfloat16 scales whichever kernel runs them: the same levels on every machine.)
* Activations going into those products are rounded to the kernel's activation dtype, as on the GGUF path
  (bfloat16 for torch's int4 kernel, none for tokentui's AVX2 one: core/model/quant/int4_kernel.py).
* The LM head is quantized too, and its 256 highest scores of each position are recomputed in float32 from the
  model's own float head rows (QLMHead), so the candidates shown and the pick are scored by the
  float weights (with either kernel: the AVX2 kernel's scores are float32, but of the 4-bit head).
* Embeddings, norms, attention, the residual stream and the KV cache stay float32.

Which matrices: every linear layer (exact `nn.Linear`, transformers' `Conv1D` and `FalconLinear`: the same product)
whose input is a multiple of 32 and output a multiple of 16 (the kernel's shapes); every other weight matrix a step
multiplies (other shapes, MoE experts stored as one tensor, convolutions) stays float and is counted in
`QuantFacts.dequantized` ("kept float"). A model none of whose layers fits is refused in one line. CPU only: the
CUDA int4 kernel path is not built (no GPU was lent to check it on).
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import ModelLoadError
from .gguf_quant import BF16_ROUNDOFF, GROUP, KERNEL_SCALE_DTYPE, GroupedInt4
from .hf_stored import give_back
from .qlinear import (EXACT_SCORES, FusedQLinear, QLinear, QLMHead, chosen_kernel, kernel_available, quantized_modules,
                      step_weight_bytes)

QUANTIZE = ("none", "int4", "int8")  # int8: core/model/quant/hf_stored.py (Q8_0 blocks, ggml's kernels)
SOURCE = "int4"  # GroupedInt4.source for a matrix quantized here (a GGUF's say its block type)
FUSE = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# rows of a matrix quantized at once: its float32 temporaries (~4 copies of the slice) stay a few MB, not 4 copies of
# a 151,936-row LM head (2.5 GB at Qwen3-0.6B's shapes)
ROWS_AT_ONCE = 4096


def quantize_matrix(weight: torch.Tensor) -> GroupedInt4:
    """weight [N, K] (any float dtype, K a multiple of 32) -> its 4-bit groups (the module docstring's rule).

    The group's scale and zero are rounded to bfloat16 first and the levels chosen for the rounded ones, so
    `dequantize(torch.bfloat16)` is what the kernel multiplies by, and each weight is within scale / 2 of it
    (plus what the rounding of the constants moved the grid by: `quantization_bound`)."""
    n, k = weight.shape
    if k % GROUP:
        raise ValueError(f"the input size must be a multiple of {GROUP}, got {k}")
    if n > ROWS_AT_ONCE:  # each row's groups are its own: in slices, the float32 temporaries stay one slice's
        parts = [quantize_matrix(weight[i:i + ROWS_AT_ONCE]) for i in range(0, n, ROWS_AT_ONCE)]
        return GroupedInt4(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]),
                           torch.cat([p.zero for p in parts]), SOURCE)
    w = weight.detach().float().reshape(n, k // GROUP, GROUP)  # [N, G, 32]
    low, high = w.amin(dim=-1), w.amax(dim=-1)  # [N, G]
    scale = ((high - low) / 15.0).to(KERNEL_SCALE_DTYPE).float()
    zero = (low + 8.0 * scale).to(KERNEL_SCALE_DTYPE).float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant group: every level is `zero`
    q = torch.round((w - zero.unsqueeze(-1)) / safe.unsqueeze(-1) + 8.0).clamp_(0, 15)
    q = torch.where((scale > 0).unsqueeze(-1), q, torch.full_like(q, 8.0))
    return GroupedInt4(q.to(torch.uint8).reshape(n, k), scale, zero, SOURCE)


def quantization_bound(matrix: GroupedInt4) -> torch.Tensor:
    """Per group [N, K // 32]: the most a weight can differ from its 4-bit value: half a level, plus the shift
    of the grid's ends by the bfloat16 rounding of scale (8 levels from zero) and zero."""
    return 0.5 * matrix.scale + 2.0 * BF16_ROUNDOFF * (8.0 * matrix.scale.abs() + matrix.zero.abs())


def _linear_kinds() -> tuple[type, ...]:
    """Layers that compute x W^T + b exactly as nn.Linear does: nn.Linear itself, transformers' Conv1D (GPT-2: the
    same product with W stored [in, out]) and FalconLinear (nn.Linear's product written out). Other subclasses
    (adapters, other quantizers) are left alone: their forward may be something else."""
    kinds: list[type] = [nn.Linear]
    try:
        from transformers.pytorch_utils import Conv1D

        kinds.append(Conv1D)
    except ImportError:
        pass
    try:
        from transformers.models.falcon.modeling_falcon import FalconLinear

        kinds.append(FalconLinear)
    except ImportError:
        pass
    return tuple(kinds)


def _weight_of(module: nn.Module) -> torch.Tensor:
    """The [out, in] matrix of a linear layer (Conv1D stores its transpose)."""
    return module.weight.t() if type(module).__name__ == "Conv1D" else module.weight


def _fits(module: nn.Module, kinds: tuple[type, ...]) -> bool:
    if type(module) not in kinds or module.weight.dim() != 2 or module.weight.device.type != "cpu":
        return False
    out_features, in_features = _weight_of(module).shape
    return in_features % GROUP == 0 and out_features % 16 == 0


def _float_matrices(model: nn.Module) -> int:
    """Weight matrices (2-D or stacked experts) a step still multiplies in float: every such parameter except
    embedding tables, which are read a row at a time, and a 4-bit head's float rows (read for its top scores)."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = model.get_output_embeddings()
    if isinstance(head, QLMHead) and head.weight is not None:
        tables.add(id(head.weight))
    seen: set[int] = set()
    count = 0
    for parameter in model.parameters():
        if parameter.dim() >= 2 and id(parameter) not in tables and id(parameter) not in seen:
            seen.add(id(parameter))
            count += 1
    return count


def _parent_and_name(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parent, _, child = path.rpartition(".")
    return (model.get_submodule(parent) if parent else model), child


def quantize_model(model: nn.Module) -> int:
    """Replace `model`'s fitting linear layers by 4-bit ones, in place (q/k/v and gate/up fused); returns the count
    of weight matrices still multiplied in float (`_float_matrices`: layers the kernel cannot take, MoE experts
    stored as one tensor, convolutions). Raises ModelLoadError where it cannot run, or when nothing in the layers
    fits (only the head would be 4-bit: not what --quantize promises)."""
    if not kernel_available():
        raise ModelLoadError("--quantize int4 needs torch's int4 CPU kernel (torch >= 2.5); upgrade torch or drop "
                             "--quantize")
    if quantized_modules(model):
        raise ModelLoadError("--quantize int4: this model's weights are 4-bit already (a 4-bit GGUF runs as "
                             "stored); drop --quantize")
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ModelLoadError("--quantize int4 runs on CPU only (the CUDA int4 path is not built); pass --device "
                             "cpu or drop --quantize")
    try:
        kernel = chosen_kernel()
    except ValueError as err:
        raise ModelLoadError(str(err)) from None
    kinds = _linear_kinds()
    head = model.get_output_embeddings()
    layers = [m for m in model.modules() if m is not head and _fits(m, kinds)]
    if not layers:
        raise ModelLoadError("--quantize int4: none of this model's layers is a linear layer the int4 kernel takes "
                             f"(inputs a multiple of {GROUP}, outputs of 16); drop --quantize")
    with torch.no_grad():
        for parent in list(model.modules()):
            for group in FUSE:
                members = [parent._modules.get(n) for n in group]
                if all(m is not None and m is not head and _fits(m, kinds) for m in members) and \
                        len({_weight_of(m).shape[1] for m in members}) == 1:
                    fused = FusedQLinear.from_matrices([quantize_matrix(_weight_of(m)) for m in members], kernel)
                    parent.add_module("fused_" + "_".join(n.removesuffix("_proj") for n in group), fused)
                    biases = [None if m.bias is None else m.bias.detach().float() for m in members]
                    for name, part in zip(group, fused.parts(biases)):
                        setattr(parent, name, part)
        # the head last: after the float32 cast, which its float rows (a tied head's: the embedding's) need. Paths,
        # not modules: a layer replaced is let go at once, so a bf16 model's float weights leave as the 4-bit come
        body = [path for path, m in model.named_modules() if m is not head and _fits(m, kinds)]
        for path in body + [path for path, m in model.named_modules() if m is head]:
            module = model.get_submodule(path)
            if module is head:
                # everything around the 4-bit products computes in float32 (the kernel's activations are bf16); cast
                # only now that the body's matrices are 4-bit: a bf16 model never holds a float32 copy of them
                _float_rest(model)
            if not _fits(module, kinds):
                continue
            parent, name = _parent_and_name(model, path)
            bias = None if module.bias is None else module.bias.detach().float()
            if module is head:
                tied = head.weight is getattr(model.get_input_embeddings(), "weight", None)
                replacement = QLMHead.from_matrix(quantize_matrix(_weight_of(module)), bias=bias, kernel=kernel,
                                                  exact_scores=EXACT_SCORES,
                                                  weight=None if tied else nn.Parameter(
                                                      _weight_of(module).detach().contiguous(), requires_grad=False))
                if tied:
                    replacement.tie(model.get_input_embeddings().weight)
            else:
                replacement = QLinear.from_matrix(quantize_matrix(_weight_of(module)), bias=bias, kernel=kernel)
            setattr(parent, name, replacement)
            if module is not head:  # its float weight read by nothing now (a tied head's is the embedding table)
                give_back(_weight_of(module))
            del module, replacement
        if head is None or not any(m is head for m in model.modules()):
            _float_rest(model)  # no head among the modules: the cast above did not run
    return _float_matrices(model)


def _float_rest(model: nn.Module) -> None:
    """`model.float()` for everything but its 4-bit modules, whose bfloat16 scales are what the kernel reads. In
    place (`.data`), so a Parameter shared by two modules (a tied embedding) stays one."""
    skip = {id(m) for q in quantized_modules(model) for m in q.modules()}
    for module in model.modules():
        if id(module) in skip:
            continue
        for p in module.parameters(recurse=False):
            if p.is_floating_point() and p.dtype != torch.float32:
                stored, p.data = p.data, p.data.float()
                give_back(stored)
        for name, b in list(module.named_buffers(recurse=False)):
            if b.is_floating_point() and b.dtype != torch.float32:
                setattr(module, name, b.float())


def quantized_facts(model: nn.Module, kept_float: int):
    """The model event's account (ModelFacts.quantization) of a model quantized by `quantize_model`."""
    from ...runs.facts import QuantFacts

    out = model.get_output_embeddings()
    modules = quantized_modules(model)
    kernel = modules[0].kernel
    exact = out.exact_scores if isinstance(out, QLMHead) else 0
    if not isinstance(out, QLMHead):
        head = "float (does not fit the kernel)"
    else:
        head = f"int4, its {exact} highest scores recomputed in float32" if exact else "int4"
    count = sum(len(m.widths) if isinstance(m, FusedQLinear) else 1 for m in modules if not isinstance(m, QLMHead))
    return QuantFacts(blocks=SOURCE, bits=4, group=GROUP, scale_dtype=str(KERNEL_SCALE_DTYPE).removeprefix("torch."),
                      activation_dtype=kernel.activations, head=head,
                      exact_scores=exact, kernel=kernel.name,
                      matrices=count, dequantized=kept_float, weight_bytes=step_weight_bytes(model),
                      quantized_here=True)
