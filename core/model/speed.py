"""Speed settings: how many CPU threads each phase uses, and whether decode runs compiled.

Thread policy (the measurements behind it: docs/design-record.md, "Threads"): both phases leave a
core free, `cores - 1` threads (at least 1), unless --threads says otherwise.

* Decode multiplies one activation vector by every weight matrix: ~1,000 small operations per token, each a few
  microseconds. With 2 OpenMP threads every one of them ends in a barrier, and as soon as anything else wants a core
  (the dashboard, a test run, the OS) the threads wait on each other: decode with 2 threads fell to well under
  half its speed on a busy machine, and was no faster on an idle one (one core already streams most of the
  memory bandwidth there is).
* Prefill multiplies whole matrices: on a quiet machine 2 threads were faster for longer prompts (and slower for a
  short chat prompt), but with other work running they collapsed the same way. The dashboard is such other work,
  so prefill does not take every core by default either; `prefill_threads` (or --threads) opts in.

`torch.set_num_threads` is process-wide, and with OpenMP each thread also caches its own count: the engine calls
`use_threads` on the thread that runs the model, right before each phase.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..errors import SettingsError
from ..settings import check_threads
from .quant.weight_layout import LAYOUTS

KV_SHAPES = ("auto", "dynamic", "bucketed")  # core/model/decode/static_cache.py

def cpu_cores() -> int:
    """CPU cores this process may use: torch's default (physical cores) within the affinity mask."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        allowed = os.cpu_count() or 1
    return max(1, min(allowed, _TORCH_DEFAULT_THREADS))


_TORCH_DEFAULT_THREADS = torch.get_num_threads()  # read at import, before anyone changes it


@dataclass(frozen=True)
class SpeedOptions:
    """compile: static KV cache + torch.compile'd decode step (core/model/decode/compiled.py); threads / prefill_threads: CPU
    threads for decode / prefill, None = the policy above; weight_layout: see core/model/quant/weight_layout.py."""

    compile: bool = False
    threads: int | None = None
    prefill_threads: int | None = None
    weight_layout: str = "auto"  # "auto": wide fp32 CPU weights stored transposed (core/model/quant/weight_layout.py); "stock"
    kv_shapes: str = "auto"  # eager decode's attention shapes (core/model/decode/static_cache.py): auto, dynamic, bucketed

    def __post_init__(self) -> None:
        """Checked here, once: an invalid SpeedOptions cannot exist."""
        if self.weight_layout not in LAYOUTS:
            raise SettingsError(f"weight-layout must be {' or '.join(LAYOUTS)}, got {self.weight_layout!r}")
        if self.kv_shapes not in KV_SHAPES:
            raise SettingsError(f"kv-shapes must be {', '.join(KV_SHAPES)}, got {self.kv_shapes!r}")
        for name in ("threads", "prefill_threads"):
            check_threads(getattr(self, name), name.replace("_", "-"))  # 1..a few per CPU (core/settings.py)
        object.__setattr__(self, "compile", bool(self.compile))  # frozen: the one place a field is normalised

    def decode_threads(self) -> int:
        return self.threads or max(1, cpu_cores() - 1)

    def prefill_thread_count(self, prompt_tokens: int) -> int:
        """Threads for a prefill of `prompt_tokens` (kept as an argument for policies that depend on it)."""
        return self.prefill_threads or self.decode_threads()


def use_threads(device: torch.device, count: int) -> None:
    """Set the intra-op thread count for the calling thread (CPU only; a no-op when unchanged)."""
    if device.type == "cpu" and torch.get_num_threads() != count:
        torch.set_num_threads(count)
