"""The ggml decode step on a GGUF file's matrices read from the file's memory map (4 KiB pages) against the same
matrices copied into transparent huge pages (core/model/quant/ggml_linear.py's `resident`), in one process.

    .venv/bin/python benchmarks/bench_ggml_hugepages.py PATH.gguf [--threads 1] [--tokens 40]

The file is loaded twice, once with $TOKENTUI_GGML_HUGE_PAGES=0 ("map") and once without ("huge"); then --tokens
greedy tokens through each one's ggml step and head, one token of each in turn (the order swapped every token, so
the machine's load falls on both alike): ms per token of each (median, best) and the median of the per-token ratios
huge / map. The two greedy continuations must agree (the same bytes through the same kernels).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from tokentui.core.model.decode.adapter import forward_last_logits, new_cache
from tokentui.core.model.load.loader import load_model
from tokentui.core.model.native.ggml_native import GGMLStep
from tokentui.core.model.quant import ggml_linear


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=40)
    args = parser.parse_args()
    models = {}
    for name, off in (("map", True), ("huge", False)):
        if off:
            os.environ[ggml_linear.HUGE_PAGES_ENV] = "0"
        else:
            os.environ.pop(ggml_linear.HUGE_PAGES_ENV, None)
        models[name] = load_model(args.gguf, device="cpu").model
    os.environ.pop(ggml_linear.HUGE_PAGES_ENV, None)
    if not ggml_linear.huge_pages():
        sys.exit(f"no transparent huge pages here ({ggml_linear.THP_SETTING}): both would read the file's map")
    torch.set_num_threads(args.threads)
    steps = {name: GGMLStep(model) for name, model in models.items()}
    caches = {name: new_cache(model, args.tokens + 16) for name, model in models.items()}
    times: dict[str, list[float]] = {name: [] for name in steps}
    tokens = {name: [100] for name in steps}
    with torch.inference_mode():
        for name, model in models.items():
            forward_last_logits(model, torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]]), caches[name])
        for i in range(args.tokens):
            for name in (("map", "huge") if i % 2 else ("huge", "map")):
                start = time.perf_counter()
                logits = steps[name].step(tokens[name][-1], caches[name])
                times[name].append(time.perf_counter() - start)
                tokens[name].append(int(logits.argmax()))
    for name, t in times.items():
        print(f"{name}: {statistics.median(t) * 1e3:.2f} ms/token (best {min(t) * 1e3:.2f})")
    ratios = [h / m for h, m in zip(times["huge"], times["map"])]
    print(f"{args.threads} thread(s): huge / map per-token time, median {statistics.median(ratios):.3f} "
          f"({1 / statistics.median(ratios):.2f}x); greedy tokens agree: {tokens['map'] == tokens['huge']}")


if __name__ == "__main__":
    main()
