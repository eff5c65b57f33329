"""An HF folder's float weights run as stored on CPU, and `--quantize int8`.

A bf16 torch tensor's bytes are ggml's BF16 rows, an fp16 one's its F16 rows and a float32 one's its F32 rows. So a
model loaded in its own dtype (core/model/load/loader.py: --dtype auto on CPU) has each linear layer's weight viewed,
without a copy, as a GGMLMatrix and multiplied by ggml's kernels (core/model/quant/ggml_linear.py), and the native
step for GGUF-stored models (core/model/native/ggml_native.py) decodes it like a GGUF file: `run_as_stored`.
Around those products the model computes in float32, as llama.cpp does: the norms and biases (small) become float32,
and the embedding table stays a torch nn.Embedding in its dtype (no copy) whose rows are cast to float32 as they
leave it. What the kernels round: ggml's BF16 / F16 dot products round the activations to the weights' dtype first
(their vec_dot_type), as llama.cpp does; F32 rounds nothing. A prefill's products (more rows than a step's) go
through torch's own F.linear on the same memory where the CPU has the dtype's instructions (`StoredLinear`: faster
there), a 16-bit one rounding their outputs to the dtype too.

Where ggml's library is not available, or the native step does not serve the architecture, the model stays as
transformers loaded it and torch runs it in its dtype; a 16-bit dtype this CPU has no instructions for (torch's
bf16 / fp16 products are then emulated, several times slower than float32: BENCHMARKS.md) is cast to float32 instead.
The reason is the load's notice.

`quantize_int8` (--quantize int8): every linear layer whose input is a multiple of 32 (the embedding table is not
one: it stays as loaded) becomes Q8_0 rows, ggml's reference quantization (`quantize_row_q8_0_ref`, what
llama-quantize runs), one matrix at a time: the float32 copy of one matrix at most is held besides the model.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import torch.nn.functional as F

from ...errors import ModelLoadError
from ...runs.events import LoadProgress
from .ggml_linear import PRODUCT_ROWS, GGMLLinear

__all__ = ["STORED_TYPES", "Stored", "cpu_lacks", "give_back", "quantize_int8", "run_as_stored", "stored_linears"]

STORED_TYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
INT8 = "Q8_0"
BLOCK = 32  # values per Q8_0 block (and the most any of the float types needs: 1)
# the CPU flags with which torch multiplies in a 16-bit dtype without emulating it (oneDNN's AVX512-BF16 / AMX paths)
NATIVE_FLAGS = {torch.bfloat16: ("avx512_bf16", "amx_bf16"), torch.float16: ("avx512_fp16", "amx_fp16")}


@dataclass(frozen=True)
class Stored:
    """What `run_as_stored` did: `facts` (the model facts' QuantFacts; None: torch runs the model) and `notice`
    (why ggml's kernels do not run it, or why its weights were cast; None: nothing to say)."""

    facts: object | None
    notice: str | None = None


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no flags known, so no 16-bit dtype is taken as native
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def cpu_lacks(dtype: torch.dtype) -> str | None:
    """None where this CPU multiplies in `dtype` natively (float32 always); else which instructions it lacks."""
    wanted = NATIVE_FLAGS.get(dtype)
    if wanted is None or any(flag in _cpu_flags() for flag in wanted):
        return None
    return f"this CPU has no {' / '.join(f.upper().replace('_', '-') for f in wanted)} instructions"


def stored_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The layers whose weights become ggml rows: exact nn.Linear (subclasses may compute something else) on CPU with a
    2-D weight whose input ggml's row of the dtype can hold (a multiple of 32: Q8_0's block, and every float type)."""
    return [(path, m) for path, m in model.named_modules()
            if type(m) is nn.Linear and m.weight.device.type == "cpu" and m.in_features % BLOCK == 0]


def _parent_and_name(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parent, _, child = path.rpartition(".")
    return (model.get_submodule(parent) if parent else model), child


def _view(weight: torch.Tensor):
    """The weight [N, K] as ggml rows of its dtype: the same memory, read as bytes (no copy unless it is not
    contiguous, which no loaded nn.Linear is)."""
    from .ggml_linear import GGMLMatrix

    w = weight.detach().contiguous()
    rows, cols = w.shape
    return GGMLMatrix(w.view(torch.uint8), STORED_TYPES[w.dtype], rows, cols)


class StoredLinear(GGMLLinear):
    """A GGMLLinear over a weight's own memory (bf16 / fp16 / float32) whose prefill (more than PRODUCT_ROWS rows)
    goes through torch's F.linear on that weight in its dtype, where the CPU has the dtype's instructions: for bf16
    2-3x faster there than ggml's product or the matrix de-quantized in tiles (BENCHMARKS.md, "HF folders as
    stored"); for float32 no tile is copied. A 16-bit prefill's outputs are rounded to the dtype (oneDNN's), its
    inputs as ggml's product rounds them."""

    def __init__(self, matrix, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__(matrix, bias)
        self._stored = weight.detach()  # the same memory as `matrix.raw`; not a Parameter (`matrix` is the weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() // self.in_features <= PRODUCT_ROWS:
            return super().forward(x)
        y = F.linear(x.to(self._stored.dtype), self._stored).to(torch.float32)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)


def _float_around(model: nn.Module, linears: set[int]):
    """Everything but the linear layers' matrices (already ggml's) and the embedding table computes in float32:
    norms and biases cast (small), the embedding's rows cast as they leave it. Returns what undoes it."""
    cast = [(p, p.dtype) for m in model.modules() if id(m) not in linears and not isinstance(m, nn.Embedding)
            for p in m.parameters(recurse=False) if p.is_floating_point() and p.dtype != torch.float32]
    for p, _ in cast:
        p.data = p.data.float()  # exact: a 16-bit value is a float32 one
    hooks = [m.register_forward_hook(_rows_to_float32) for m in model.modules() if isinstance(m, nn.Embedding)]

    def undo() -> None:
        for p, dtype in cast:
            p.data = p.data.to(dtype)  # exact: they were that dtype's values
        for hook in hooks:
            hook.remove()

    return undo


def _rows_to_float32(_module, _inputs, output):
    return output.float()


def give_back(tensor: torch.Tensor) -> int:
    """Drop a weight that nothing reads any more from memory where it lies in a memory map of its file: transformers
    maps a safetensors file (private, copy-on-write), and its pages, once read, stay resident and counted in the
    process's memory as long as any tensor of the file lives (the embedding table does). Only the whole pages
    inside the tensor, and only in a map of a file: read again from the file if ever touched. Anonymous memory is
    never touched (the allocator may hand it out again). Hand-written: ggml's bridge's `release`
    (core/model/native/ggml_memory.cpp) refuses a writable map, which transformers' is. Returns the bytes given
    back (0 on a system without /proc/self/maps or madvise)."""
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                low, high = (int(x, 16) for x in fields[0].split("-"))
                if low <= start and end <= high:
                    if len(fields) < 6 or fields[4] == "0" or not fields[5].startswith("/"):
                        return 0  # anonymous memory, or not a file's
                    break
            else:
                return 0
        page = os.sysconf("SC_PAGE_SIZE")
        first, last = -(-start // page) * page, end // page * page
        if last <= first:
            return 0
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), MADV_DONTNEED) != 0:
            return 0
        return last - first
    except (OSError, ValueError, AttributeError):
        return 0


