"""Where a GGUF kept as stored has its cache folder (core/model/load/gguf_stored.py's config, tokenizer, placement and
step verdict), found without torch or transformers: core/model/load/ahead.py looks there before they are imported."""

from __future__ import annotations

import functools
import hashlib
from importlib import metadata
from pathlib import Path

from ...paths import cache_dir

FORMAT = 3  # bump when what the cache folder holds changes (2: the tokenizer as transformers reads it back, and
# its FileTokenizer verdict: core/model/load/tokenizer_cache.py; 3: the placement and facts a later start without
# transformers' model reads, core/model/load/gguf_direct.py)


@functools.cache
def transformers_version() -> str:
    """The installed transformers release as its metadata names it (the string `transformers.__version__` gives),
    read without importing it, once a process (each read scans the installed packages)."""
    return metadata.version("transformers")


def cache_key(path: Path) -> str:
    """The folder's name: the file's path, size and modification time, the transformers release that converted its
    config and tokenizer (as its installed metadata names it: read without importing it) and FORMAT."""
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{int(st.st_mtime)}|{transformers_version()}|{FORMAT}"
    return f"{path.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def cached_folder(path: Path) -> Path:
    """Where `path`'s config and tokenizer are kept once converted."""
    return cache_dir() / "stored" / cache_key(path)
