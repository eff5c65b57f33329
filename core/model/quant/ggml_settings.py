"""Where ggml's matrices are placed, as the environment says, read without torch: core/model/load/ahead.py asks before
torch is imported, and core/model/quant/ggml_linear.py (which re-exports these names) when it places each matrix.

- `huge_pages()`: whether matrices are copied into transparent huge pages (ggml_linear's module docstring says why).
- `repack_enabled()`: whether a Q4_0 / Q4_K matrix is repacked into ggml's interleaved layout (`INTERLEAVED`: the
  formats core/model/native/ggml_repack.cpp's packed_types can name, which names them where this CPU has the kernels;
  a matrix whose rows are not a multiple of ROWS_INTERLEAVED stays as stored).
"""

from __future__ import annotations

import functools
import os

REPACK_ENV = "TOKENTUI_GGML_REPACK"  # "0": no matrix repacked into ggml's interleaved layout (before/after timings)
HUGE_PAGES_ENV = "TOKENTUI_GGML_HUGE_PAGES"  # "0": no copy into huge-page memory (before/after timings)
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"  # "always [madvise] never": the bracketed one is in force
INTERLEAVED = frozenset({"Q4_0", "Q4_K"})  # gguf-py's names of the formats ggml_repack.cpp can interleave
ROWS_INTERLEAVED = 8  # rows a group of ggml's interleaved layout (block_q4_0x8, block_q4_Kx8): others stay as stored


def repack_enabled() -> bool:
    """Whether a GGMLLinear repacks what ggml has interleaved kernels for (not where $TOKENTUI_GGML_REPACK=0)."""
    return os.environ.get(REPACK_ENV, "1") != "0"


def huge_pages() -> bool:
    """Whether matrices are placed in huge-page memory: not where $TOKENTUI_GGML_HUGE_PAGES=0, nor where the kernel's
    transparent huge pages are `never` or unknown (no THP_SETTING: another OS or kernel)."""
    return os.environ.get(HUGE_PAGES_ENV, "1") != "0" and _thp_on(THP_SETTING)


@functools.cache
def _thp_on(setting: str) -> bool:
    """The kernel's THP setting at `setting`, read once a process: asked for each matrix a load places, opening the
    file let the tokenizer's thread take the GIL for a switch interval each time (0.4 s a load: BENCHMARKS.md,
    "The copies made while torch is imported")."""
    try:
        with open(setting) as file:
            text = file.read()
    except OSError:
        return False
    return "[always]" in text or "[madvise]" in text