MADV_DONTNEED = 4  # Linux's <sys/mman.h>


def _replace(model: nn.Module, make, keep: bool = True) -> list:
    """Each of `stored_linears` replaced by `make(module)` (a GGMLLinear); returns [(path, the old module)] (keep=False:
    none kept, each old weight given back as its layer is replaced, unless the embedding table shares it)."""
    table = getattr(model.get_input_embeddings(), "weight", None)
    old = []
    for path in [path for path, _ in stored_linears(model)]:
        module = model.get_submodule(path)
        parent, name = _parent_and_name(model, path)
        matrix = make(module)
        bias = None if module.bias is None else module.bias.detach().float()
        dtype = module.weight.dtype
        if matrix.type_name == STORED_TYPES.get(dtype) and cpu_lacks(dtype) is None:
            layer = StoredLinear(matrix, module.weight, bias=bias)
        else:
            layer = GGMLLinear(matrix, bias=bias)
        setattr(parent, name, layer)
        if keep:
            old.append((path, module))
        elif table is None or module.weight.data_ptr() != table.data_ptr():
            give_back(module.weight)
        del module, layer
    return old


def run_as_stored(model: nn.Module, progress=None) -> Stored:
    """`model` (loaded in its stored dtype, on CPU) prepared to decode with its weights as stored: viewed as ggml
    rows where the library loads and the native step serves it, else left to torch (16-bit weights this CPU cannot
    multiply natively: cast to float32). The module docstring says what each costs."""
    dtype = _linear_dtype(model)
    if dtype is None:  # no linear layer at all: nothing to view
        return Stored(None)
    if dtype not in STORED_TYPES:  # e.g. float64: not a type ggml multiplies, nor one worth keeping on a CPU
        model.float()
        return Stored(None, f"{_name(dtype)} weights cast to float32")
    why = _ggml_problem(progress, build=False)  # a GGUF load or --quantize int8 builds it: minutes, said as such
    if why is None:
        old = _replace(model, lambda m: _view(m.weight))
        undo = _float_around(model, {id(m) for m in model.modules() if isinstance(m, GGMLLinear)})
        from ..native.ggml_native import ggml_step, why_not

        if ggml_step(model) is not None:
            return Stored(stored_facts(model, STORED_TYPES[dtype]))
        why = why_not(model)
        undo()
        for path, module in old:  # back to transformers' layers: torch runs the model
            parent, name = _parent_and_name(model, path)
            setattr(parent, name, module)
    lacking = cpu_lacks(dtype)
    if lacking is not None:
        model.float()
        return Stored(None, f"{_name(dtype)} weights cast to float32 ({lacking}; ggml's kernels: {why})")
    if dtype == torch.float32:
        return Stored(None)
    return Stored(None, f"{_name(dtype)} weights run by torch ({why})")


