"""GGUF tensors kept as stored (their raw blocks, memory-mapped) and run by ggml's own CPU kernels: `GGMLMatrix` (one
matrix's bytes and format), `GGMLLinear` and `GGMLEmbedding` (the modules a model's Linear / Embedding become).

Why ggml's kernels: llama.cpp's libggml-cpu.so has a tuned dot product for every block format a GGUF file uses (Q8_0,
Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, F16, BF16, the IQ formats ...); a Q4_K_M file mixes several inside one layer. It is
built from the pinned llama.cpp sdist (core/model/native/ggml_build.py) and bound into tokentui's own library
(core/model/native/ggml_ops.cpp: the torch operations `torch.ops.tokentui_ggml.*`), so a product gives llama.cpp's
values: each activation row converted once to the format's 8-bit (or 16-bit) activation blocks, one `vec_dot` per
weight row. `load(progress)` binds it (building it on a first use); `available()` says whether it is bound.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Callable

import gguf
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...runs.events import LoadProgress

# The formats the pinned ggml runs on the CPU (its CPU traits with a vec_dot: ggml-cpu.c; ggml_ops.cpp asks the
# bound library, and tests/unit/test_ggml_kernels.py checks this list against it), by gguf-py's names.
RUNNABLE = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                      "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS",
                      "TQ1_0", "TQ2_0", "MXFP4"})
# A GGMLLinear input of at most this many rows (a decode step's one, a fan-out's few) goes through ggml's product;
# more (a prefill) through the matrix de-quantized a tile at a time and torch's float32 F.linear, which is faster
# there (measured: BENCHMARKS.md, "ggml's kernels").
PRODUCT_ROWS = 16
TILE_VALUES = 1 << 20  # weights de-quantized at a time on the F.linear path (4 MB of float32)
# torch.from_numpy warns on a read-only array (a GGUF file's memory map): nothing here writes to one (the operations
# take its bytes as const), so exactly that warning is silenced where a file's tensor is wrapped
_READ_ONLY_WARNING = "The given NumPy array is not writable"


def _ops():
    return torch.ops.tokentui_ggml


# ------------------------------------------------------------------------------------------------- binding ggml
_BOUND: dict[str, str] = {}  # "path": the library bound into this process (one, for its lifetime)
_LOCK = threading.Lock()


def available() -> str | None:
    """None when ggml's kernels can run here now (bound by `load`, or bound now from libraries already built), else
    one line why not. Builds nothing."""
    from ..native import ggml_build, q4_native

    if _BOUND:
        return None
    path = ggml_build.library_if_built()
    if path is None:
        return f"ggml's CPU library is not built yet (set ${ggml_build.ENV_LIB}, or a GGUF load builds it)"
    if q4_native.would_build():
        return "tokentui's native library is not built yet (a model load builds it)"
    return _bind(str(path))


def load(progress: Callable[[LoadProgress], None]) -> str | None:
    """Load tokentui's library and bind ggml's CPU library into it, building either first where it is missing (said
    as load stages through `progress`); None when bound, else one line why not."""
    from ..native import ggml_build, q4_native

    if _BOUND:
        return None
    why = q4_native.load(progress)
    if why is not None:
        return f"tokentui's native library: {why}"
    try:
        path = ggml_build.library(progress)
    except ggml_build.GGMLUnavailable as err:
        return (str(err).splitlines() or ["ggml's CPU library cannot be had here"])[0]
    return _bind(str(path))


def _bind(path: str) -> str | None:
    """Bind ggml's library at `path` (once per process); None when bound, else one line why not."""
    from ..native import q4_native

    with _LOCK:
        if _BOUND.get("path") == path:
            return None
        why = q4_native.load(lambda _: None)
        if why is not None:
            return f"tokentui's native library: {why}"
        result = _ops().bind(path)
        if result:
            return f"ggml's CPU library {path}: {result.splitlines()[0]}"
        _BOUND["path"] = path
        _register_fakes()
        return None


