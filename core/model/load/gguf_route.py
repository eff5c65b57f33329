"""Which way a GGUF file runs, chosen as it loads (`gguf_route`):

    --dtype float32, a GPU, a device map            "float": de-quantized to float32 by transformers and cached
                                                    (loader.converted_gguf_dir): the exact reference
    CPU, every matrix of its blocks Q4_0/Q4_1/Q4_K  "packed": tokentui's own 4-bit kernels (gguf_load.py; the
    and its head 4-bit or Q8_0                      embedded model), when this torch has them (packed_serves)
    CPU, any other file                             "stored": the file's bytes memory-mapped and multiplied by
                                                    ggml's kernels (gguf_stored.py)
    CPU, ggml's library cannot be had               as before it existed: "packed" for a file with 4-bit tensors,
                                                    else "float", with a notice saying why and what it costs

The file is parsed and checked once here (gguf_check.checked_reader) and the reader handed on, except where the
packed path's cache already holds the file (a later start of the embedded model: no parse at all).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from .model_cache import Progress


@dataclass
class Route:
    """`kind`: "packed", "stored" or "float"; `reader`: the file's checked GGUFReader where it was parsed; `notice`:
    why a CPU run is not as stored (ggml's library cannot be had), None otherwise."""

    kind: str
    reader: object | None = None
    notice: str | None = None

    def __post_init__(self):
        if self.kind not in ("packed", "stored", "float"):
            raise ValueError(f"a GGUF route is packed, stored or float, not {self.kind!r}")


def gguf_route(dtype: str, device, device_map: str | None, path: Path, progress: Progress,
               build: bool = True) -> Route:
    """How `path` runs for these flags (the module docstring). Builds ggml's library on a first use (said through
    `progress`; `build=False`: never, the route then as where it cannot be had); a bad file is one line
    (ModelLoadError from the check)."""
    from ..quant.qlinear import KERNELS, kernel_available
    from .gguf_check import checked_reader
    from .packed_folder import cached_folder
    from .gguf_stored import FOUR_BIT_PACKED, packed_serves

    if not ((dtype or "auto").strip().lower() == "auto" and device.type == "cpu" and not device_map):
        return Route("float")
    packed = kernel_available()
    if packed and any(_packed_before(cached_folder(path, kernel)) for kernel in KERNELS.values()):
        return Route("packed")  # the embedded model's later starts
    reader = checked_reader(path)
    if packed and packed_serves(reader):
        return Route("packed", reader)
    why = ggml_problem(progress, build)
    if why is None:
        return Route("stored", reader)
    four_bit = packed and any(t.tensor_type.name in FOUR_BIT_PACKED for t in reader.tensors)
    return Route("packed" if four_bit else "float", reader, _fallback_notice(reader, why, four_bit))


def _packed_before(folder: Path) -> bool:
    """Whether the packed path's cache folder holds the file converted with every matrix of its blocks 4-bit (none
    de-quantized has a block's number in its name) and its head packed: a cache from before this routing (a Q4_K_M
    file packed with its Q6_K matrices de-quantized, a Q4_0 file with its Q6_K head in float32) does not count, and
    the file then runs as stored."""
    if not (folder / ".complete").is_file():
        return False
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return (not any(re.search(r"\.\d+\.", name) for name in manifest.get("dequantized", {}))
            and any(entry.get("kind") == "head" for entry in manifest.get("modules", ())))


def ggml_problem(progress: Progress, build: bool = True) -> str | None:
    """None when ggml's kernels are bound into this process (built on a first use; `build=False`: only where built
    already), else one line why not."""
    try:
        from ..quant import ggml_linear
    except ImportError as err:  # pragma: no cover - a broken install
        return f"tokentui's ggml modules cannot be imported ({err})"
    return ggml_linear.load(progress) if build else ggml_linear.available()


def _fallback_notice(reader, why: str, four_bit: bool) -> str:
    """The notice for a file that cannot run as stored: why, and what it costs (its tensors' float32 bytes, the
    packed path's 4-bit ones as stored, against the file's own)."""
    from .gguf_stored import FOUR_BIT_PACKED

    stored = sum(int(t.n_bytes) for t in reader.tensors)
    as_float = sum(int(t.n_bytes) if four_bit and t.tensor_type.name in FOUR_BIT_PACKED
                   else 4 * math.prod(int(d) for d in t.shape) for t in reader.tensors)
    how = "its non-4-bit tensors de-quantized to float32" if four_bit else "de-quantized to float32"
    return (f"this GGUF cannot run as stored: {why}; it runs {how}, whose weights take ~{as_float / 1e9:.2f} GB "
            f"of memory instead of the file's {stored / 1e9:.2f} GB")