def quantize_int8(model: nn.Module, progress=None):
    """--quantize int8: every `stored_linears` layer (the LM head too, tied or not) replaced by a GGMLLinear over its
    Q8_0 rows, one matrix at a time; the rest computes in float32 (`_float_around`). Returns the model facts'
    QuantFacts. Raises ModelLoadError (one line) where ggml's library cannot be had or no layer fits."""
    why = _ggml_problem(progress, build=True)
    if why is not None:
        raise ModelLoadError(f"--quantize int8 runs on ggml's kernels, which are not available ({why}); drop "
                             "--quantize or use --quantize int4")
    from .ggml_linear import GGMLMatrix

    if not stored_linears(model):
        raise ModelLoadError(f"--quantize int8: none of this model's layers is a linear layer whose input is a "
                             f"multiple of {BLOCK}; drop --quantize")
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ModelLoadError("--quantize int8 runs on CPU only; pass --device cpu or drop --quantize")

    def q8(module: nn.Linear):
        w = module.weight.detach()
        raw = torch.cat([GGMLMatrix.quantize(w[i:i + ROWS], INT8).raw
                         for i in range(0, w.shape[0], ROWS)])  # in slices: one slice's float32 copy at a time
        return GGMLMatrix(raw, INT8, w.shape[0], w.shape[1])

    with torch.no_grad():
        _replace(model, q8, keep=False)  # each bf16 weight freed as its Q8_0 rows come: the model + one matrix
        _float_around(model, {id(m) for m in model.modules() if isinstance(m, GGMLLinear)})
    return stored_facts(model, INT8)


ROWS = 4096  # rows quantized at once (their float32 copy: 16 MB at a 1024-wide input)


def stored_facts(model: nn.Module, blocks: str):
    """The model facts' account (QuantFacts) of a model whose linear layers `run_as_stored` or `quantize_int8`
    made ggml rows of type `blocks`."""
    from ...runs.facts import QuantFacts
    from ..native.llama_sdist import VERSION  # the llama.cpp whose ggml is built (as a GGUF's facts say it)

    layers = [m for m in model.modules() if isinstance(m, GGMLLinear)]
    head = model.get_output_embeddings()
    embedding = model.get_input_embeddings()
    tied = isinstance(head, GGMLLinear) and isinstance(embedding, nn.Embedding) and \
        head.matrix.raw.data_ptr() == embedding.weight.data_ptr()
    if not isinstance(head, GGMLLinear):
        head_words = "torch (does not fit)"
    elif blocks == INT8:
        head_words = f"{INT8} (tied: the embedding's rows quantized)" if _was_tied(model) else INT8
    else:
        head_words = f"{blocks}, tied: the embedding's rows" if tied else blocks
    activations = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", INT8: "int8"}[blocks]
    float_kept = sum(1 for m in model.modules() if type(m) is nn.Linear)
    return QuantFacts(blocks=blocks, bits=8 if blocks == INT8 else torch.finfo(_dtype_of(blocks)).bits,
                      group=BLOCK if blocks == INT8 else 1, scale_dtype="float16" if blocks == INT8 else "none",
                      activation_dtype=activations, head=head_words, exact_scores=0, matrices=len(layers),
                      dequantized=float_kept, weight_bytes=sum(m.matrix.nbytes for m in layers),
                      quantized_here=blocks == INT8, kernel=f"ggml's vec_dot, llama.cpp {VERSION}")


def _was_tied(model: nn.Module) -> bool:
    return bool(getattr(model.config, "tie_word_embeddings", False))


def _dtype_of(blocks: str) -> torch.dtype:
    return next(d for d, name in STORED_TYPES.items() if name == blocks)


def _linear_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype most of the linear layers' values are in (what the folder stores them as)."""
    counts: dict[torch.dtype, int] = {}
    for _, module in stored_linears(model):
        counts[module.weight.dtype] = counts.get(module.weight.dtype, 0) + module.weight.numel()
    return max(counts, key=counts.get) if counts else None


def _ggml_problem(progress, build: bool) -> str | None:
    """None when ggml's library is bound (build=True: building it first where it is not built, with progress; else
    only one already built); otherwise one line why not."""
    from . import ggml_linear
    from ..native import q4_native

    if not build:
        # tokentui's own library first: a CPU load builds it anyway (selection), and ggml's kernels bind into it
        q4_native.load(progress if progress is not None else _no_progress)
        return ggml_linear.available()
    return ggml_linear.load(progress if progress is not None else _no_progress)


def _no_progress(_: LoadProgress) -> None:
    pass


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