def _register_fakes() -> None:
    """Shapes of the operations for torch.compile's tracing (a GGMLLinear inside a compiled model)."""
    torch.library.register_fake("tokentui_ggml::product")(
        lambda x, raw, type: x.new_empty((x.shape[0], raw.shape[0])))
    torch.library.register_fake("tokentui_ggml::dequantize")(
        lambda raw, type, k: raw.new_empty((raw.shape[0], k), dtype=torch.float32))
    torch.library.register_fake("tokentui_ggml::rows")(
        lambda raw, type, k, ids: raw.new_empty((ids.numel(), k), dtype=torch.float32))


def _type(name: str) -> int:
    return int(gguf.GGMLQuantizationType[name])


# ------------------------------------------------------------------------------------------------- the matrix
@dataclass(frozen=True)
class GGMLMatrix:
    """One matrix as a GGUF file stores it: `raw` [rows, row_bytes] uint8, contiguous, on the CPU (usually a view of
    the file's memory map: never written), its rows `cols` values each in ggml format `type_name` (gguf-py's
    GGMLQuantizationType name). ValueError (one line) where these do not fit together."""

    raw: torch.Tensor
    type_name: str
    rows: int
    cols: int

    def __post_init__(self):
        if self.type_name not in RUNNABLE:
            raise ValueError(f"ggml format {self.type_name!r} has no CPU kernel here "
                             f"(runnable: {', '.join(sorted(RUNNABLE))})")
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[self.type_name]]
        raw = self.raw
        if not isinstance(raw, torch.Tensor) or raw.dtype != torch.uint8 or raw.dim() != 2 \
                or raw.device.type != "cpu" or not raw.is_contiguous():
            what = f"{raw.dtype} {tuple(raw.shape)}" if isinstance(raw, torch.Tensor) else type(raw).__name__
            raise ValueError(f"a {self.type_name} matrix's bytes must be a contiguous [rows, row_bytes] uint8 CPU "
                             f"tensor, not {what}")
        if self.cols <= 0 or self.cols % block:
            raise ValueError(f"{self.cols} columns are not a positive multiple of {self.type_name}'s block of {block}")
        row_bytes = self.cols // block * type_size
        if tuple(raw.shape) != (self.rows, row_bytes):
            raise ValueError(f"a {self.rows} x {self.cols} {self.type_name} matrix takes [{self.rows}, {row_bytes}] "
                             f"bytes, not {list(raw.shape)}")

    @property
    def type(self) -> int:
        """ggml's number for the format (GGMLQuantizationType's value)."""
        return _type(self.type_name)

    @property
    def nbytes(self) -> int:
        return self.raw.numel()

    @classmethod
    def from_gguf_tensor(cls, tensor) -> GGMLMatrix:
        """A gguf-py ReaderTensor's matrix, its bytes the file's memory map (not copied). ValueError (one line) for
        a tensor that is not a matrix or whose format ggml cannot run."""
        name = tensor.tensor_type.name
        dims = [int(d) for d in tensor.shape]  # ggml's order: the values a row first
        if len(dims) != 2:
            raise ValueError(f"tensor {tensor.name} has {len(dims)} dimensions {dims}, not a matrix's 2")
        cols, rows = dims
        data = np.asarray(tensor.data)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_READ_ONLY_WARNING, category=UserWarning)
            raw = torch.from_numpy(data.view(np.uint8).reshape(rows, -1))
        return cls(raw, name, rows, cols)

    @classmethod
    def quantize(cls, values: torch.Tensor, type_name: str) -> GGMLMatrix:
        """values [rows, cols] in format `type_name` by ggml's reference quantization (what llama-quantize does
        without an importance matrix); for tests and for formats gguf-py cannot quantize (the K-quants). Needs the
        library bound (`load`)."""
        values = values.detach().to(torch.float32).contiguous()
        raw = _ops().quantize(values, _type(type_name), False)
        return cls(raw, type_name, values.shape[0], values.shape[1])

    def take_rows(self, order: torch.Tensor) -> GGMLMatrix:
        """The matrix with its rows in `order` (a permutation; llama GGUFs store q/k rows permuted for ggml's
        rotation): a copy of this matrix's bytes only."""
        order = torch.as_tensor(order, dtype=torch.long)
        if order.shape != (self.rows,) or not torch.equal(torch.sort(order).values, torch.arange(self.rows)):
            raise ValueError(f"take_rows needs a permutation of the {self.rows} rows")
        return GGMLMatrix(self.raw[order].contiguous(), self.type_name, self.rows, self.cols)

    def dequantize(self) -> torch.Tensor:
        """The matrix as float32 [rows, cols] (a new tensor), by ggml's to_float."""
        return _ops().dequantize(self.raw, self.type, self.cols)


