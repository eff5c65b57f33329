"""Q4_0 / Q4_K matrices repacked into ggml's 8-row interleaved layout (as llama-server repacks them on AVX2) against
the same file kept as stored (vec_dot): the decode step's ms per token at 1 and 2 threads, alternated token by token
on the two models loaded from the same GGUF file, their greedy ids, the load time and what the facts line says.

    .venv/bin/python benchmarks/bench_ggml_repack.py [FILE ...] [--steps 24]

Default files: issue 37's Qwen3-0.6B-shaped Q4_0 and Q4_K_M (benchmarks/gguf_models.py, built when missing). Each
file is loaded as stored (core/model/load/gguf_stored.py's load_stored: what the loader's "stored" route runs, here
whatever route the loader would pick) twice, with $TOKENTUI_GGML_REPACK=0 and =1 (repacked); the prompt
(16 ids) goes through the model's forward, then `--steps` tokens through the ggml step of each, alternated, both fed
the as-stored model's greedy ids (best and median ms; top-1 agreement and the largest logit difference). Peak memory of one run is what `/usr/bin/time -v tokentui --model FILE --headless ...` says.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tokentui.core.model.decode.adapter import forward_last_logits, new_cache  # noqa: E402
from tokentui.core.model.load.gguf_stored import load_stored  # noqa: E402
from tokentui.core.model.load.gguf_stored_facts import stored_facts  # noqa: E402
from tokentui.core.model.native import ggml_native  # noqa: E402
from tokentui.core.model.quant import ggml_linear  # noqa: E402
from tokentui.core.model.quant.ggml_linear import GGMLLinear  # noqa: E402


def load(path: Path, repack: bool):
    saved = os.environ.get(ggml_linear.REPACK_ENV)
    os.environ[ggml_linear.REPACK_ENV] = "1" if repack else "0"
    try:
        start = time.perf_counter()
        loaded = load_stored(path)
        return loaded, time.perf_counter() - start
    finally:
        if saved is None:
            os.environ.pop(ggml_linear.REPACK_ENV)
        else:
            os.environ[ggml_linear.REPACK_ENV] = saved


def compare(path: Path, steps: int) -> None:
    print(f"{path.name}:")
    runs = {}
    for name, repack in (("as stored", False), ("repacked", True)):
        loaded, seconds = load(path, repack)
        model = loaded.model
        kernels = sorted({m.kernel for m in model.modules() if isinstance(m, GGMLLinear)})
        step = ggml_native.ggml_step(model)
        print(f"  {name}: load {seconds:.1f} s; kernels {', '.join(kernels) or 'none'}; facts: "
              f"{stored_facts(model, loaded.dequantized).kernel}; step: "
              f"{'ggml' if step else ggml_native.why_not(model)}")
        if step is None:
            return
        runs[name] = (model, step)
    prompt = [(i * 7919) % 49000 + 10 for i in range(16)]
    for threads in (1, 2):
        torch.set_num_threads(threads)
        state = {}
        with torch.inference_mode():
            for name, (model, _) in runs.items():
                cache = new_cache(model, 16 + steps + 1)
                state[name] = [cache, int(forward_last_logits(model, torch.tensor([prompt]), cache).argmax()), [], []]
            token, agree, apart = state["as stored"][1], 0, 0.0
            for _ in range(steps):  # both fed the as-stored model's greedy ids
                logits = {}
                for name, (_, step) in runs.items():
                    cache, _, ids, times = state[name]
                    start = time.perf_counter()
                    logits[name] = step.step(token, cache)
                    times.append(time.perf_counter() - start)
                a, b = logits["as stored"], logits["repacked"]
                agree += int(a.argmax()) == int(b.argmax())
                apart = max(apart, float((a - b).abs().max()) / float(a.abs().max()))
                token = int(a.argmax())
        print(f"  {threads} thread(s): " + "   ".join(
            f"{name} {min(t) * 1e3:.1f} ms/token (median {statistics.median(t) * 1e3:.1f})"
            for name, (_, _, _, t) in state.items()) + f"   top-1 agreement {agree}/{steps}, logits apart "
            f"{apart:.1e} of the largest")


def main() -> None:
    why = ggml_linear.load(lambda p: print(p.stage, file=sys.stderr))
    if why is not None:
        sys.exit(f"ggml's kernels: {why}")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    files = args.files
    if not files:
        import gguf_models

        files = [gguf_models.gguf_model("qwen3-0.6b", fmt) for fmt in ("Q4_0", "Q4_K_M")]
    for path in files:
        compare(path, args.steps)


if __name__ == "__main__":
    main()
