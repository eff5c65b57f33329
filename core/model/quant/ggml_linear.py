"""GGUF tensors kept as stored (their raw blocks, memory-mapped) and run by ggml's own CPU kernels: `GGMLMatrix` (one
matrix's bytes and format), `GGMLLinear` and `GGMLEmbedding` (the modules a model's Linear / Embedding become).

Why ggml's kernels: llama.cpp's libggml-cpu.so has a tuned dot product for every block format a GGUF file uses (Q8_0,
Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, F16, BF16, the IQ formats ...); a Q4_K_M file mixes several inside one layer. It is
built from the pinned llama.cpp sdist (core/model/native/ggml_build.py) and bound into tokentui's own library
(core/model/native/ggml_ops.cpp: the torch operations `torch.ops.tokentui_ggml.*`), so a product gives llama.cpp's
values: each activation row converted once to the format's 8-bit (or 16-bit) activation blocks, one `vec_dot` per
weight row. `load(progress)` binds it (building it on a first use); `available()` says whether it is bound.

Where llama.cpp itself would not run a format as stored, neither does a GGMLLinear: on x86 with AVX2, llama-server
repacks every Q4_0 and Q4_K matrix whose rows are a multiple of 8 into ggml's 8-row interleaved layout and multiplies
by its gemv / gemm kernels (ggml-cpu's repack.cpp); a GGMLLinear does the same at construction (core/model/native/
ggml_repack.cpp), then gives the file's pages of that matrix back (they are read again only if touched), so the
packed copy takes the file's place in memory. $TOKENTUI_GGML_REPACK=0 keeps every matrix as stored (comparisons).

Where the products read a matrix from: a decode step streams every matrix from memory once a token, and streams it
markedly faster from the kernel's 2 MiB transparent huge pages than from a file map's 4 KiB pages (ggml_memory.cpp
says why; BENCHMARKS.md, "Side by side with llama-server", measures it). So a GGMLLinear whose matrix lies in a
file's read-only map (a GGUF's) copies its bytes, unchanged, into memory asked for huge pages (`resident`) and gives
the file's pages back, as a repacked one does; a repacked copy is made in such memory too. Nothing is copied where
the kernel has transparent huge pages turned off (`never`: the copy would gain nothing), for a matrix in anonymous
memory (its pages cannot be given back: it would be held twice), or with $TOKENTUI_GGML_HUGE_PAGES=0 (comparisons).
Finding huge pages is the kernel's own work, slow where memory is fragmented, so a later start's copies are made
while the process still imports torch (core/model/load/ahead.py: `_resident` takes them from there), a load reserves
what its other copies will take ahead of its imports (`reserve_huge_pages`, core/model/load/build.py), and trims
what they left.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Callable

import gguf
import numpy as np
import torch
from torch import nn

from ...runs.events import LoadProgress
from ..load import ahead
from .ggml_settings import (HUGE_PAGES_ENV, REPACK_ENV, ROWS_INTERLEAVED, THP_SETTING,  # noqa: F401 - re-exported
                            huge_pages, repack_enabled)

# The formats the pinned ggml runs on the CPU (its CPU traits with a vec_dot: ggml-cpu.c; ggml_ops.cpp asks the
# bound library, and tests/unit/test_ggml_kernels.py checks this list against it), by gguf-py's names.
RUNNABLE = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                      "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS",
                      "TQ1_0", "TQ2_0", "MXFP4"})
# A GGMLLinear input of at most this many rows (a decode step's one, a fan-out's few) goes through ggml's product
# (one vec_dot per weight row and activation row; for 2 or more rows of Q8_0, llamafile's tinyBLAS). More rows (a
# prompt's) go through llama.cpp's own CPU matrix product, a one-node ggml graph (core/model/native/ggml_mul_mat.cpp),
# as llama-server's prefill multiplies them: its tiled integer kernels for the K-quants and IQ formats, tinyBLAS for
# Q8_0 and the float formats, vec_dot in chunks for the rest; faster than float32 tiles of the de-quantized matrix
# (2-3x on Q5_K / Q6_K / BF16) and with llama.cpp's rounding of the activations, as on a decode step (BENCHMARKS.md,
# issue 37: "A prompt's rows through ggml's graph"). A repacked Q4_0 / Q4_K matrix goes through ggml's interleaved
# gemm at any row count, as llama.cpp's prefill runs it (BENCHMARKS.md, issue 37's prefill).
PRODUCT_ROWS = 16
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


def bound_library() -> str | None:
    """The path of ggml's CPU library bound into this process (its folder keyed by ggml's version and build), or
    None."""
    return _BOUND.get("path")


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
    torch.library.register_fake("tokentui_ggml::mul_mat")(
        lambda x, raw, type: x.new_empty((x.shape[0], raw.shape[0])))
    torch.library.register_fake("tokentui_ggml::rows")(
        lambda raw, type, k, ids: raw.new_empty((ids.numel(), k), dtype=torch.float32))
    torch.library.register_fake("tokentui_ggml::packed_product")(
        lambda x, packed, type, k: x.new_empty((x.shape[0], packed.shape[0])))
    torch.library.register_fake("tokentui_ggml::repack")(lambda raw, type, k, huge=False: torch.empty_like(raw))
    torch.library.register_fake("tokentui_ggml::unpack")(lambda raw, type, k: torch.empty_like(raw))
    torch.library.register_fake("tokentui_ggml::resident")(lambda raw: torch.empty_like(raw))


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
    offset: int | None = None  # where `raw`'s bytes lie in their GGUF file (from_gguf_tensor); None: not a file's

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
        return cls(raw, name, rows, cols, int(tensor.data_offset))

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
def reserve_huge_pages(nbytes: int) -> int:
    """Map `nbytes` of huge-page memory for the matrices a load is about to copy there, its pages faulted in on a
    thread of ggml_memory.cpp's own (`reserve`: where memory is fragmented the kernel compacts it to find each huge
    page, seconds for a 600 MB model, which then overlap the load's imports); -> the bytes reserved (0: none, where
    `huge_pages` says no, ggml is not bound, or a reservation is open). `trim_reserved` closes it."""
    if not _BOUND or not huge_pages() or nbytes <= 0:
        return 0
    return int(_ops().reserve(int(nbytes)))


def trim_reserved() -> int:
    """Close `reserve_huge_pages`'s reservation: its thread stopped, the pages no matrix was carved from given back;
    -> the bytes given back (0 where none was open)."""
    return int(_ops().trim_reserved()) if _BOUND else 0


def _packed(matrix: GGMLMatrix) -> torch.Tensor | None:
    """`matrix`'s bytes in ggml's 8-row interleaved layout ([rows, row_bytes] uint8, the same size; in huge-page
    memory where `huge_pages`), its file pages given back; None where ggml has no interleaved kernel for it here
    (another format or CPU, rows not a multiple of 8, ggml not bound, repacking turned off)."""
    if not _BOUND or not repack_enabled() or matrix.rows % ROWS_INTERLEAVED \
            or matrix.type not in _ops().packed_types():
        return None
    packed = _ops().repack(matrix.raw, matrix.type, matrix.cols, huge_pages())
    _ops().release(matrix.raw)  # a file's read-only map only: any other memory is left as it is
    return packed


def _resident(matrix: GGMLMatrix) -> torch.Tensor | None:
    """A copy of `matrix`'s bytes (the same [rows, row_bytes], unchanged) in huge-page memory, its file pages given
    back; None where its bytes are not in a file's read-only map, or `huge_pages` says no."""
    if not _BOUND or not huge_pages() or not _ops().in_file_map(matrix.raw):
        return None
    copy = _ahead(matrix)
    if copy is None:
        copy = _ops().resident(matrix.raw)
    _ops().release(matrix.raw)
    return copy


