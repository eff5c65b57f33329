"""tokentui's AVX2 4-bit product (core/model/native/q4_avx2.cpp), whole decode step (native/decode_step.cpp, used
by core/model/native/native_step.py) and selection (native/select.cpp, used by core/steps/select.py on CPU): one library,
built here and loaded into torch; and the products' layouts (float32 and int16 activations: NativeQ4, NativeQ4I16).
The same library holds the bridge to ggml's CPU kernels (native/ggml_ops.cpp, opened at run time: core/model/quant/
ggml_linear.py) and the decode step on them (native/ggml_step.cpp, used by core/model/native/ggml_native.py).

Why built at run time: it is a few hundred lines of intrinsics against torch's C++ headers, and the compiled library
must match the torch it is loaded into (its ABI, its headers); building it on the first start with the machine's
C++ compiler (the one `--compile` needs) keeps the wheel pure Python. The library is cached under
`cache_dir()/kernels`, keyed by the sources, torch's version and the compiler; later starts load it in milliseconds.
Where it cannot be built (no compiler, not x86, no AVX2 / FMA), `NativeQ4.unavailable()` says why, the model
uses torch's int4 kernel (core/model/quant/qlinear.py's `chosen_kernel`) and selection runs torch operations.

Why not torch.utils.cpp_extension: it needs ninja and builds a Python extension module; one compiler call for a
library of TORCH_LIBRARY ops is all this needs.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch

from ...paths import cache_dir
from ...runs.events import LoadProgress
from ..quant.gguf_quant import GROUP, GroupedInt4
from ..quant.int4_kernel import Int4Kernel

NATIVE = Path(__file__).parent  # the C++ sources sit beside this file
# one library; the products and the step include q4_kernels.h; select.cpp is step 4 (core/steps/select.py),
# select_chain.cpp the same with the whole sampler chain (core/steps/select_chain.py); exact_head.cpp the LM head's
# exact scores (core/model/quant/qlinear.py's QLMHead);
# ggml_ops.cpp / ggml_step.cpp / ggml_repack.cpp run ggml's CPU kernels, opened at run time (core/model/quant/
# ggml_linear.py), on matrices in ggml_memory.cpp's memory; ggml_mul_mat.cpp a prompt's rows through ggml's graph
SOURCES = (NATIVE / "q4_avx2.cpp", NATIVE / "decode_step.cpp", NATIVE / "select.cpp", NATIVE / "select_chain.cpp",
           NATIVE / "exact_head.cpp", NATIVE / "ggml_ops.cpp", NATIVE / "ggml_step.cpp", NATIVE / "ggml_repack.cpp",
           NATIVE / "ggml_memory.cpp", NATIVE / "ggml_mul_mat.cpp")
HEADERS = (NATIVE / "q4_kernels.h", NATIVE / "i16_kernels.h", NATIVE / "select_draw.h", NATIVE / "select_math.h",
           NATIVE / "select_stages.h", NATIVE / "step_math.h", NATIVE / "ggml_abi.h",
           NATIVE / "ggml_memory.h", NATIVE / "fork_rule.h")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c++20", "-w")
BUILD_TIMEOUT_S = 300
STAGE_BUILD = "building tokentui's native library (4-bit kernels, decode step, selection) with {compiler} (first start only)"
# input k of a group, for word j (0..3) nibble p (0..7) of its 16 bytes: the layout in the C++ file's comment
_NIBBLE_INPUT = torch.tensor([8 * (p % 4) + j + 4 * (p // 4) for j in range(4) for p in range(8)])
_SHIFTS = 4 * torch.arange(8, dtype=torch.int64)


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def compiler_name() -> str:
    """The compiler that builds the kernel ("" when there is none)."""
    return _compiler() or ""


def _cpu_has_avx2() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")  # AVX2 here means AVX2 and FMA


def _library_path(compiler: str) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    ident = "|".join([*(p.read_text() for p in (*SOURCES, *HEADERS)), torch.__version__,
                      version.splitlines()[0] if version else compiler, " ".join(FLAGS),
                      str(torch._C._GLIBCXX_USE_CXX11_ABI)])
    return cache_dir() / "kernels" / f"q4_avx2-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.so"


def _build(compiler: str, target: Path) -> None:
    """Compile the library to `target` (atomically: another process building it at the same time is harmless): each
    source compiled by its own compiler process, at the same time (a first start waits for the slowest), then
    linked."""
    torch_dir = Path(torch.__file__).parent
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [Path(tmp) / f"{source.stem}.o" for source in SOURCES]
        compiles = [[compiler, *FLAGS, "-c", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
                     f"-I{torch_dir / 'include'}", f"-I{torch_dir / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
                     f"-I{Path(sys.base_prefix) / 'include'}", str(source), "-o", str(obj)]
                    for source, obj in zip(SOURCES, objects)]
        out = Path(tmp) / target.name
        _run_all(compiles, compiler)
        _run_all([[compiler, *FLAGS, *map(str, objects), "-o", str(out), f"-L{torch_dir / 'lib'}", "-lc10",
                   "-ltorch_cpu", "-ldl", f"-Wl,-rpath,{torch_dir / 'lib'}"]], compiler)  # -ldl: ggml_ops.cpp's dlopen
        os.replace(out, target)


def _run_all(commands: list[list[str]], compiler: str) -> None:
    """Run the compiler commands side by side; RuntimeError with the first failure's last line."""
    running = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in commands]
    failures = []
    for process in running:
        try:
            _, err = process.communicate(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
        if process.returncode != 0:
            failures.append((err.strip().splitlines() or ["no output"])[-1])
    if failures:
        raise RuntimeError(f"{Path(compiler).name} failed: {failures[0][:200]}")


def would_build() -> bool:
    """Loading the kernel now would compile it first (a first start: ~20 s, said as a load stage)."""
    if _load.cache_info().currsize or not _cpu_has_avx2() or not all(p.is_file() for p in (*SOURCES, *HEADERS)):
        return False
    compiler = _compiler()
    try:
        return compiler is not None and not _library_path(compiler).is_file()
    except (OSError, subprocess.SubprocessError):
        return False


def load(progress: Callable[[LoadProgress], None]) -> str | None:
    """Build (a first start: said first as a load stage of its own) and load the library; None when loaded, else why
    not (one line). Model loading calls it for every model that runs on the CPU, so that no step has to build it."""
    if would_build():
        progress(LoadProgress(STAGE_BUILD.format(compiler=Path(compiler_name()).name), None))
    return _load()


_LOADED: dict[str, str] = {}  # "name": the library file loaded into this process (its name keyed by its sources)


def library_name() -> str | None:
    """The file name of the library loaded into this process (its key: the sources, torch and the compiler), or
    None where it is not loaded."""
    return _LOADED.get("name")


@functools.cache
def _load() -> str | None:
    """Build (first start) and load the library; None when loaded, else why not (one line)."""
    if not _cpu_has_avx2():
        return f"this CPU has no AVX2 ({platform.machine()}, torch capability {torch.backends.cpu.get_cpu_capability()})"
    if missing := [str(p) for p in (*SOURCES, *HEADERS) if not p.is_file()]:
        return f"its source is missing ({', '.join(missing)})"
    compiler = _compiler()
    if compiler is None:
        return "no C++ compiler (g++) on PATH"
    try:
        target = _library_path(compiler)
        if not target.is_file():
            _build(compiler, target)
        torch.ops.load_library(str(target))
        _LOADED["name"] = target.name
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        return f"could not build it: {str(err).splitlines()[0][:240]}"
    torch.library.register_fake("tokentui_q4::q4_linear")(_fake_product)
    torch.library.register_fake("tokentui_q4::q8_linear")(_fake_product)
    torch.library.register_fake("tokentui_q4::q4_linear_i16")(_fake_product)
    torch.library.register_fake("tokentui_q4::q8_linear_i16")(_fake_product)
    torch.library.register_fake("tokentui_q4::decode_step")(_fake_step)
    torch.library.register_fake("tokentui_q4::exact_top")(_fake_exact_top)
    return None


def _fake_product(x, packed, scales):
    return x.new_empty((x.shape[0], packed.shape[0]))


def _fake_exact_top(scores, x, weight, bias, count):
    return None


def _fake_step(x, pos, cos, sin, kbufs, vbufs, stacked, norm, heads, kv_heads, eps, scale, int16):
    return x.new_empty((1, x.shape[-1]))


def pack_values(q: torch.Tensor) -> torch.Tensor:
    """4-bit values q uint8 [N, K] (0..15) -> [N, K/2] uint8 in the kernel's layout (the C++ file's comment)."""
    n, k = q.shape
    groups = q.view(n, k // GROUP, GROUP)[:, :, _NIBBLE_INPUT].view(n, k // GROUP, 4, 8).to(torch.int64)
    words = (groups << _SHIFTS).sum(-1)  # [N, G, 4] each 0 .. 2^32 - 1
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)  # the same 32 bits, signed
    return words.view(torch.uint8).reshape(n, k // 2).contiguous()  # little-endian bytes of each word


class NativeQ4(Int4Kernel):
    """4-bit matrices through q4_linear; a Q8_0 matrix (held as two 4-bit halves: gguf_quant.py) is put back
    together as the file's int8 values and goes through q8_linear, one byte a weight and one product."""

    name = "avx2-fp32"
    scale_dtype = torch.float32
    activation_dtype = torch.float32
    activations = "float32"
    eight_bit_halves = False
    layout = 2  # 2: a Q8_0 matrix as int8 values (1: as two 4-bit halves)
    ops = ("q4_linear", "q8_linear")  # its ops in torch.ops.tokentui_q4: 4-bit, 8-bit

    @staticmethod
    def unavailable() -> str | None:
        """None when the kernel is built and loaded (building it on the first call), else why not."""
        return _load()

    def pack(self, matrix: GroupedInt4) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed [N, K/2] uint8, dm [N, K/32, 2] float32 with w = d q + m: d = scale, m = zero - 8 scale, which is
        the file's Q4_1 m, Q4_0's -8 d and Q4_K's -dmin m_j whenever `zero` was exact: gguf_quant.py).

        Q8_0 halves [hi | lo] (hi: scale 16 d, zero 0; lo: scale d, zero 8 d): (q [N, K] int8 = 16 (hi - 8) + lo,
        the file's values, d [N, K/32] float32, the lo half's scale)."""
        if matrix.halves:
            k = matrix.in_features
            q = 16 * (matrix.q[:, :k].to(torch.int16) - 8) + matrix.q[:, k:].to(torch.int16)
            return q.to(torch.int8).contiguous(), matrix.scale[:, k // GROUP:].contiguous()
        m = matrix.zero - 8.0 * matrix.scale
        return self.pack_values(matrix.q), torch.stack([matrix.scale, m], dim=-1).contiguous()

    @staticmethod
    def pack_values(q: torch.Tensor) -> torch.Tensor:
        return pack_values(q)

    def mm(self, a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        op = self.ops[1] if packed.dtype == torch.int8 else self.ops[0]
        return getattr(torch.ops.tokentui_q4, op)(a, packed, scales)


def pack_values_i16(q: torch.Tensor) -> torch.Tensor:
    """4-bit values q uint8 [N, K] (0..15) -> [N, K/2] uint8 in the int16 kernel's layout (native/i16_kernels.h): byte
    j of a group holds its input j in the low nibble and input 16 + j in the high one."""
    n, k = q.shape
    groups = q.view(n, k // GROUP, 2, GROUP // 2)  # [N, G, half, j]
    return (groups[:, :, 0] | (groups[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


class NativeQ4I16(NativeQ4):
    """The same weights as NativeQ4 (a Q8_0 matrix as its int8 values; the 4-bit values in another nibble order),
    multiplied as integers by the activations rounded to int16 with a float32 scale per group of 32
    (native/i16_kernels.h says how close, and why)."""

    name = "avx2-int16"
    activations = "int16"
    layout = 1
    ops = ("q4_linear_i16", "q8_linear_i16")

    @staticmethod
    def pack_values(q: torch.Tensor) -> torch.Tensor:
        return pack_values_i16(q)
