"""5: launch to first token in fresh processes, cold and warm, and the imports floor under it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from measure.common import PROMPT, ROOT, log, med  # noqa: E402


def first_token_seconds(env: dict) -> float:
    """Seconds from spawning `tokentui --headless --json --max-new-tokens 1` to its first step event line."""
    cmd = [sys.executable, "-m", "tokentui", "--headless", "--json", "--no-record", "--greedy",
           "--max-new-tokens", "1", "--prompt", PROMPT]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds = None
    for line in proc.stdout:
        if seconds is None and line.startswith('{"event": "step"'):
            seconds = time.perf_counter() - start
    err = proc.stderr.read()
    if proc.wait() != 0 or seconds is None:
        raise RuntimeError(f"tokentui failed: {err.strip()[-500:]}")
    return seconds


def bench_launch(reps: int, cold: bool) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="tokentui-bench-") as tmp:
        env["TOKENTUI_CACHE_DIR"] = tmp
        if cold:
            out["cold_s"] = first_token_seconds(env)  # converts the GGUF into the empty cache
            log(f"  launch cold: {out['cold_s']:.1f} s")
        else:
            first_token_seconds(env)
        warm = []
        for _ in range(reps):
            warm.append(first_token_seconds(env))
            log(f"  launch warm: {warm[-1]:.1f} s")
        out["warm_s"] = med(warm)
        out["warm_all"] = warm
        floor: dict[str, list[float]] = {name: [] for name in IMPORTS_ONLY}
        for _ in range(reps):
            for name, code in IMPORTS_ONLY.items():
                floor[name].append(imports_seconds(env, code))
            log("  imports alone: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in floor.items()))
        out["imports_s"] = med(floor["transformers"])
        out["imports_torch_s"] = med(floor["torch"])
        out["imports_compiler_s"] = med(floor["torch+compiler"])
    return out


_GC_OFF = "import gc; gc.disable(); "  # as tokentui imports
IMPORTS_ONLY = {  # the floor under a warm launch, in three layers, each timed in a fresh Python
    "torch": _GC_OFF + "import torch",
    # torch's compiler and distributed-tensor packages: transformers 5.23 imports both on every model load
    # (masking_utils and integrations/deepgemm import torch._dynamo; core_model_loading -> distributed/
    # sharding_utils imports torch.distributed.tensor), though a single-device eager run uses neither
    "torch+compiler": _GC_OFF + "import torch, torch._dynamo, torch.distributed.tensor",
    # what any transformers-based start must import before it can load SmolLM2
    "transformers": _GC_OFF + "import torch; from transformers import AutoModelForCausalLM, AutoTokenizer; "
                    "import transformers.models.llama.modeling_llama",
}


def imports_seconds(env: dict, code: str) -> float:
    """Seconds from spawning a Python that only runs the imports in `code` to its line saying it did (not to its
    exit, which tears torch down), timed the way the launch is."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code + "; print('imported', flush=True)"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    seconds = time.perf_counter() - start
    proc.wait()
    if line.strip() != "imported":
        raise RuntimeError("the import-only process failed")
    return seconds