def _ahead(matrix: GGMLMatrix) -> torch.Tensor | None:
    """`matrix`'s copy made while the load imported torch (core/model/load/ahead.py), None where there is none. Its
    first and last rows must be the file's: a guard against bytes read from another offset or file."""
    if matrix.offset is None:
        return None
    file = matrix.raw.numpy()
    view = ahead.take(matrix.offset, matrix.nbytes, file[0].tobytes(), file[-1].tobytes())
    return None if view is None else torch.frombuffer(view, dtype=torch.uint8).view(matrix.rows, -1)


class GGMLLinear(nn.Module):
    """A Linear whose weight is a GGMLMatrix [out_features, in_features]: y = x W^T (+ bias) by ggml's kernels: for up
    to PRODUCT_ROWS rows (a decode step's) its product, the activations converted to the format's vec_dot_type (8-bit
    blocks for the quantized formats), as llama.cpp does; for more (a prompt's) llama.cpp's own matrix product
    through a ggml graph (PRODUCT_ROWS says which kernels); a Q4_0 / Q4_K matrix by ggml's interleaved gemv / gemm on
    a repacked copy where llama.cpp would run it so, at any number of rows (module docstring). `repack`: False keeps
    the matrix as stored (as does $TOKENTUI_GGML_REPACK=0: `repack_enabled`)."""

    def __init__(self, matrix: GGMLMatrix, bias: torch.Tensor | None = None, repack: bool = True):
        super().__init__()
        if not isinstance(matrix, GGMLMatrix):
            raise ValueError(f"GGMLLinear takes a GGMLMatrix, not {type(matrix).__name__}")
        self.matrix = matrix
        self.in_features, self.out_features = matrix.cols, matrix.rows
        if bias is not None and tuple(bias.shape) != (matrix.rows,):
            raise ValueError(f"a bias of shape {list(bias.shape)} for {matrix.rows} outputs")
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(torch.float32), requires_grad=False)
        self._packed = _packed(matrix) if repack else None
        self._resident = _resident(matrix) if self._packed is None else None
        # the graph's prompt rows where it takes the bytes (ggml_mul_mat.cpp: bound, and on ggml's alignment), else
        # the product's
        self._graph = self._packed is None and _ops().mul_mat_takes(self.run_bytes)

    @property
    def packed(self) -> torch.Tensor | None:
        """The matrix in ggml's 8-row interleaved layout ([rows, row_bytes] uint8) that the products run on, or None
        where they run on the matrix as stored."""
        return self._packed

    @property
    def resident(self) -> torch.Tensor | None:
        """The matrix as stored, its bytes copied into huge-page memory (module docstring), that the products run on;
        None where they run on `packed` or on `matrix.raw` itself."""
        return self._resident

    @property
    def run_bytes(self) -> torch.Tensor:
        """The bytes a product reads: `packed` (interleaved), else `resident`, else `matrix.raw` (both as stored)."""
        if self._packed is not None:
            return self._packed
        return self.matrix.raw if self._resident is None else self._resident

    @property
    def kernel(self) -> str:
        """ggml's kernel for a decode step's product: "vec_dot" (as stored) or "<format>x8 gemv" (repacked)."""
        name = self.matrix.type_name
        return "vec_dot" if self._packed is None else f"{name[0].lower()}{name[1:]}x8 gemv"  # llama.cpp's: q4_K

    @property
    def weight(self) -> torch.Tensor:
        """The weight de-quantized to float32 [out, in]: a copy made on each read (the lens, tied-head checks), not
        kept, since it is 4-8x the stored matrix. A repacked matrix's from its packed copy (unpacked: the file's
        bytes exactly), so the file's pages are not read again."""
        m = self.matrix
        if self._packed is None:  # from the resident copy where there is one: the file's pages are not read again
            return _ops().dequantize(self.run_bytes, m.type, m.cols)
        return _ops().dequantize(_ops().unpack(self._packed, m.type, m.cols), m.type, m.cols)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] (float32; another float dtype is cast in and the result back) -> [..., out]."""
        flat = x.reshape(-1, self.in_features).to(torch.float32)
        m = self.matrix
        if self._packed is not None:
            y = _ops().packed_product(flat, self._packed, m.type, m.cols)
        elif flat.shape[0] > PRODUCT_ROWS and self._graph:
            y = _ops().mul_mat(flat, self.run_bytes, m.type)
        else:
            y = _ops().product(flat, self.run_bytes, m.type)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.matrix.type_name}, " \
               f"bias={self.bias is not None}, kernel={self.kernel}"


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
