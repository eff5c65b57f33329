"""What every measurement of benchmarks/bench.py shares: the prompt, the machine's description, running the
engine and generate once, the read bandwidth."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

TORCH_DEFAULT_THREADS = torch.get_num_threads()  # before anything changes it

from tokentui.core.model.engine import Engine  # noqa: E402
from tokentui.core.runs.events import DoneEvent, PromptEvent, StepEvent  # noqa: E402


PROMPT = "What does a KV cache store?"  # 38 tokens with the chat template and its default system prompt
NEW_TOKENS = 128


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def print_and_save(result: dict, json_path: Path | None, width: int = 28) -> None:
    """A benchmark's result dict as aligned `name value` lines (a dict value as `key count, ...`), and as JSON to
    `json_path` when given."""
    import json

    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{key:{width}s}", ", ".join(f"{name} {count:g}" for name, count in value.items()))
        else:
            print(f"{key:{width}s} {value:.4g}" if isinstance(value, float) else f"{key:{width}s} {value}")
    if json_path:
        json_path.write_text(json.dumps(result, indent=2) + "\n")


def med(values) -> float:
    return statistics.median(values) if values else float("nan")


def machine() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__}
    import transformers

    info["transformers"] = transformers.__version__
    try:
        import textual

        info["textual"] = getattr(textual, "__version__", "?")
    except ImportError:
        pass
    cpu = platform.processor() or "?"
    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu in ("?", "", "x86_64"):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    info["cpu"] = cpu
    info["simd"] = ", ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags) or "?"
    info["cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info["torch_default_threads"] = TORCH_DEFAULT_THREADS
    try:
        mem = next(l for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal"))
        info["memory"] = f"{int(mem.split()[1]) / 2**20:.1f} GiB"
    except (OSError, StopIteration):
        pass
    info["blas"] = "MKL" if torch.backends.mkl.is_available() else "?"
    info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return info


def run_engine(engine: Engine, prompt: str = PROMPT) -> tuple[list[int], DoneEvent, list[StepEvent], list[int]]:
    steps, done, prompt_ids = [], None, []
    for event in engine.run(prompt):
        if isinstance(event, StepEvent):
            steps.append(event)
        elif isinstance(event, DoneEvent):
            done = event
        elif isinstance(event, PromptEvent):
            prompt_ids = event.ids
    assert done is not None, "the run ended without a done event"
    return [s.id for s in steps], done, steps, prompt_ids


class _Stamps:
    """A generate() streamer that timestamps each new token (the first put() is the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def run_generate(model, prompt_ids: list[int], n: int, threads: int) -> tuple[list[int], float]:
    """transformers' generate, greedy, exactly n tokens (eos_token_id=-1: never stops early, like ignore_eos).
    Returns the IDs and decode tok/s measured like the engine's: (n - 1) tokens / time from token 1 to token n."""
    torch.set_num_threads(threads)
    x = torch.tensor([prompt_ids])
    stamps = _Stamps()
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, eos_token_id=-1,
                         streamer=stamps)
    ids = out[0, len(prompt_ids):].tolist()
    first, last = stamps.times[1], stamps.times[-1]
    return ids, (len(ids) - 1) / (last - first)


def bandwidth(threads: int, gib: float = 1.0, reps: int = 7) -> float:
    """Read bandwidth in GB/s: best of `reps` sums over a `gib` GiB float32 tensor (far larger than any cache)."""
    torch.set_num_threads(threads)
    x = torch.ones(int(gib * 2**30 / 4))
    x.sum()
    best = 0.0
    for _ in range(reps):
        start = time.perf_counter()
        x.sum()
        best = max(best, x.nbytes / (time.perf_counter() - start) / 1e9)
    del x
    return best