# ------------------------------------------------------------------------------------------------- the modules
class GGMLLinear(nn.Module):
    """A Linear whose weight is a GGMLMatrix [out_features, in_features]: y = x W^T (+ bias) by ggml's product
    (decode: the activations converted to the format's 8-bit blocks, as llama.cpp does), or for more than
    PRODUCT_ROWS rows, by torch's float32 F.linear on the matrix de-quantized a tile at a time."""

    def __init__(self, matrix: GGMLMatrix, bias: torch.Tensor | None = None):
        super().__init__()
        if not isinstance(matrix, GGMLMatrix):
            raise ValueError(f"GGMLLinear takes a GGMLMatrix, not {type(matrix).__name__}")
        self.matrix = matrix
        self.in_features, self.out_features = matrix.cols, matrix.rows
        if bias is not None and tuple(bias.shape) != (matrix.rows,):
            raise ValueError(f"a bias of shape {list(bias.shape)} for {matrix.rows} outputs")
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(torch.float32), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:
        """The weight de-quantized to float32 [out, in]: a copy made on each read (the lens, tied-head checks), not
        kept, since it is 4-8x the stored matrix."""
        return self.matrix.dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] (float32; another float dtype is cast in and the result back) -> [..., out]."""
        flat = x.reshape(-1, self.in_features).to(torch.float32)
        m = self.matrix
        if flat.shape[0] <= PRODUCT_ROWS:
            y = _ops().product(flat, m.raw, m.type)
        else:
            y = _tiled_linear(flat, m)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.matrix.type_name}, " \
               f"bias={self.bias is not None}"


def _tiled_linear(x: torch.Tensor, matrix: GGMLMatrix) -> torch.Tensor:
    """x [M, K] @ W^T with W de-quantized a tile of rows at a time (never the whole float32 matrix at once)."""
    out = x.new_empty((x.shape[0], matrix.rows))
    step = max(1, TILE_VALUES // matrix.cols)
    for r0 in range(0, matrix.rows, step):
        tile = _ops().dequantize(matrix.raw[r0:r0 + step], matrix.type, matrix.cols)  # [step, K]
        out[:, r0:r0 + step] = F.linear(x, tile)
    return out


class GGMLEmbedding(nn.Module):
    """An Embedding whose table is a GGMLMatrix [num_embeddings, embedding_dim]: each id's row de-quantized by
    ggml's to_float (float32)."""

    def __init__(self, matrix: GGMLMatrix):
        super().__init__()
        if not isinstance(matrix, GGMLMatrix):
            raise ValueError(f"GGMLEmbedding takes a GGMLMatrix, not {type(matrix).__name__}")
        self.matrix = matrix
        self.num_embeddings, self.embedding_dim = matrix.rows, matrix.cols

    @property
    def weight(self) -> torch.Tensor:
        """The table de-quantized to float32 [num_embeddings, embedding_dim]: a copy made on each read, not kept."""
        return self.matrix.dequantize()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] int -> [..., embedding_dim] float32."""
        m = self.matrix
        flat = ids.reshape(-1).to(device="cpu", dtype=torch.long)
        return _ops().rows(m.raw, m.type, m.cols, flat).reshape(*ids.shape, m.cols)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, format={self.matrix.type_name}"
