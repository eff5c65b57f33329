"""Eager decode with bucketed KV shapes against the dynamic (exact-length) cache, in one process, as a ratio.

    .venv/bin/python benchmarks/kv_shapes.py [--tokens 300] [--reps 3] [--json out.json]

The embedded SmolLM2-135M-Instruct (weights re-laid as the engine does), a 38-token chat prompt prefilled into
both caches (`--kv-shapes dynamic` and `bucketed`: core/model/decode/static_cache.py's `new_eager_cache`), then decode
forwards through each alternated step by step, both fed the dynamic cache's greedy token. Reports each cache's
forward p50 / p95 / mean, the p50 ratio, and how often the two caches' scores pick the same greedy token. `--device cuda` runs the same on a GPU (the cuDNN plan-per-shape effect the
bucketing is for shows there, on the first run in a process: run it fresh, `--reps 1`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tokentui.core.model.load.loader import load_model  # noqa: E402
from tokentui.core.settings import RunOptions, SamplerSettings  # noqa: E402

PROMPT = "What does a KV cache store?"


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(tokens: int, reps: int, device: str) -> dict:
    """Decode steps through both caches alternated step by step (D B D B ...: a loaded machine slows both alike),
    feeding both the dynamic cache's greedy token; the ids each cache's scores pick are compared."""
    import torch

    from tokentui.core.model.decode.adapter import synchronize
    from tokentui.core.model.decode.static_cache import new_eager_cache
    from tokentui.core.steps.template import apply_template
    from tokentui.core.steps.tokenization import tokenize
    from tokentui.core.model.engine import Engine

    loaded = load_model(None, device=device)
    engine = Engine(loaded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=tokens))  # re-lays weights
    torch.set_num_threads(engine.speed.decode_threads())
    model = loaded.model
    ids, _ = tokenize(loaded.tokenizer, apply_template(loaded.tokenizer, PROMPT, None), engine.token_bytes)
    where = model.get_input_embeddings().weight.device
    times: dict[str, list[float]] = {"dynamic": [], "bucketed": []}
    agree = total = 0
    started = time.perf_counter()
    for rep in range(reps):
        caches = {name: new_eager_cache(model.config, len(ids) + tokens, name == "bucketed") for name in times}
        with torch.inference_mode():
            x = torch.tensor([ids], device=where)
            last = {name: model(input_ids=x, past_key_values=c, use_cache=True, logits_to_keep=1).logits[0, -1]
                    for name, c in caches.items()}
            for step in range(tokens):
                token = int(last["dynamic"].argmax())
                agree += int(last["bucketed"].argmax()) == token
                total += 1
                feed = torch.full((1, 1), token, dtype=torch.long, device=where)
                order = ("dynamic", "bucketed") if step % 2 == 0 else ("bucketed", "dynamic")
                for name in order:
                    t0 = time.perf_counter()
                    last[name] = model(input_ids=feed, past_key_values=caches[name], use_cache=True,
                                       logits_to_keep=1).logits[0, -1]
                    synchronize(last[name].device)
                    times[name].append((time.perf_counter() - t0) * 1000.0)
    result = {"device": device, "tokens": tokens, "reps": reps, "prompt_tokens": len(ids),
              "seconds": time.perf_counter() - started, "load_average": os.getloadavg()[0],
              "greedy_agreement": f"{agree}/{total}"}
    for name, values in times.items():
        result[name] = {"p50_ms": _quantile(values, 0.5), "p95_ms": _quantile(values, 0.95),
                        "mean_ms": statistics.fmean(values)}
    result["ratio_p50"] = result["dynamic"]["p50_ms"] / result["bucketed"]["p50_ms"]  # > 1: bucketed faster
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=300, help="decode steps per repetition (300: crosses a bucket)")
    p.add_argument("--reps", type=int, default=1, help="repetitions (fresh caches each)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    result = measure(args.tokens, args.reps, args.device)
    for name in ("dynamic", "bucketed"):
        r = result[name]
        print(f"{name:9s} forward p50 {r['p50_ms']:.1f} ms, p95 {r['p95_ms']:.1f} ms, mean {r['mean_ms']:.1f} ms")
    print(f"speed bucketed / dynamic (p50): {result['ratio_p50']:.3f}; greedy agreement {result['greedy_agreement']}"
          f" (load average {result['load_average']:.1f} at the end, {result['seconds']:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
