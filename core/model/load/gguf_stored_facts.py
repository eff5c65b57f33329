"""The model event's account of a GGUF run as stored (core/model/load/gguf_stored.py): read off the model's modules,
never estimated. Per format the matrices and their bytes (`QuantFacts.formats`, e.g. "Q4_K ×12 1.6 MB, Q6_K ×3 1.9 MB;
float32: 9 norms"), the kernels (ggml's vec_dot, its q4_0x8 / q4_Kx8 gemv on matrices repacked as llama-server
repacks them; the pinned llama.cpp), the activations' rounding (llama.cpp's: each activation row converted to the
format's 8-bit blocks for a decode step's products), the head ("tied: token_embd Q6_K"), and what was de-quantized
instead (with its float32 bytes)."""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

# The bits of a value and the values sharing one scale, per ggml format (gguf-py's names; ggml-common.h's blocks):
# the K-quants' sub-blocks under one fp16 super-block scale. Formats not listed: bits from the bytes per value.
BITS_GROUP = {"Q8_0": (8, 32), "Q4_0": (4, 32), "Q4_1": (4, 32), "Q5_0": (5, 32), "Q5_1": (5, 32), "Q2_K": (2, 16),
              "Q3_K": (3, 16), "Q4_K": (4, 32), "Q5_K": (5, 32), "Q6_K": (6, 16), "F16": (16, 1), "BF16": (16, 1),
              "F32": (32, 1)}
FLOAT_FORMATS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}  # their activations: ggml's vec_dot_type


def _bits_group(type_name: str) -> tuple[int, int]:
    if type_name in BITS_GROUP:
        return BITS_GROUP[type_name]
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return max(1, size * 8 // block), block


def _megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _matrices(model: nn.Module) -> dict[int, object]:
    found: dict[int, object] = {}
    for module in model.modules():
        matrix = getattr(module, "matrix", None)
        if matrix is not None and hasattr(matrix, "type_name"):
            found.setdefault(matrix.raw.data_ptr(), matrix)
    return found


def stored_facts(model: nn.Module, dequantized: dict[str, tuple[str, int]]):
    """ModelFacts.quantization for `model` loaded by gguf_stored.load_stored; `dequantized`: its StoredLoad's."""
    from ...runs.facts import QuantFacts
    from ..quant.ggml_linear import GGMLLinear

    matrices = _matrices(model)
    counts: Counter = Counter()
    sizes: Counter = Counter()
    for matrix in matrices.values():
        counts[matrix.type_name] += 1
        sizes[matrix.type_name] += matrix.nbytes
    order = sorted(counts, key=lambda t: -sizes[t])
    main = order[0] if order else "F32"
    bits, group = _bits_group(main)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    floats = [(n, p) for n, p in model.named_parameters()]
    norms = sum(1 for n, p in floats if p.dim() == 1 and not n.endswith(".bias"))
    biases = sum(1 for n, p in floats if n.endswith(".bias"))
    float_words = ", ".join(f"{n} {what}" for n, what in ((norms, "norms"), (biases, "biases")) if n)
    formats = ", ".join(f"{t} ×{counts[t]} {_megabytes(sizes[t])}" for t in order)
    if dequantized:
        kinds = Counter(kind for kind, _ in dequantized.values())
        formats += "; de-quantized to float32: " + ", ".join(f"{k} ×{n}" for k, n in sorted(kinds.items())) + \
            f" {_megabytes(sum(b for _, b in dequantized.values()))}"
    if float_words:
        formats += f"; float32: {float_words}"
    quantized = [t for t in order if t not in FLOAT_FORMATS]
    activations = "int8" if quantized else FLOAT_FORMATS.get(main, "float32")
    linear = {m.matrix.raw.data_ptr(): m.matrix for m in model.modules() if isinstance(m, GGMLLinear)}
    head_weight = getattr(head, "_parameters", {}).get("weight")  # (a Parameter, never a GGMLLinear's copy)
    read = sum(m.nbytes for m in linear.values())  # every product's matrix, the head's included
    read += sum(p.nbytes for n, p in floats if not (_is_table(embed, p) and p is not head_weight))
    return QuantFacts(
        blocks="+".join(order) or "F32", bits=bits, group=group,
        scale_dtype="float16" if quantized else "none", activation_dtype=activations,
        head=_head_words(embed, head), exact_scores=0,
        matrices=len(linear),
        dequantized=len(dequantized), dequantized_blocks="+".join(sorted({k for k, _ in dequantized.values()})),
        weight_bytes=int(read), kernel=_kernel_words(model), formats=formats)


def _kernel_words(model: nn.Module) -> str:
    """ggml's kernels for the decode step's products: vec_dot on matrices as stored, the interleaved gemv on those
    repacked as llama-server repacks them (GGMLLinear.kernel), with how many of each format."""
    from ..quant.ggml_linear import GGMLLinear

    linears = {id(m): m for m in model.modules() if isinstance(m, GGMLLinear)}.values()
    packed = Counter((m.kernel, m.matrix.type_name) for m in linears if m.packed is not None)
    repacked = ", ".join(f"{kernel} on {n} repacked {name}" for (kernel, name), n in sorted(packed.items()))
    if any(m.packed is None for m in linears) or not packed:
        return f"ggml's vec_dot, llama.cpp {_llama_version()}" + (f"; {repacked}" if repacked else "")
    return f"ggml's {repacked}, llama.cpp {_llama_version()}"


def _is_table(embed, parameter: torch.Tensor) -> bool:
    """The input embedding's float table: a decode step reads one row of it, not all."""
    return isinstance(embed, nn.Embedding) and embed.weight is parameter


def _head_words(embed, head) -> str:
    matrix, table = getattr(head, "matrix", None), getattr(embed, "matrix", None)
    if matrix is not None and matrix is table:
        return f"tied: token_embd {matrix.type_name}"
    if matrix is not None:
        return f"output {matrix.type_name}"
    return "float32 (de-quantized: ggml does not run its format)" if head is not None else "none"


def _llama_version() -> str:
    from ..native.llama_sdist import VERSION

    return VERSION
