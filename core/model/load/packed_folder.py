"""Where the packed path (core/model/load/gguf_load.py: a GGUF's 4-bit matrices packed for tokentui's kernels) keeps a
file's conversion, found without importing transformers: core/model/load/gguf_route.py asks before every GGUF load
whether the file was packed before, and a file that runs as stored must not pay transformers' import for the answer."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from ...paths import cache_dir
from .stored_folder import transformers_version

FORMAT = 2  # bump when the cached layout changes


def cache_key(path: Path, kernel) -> str:
    """The folder's name: the file's path, size and modification time, the transformers and torch releases (the
    transformers one read without importing it: stored_folder.transformers_version), the CPU kind, `kernel`'s (an
    Int4Kernel) name and layout, and FORMAT."""
    st = path.stat()
    ident = (f"{path.resolve()}|{st.st_size}|{int(st.st_mtime)}|{transformers_version()}|"
             f"{torch.__version__}|{torch.backends.cpu.get_cpu_capability()}|{kernel.name}.{kernel.layout}|{FORMAT}")
    return f"{path.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def cached_folder(path: Path, kernel) -> Path:
    """Where `path`'s matrices packed for `kernel` are kept (each kernel packs its own layout)."""
    return cache_dir() / "quantized" / cache_key(path, kernel)
