"""Eager decode with bucketed KV shapes against the dynamic (exact-length) cache, in one process, as a ratio.

    .venv/bin/python benchmarks/kv_shapes.py [--tokens 300] [--reps 3] [--json out.json]

The embedded SmolLM2-135M-Instruct, one Engine per contender on the same weights (`--kv-shapes dynamic` and
`bucketed`, core/model/static_cache.py), runs alternated (D B D B ...), greedy with ignore_eos; the token ids of
both are asserted equal. Reports each contender's median decode tok/s (DoneEvent) and the ratio bucketed / dynamic,
plus the step latency's p50 / p95. `--device cuda` runs the same on a GPU (the cuDNN plan-per-shape effect the
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

from tokentui.core.model.engine import Engine  # noqa: E402
from tokentui.core.model.loader import load_model  # noqa: E402
from tokentui.core.runs.events import DoneEvent, StepEvent  # noqa: E402
from tokentui.core.settings import RunOptions, SamplerSettings  # noqa: E402
from tokentui.core.model.speed import SpeedOptions  # noqa: E402

PROMPT = "What does a KV cache store?"


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(tokens: int, reps: int, device: str) -> dict:
    loaded = load_model(None, device=device)
    greedy = SamplerSettings(temperature=0)
    opts = RunOptions(max_new_tokens=tokens, ignore_eos=True)
    engines = {name: Engine(loaded, greedy, opts, speed=SpeedOptions(kv_shapes=name))
               for name in ("dynamic", "bucketed")}
    rates: dict[str, list[float]] = {name: [] for name in engines}
    latencies: dict[str, list[float]] = {name: [] for name in engines}
    ids: dict[str, list[int]] = {}
    started = time.perf_counter()
    for rep in range(reps + 1):  # the first round warms both up and is not counted
        for name, engine in engines.items():
            events = list(engine.run(PROMPT))
            steps = [e for e in events if isinstance(e, StepEvent)]
            done = next(e for e in events if isinstance(e, DoneEvent))
            ids.setdefault(name, [s.id for s in steps])
            assert [s.id for s in steps] == ids[name], "a contender changed its tokens between runs"
            if rep:
                rates[name].append(done.decode_tok_s)
                latencies[name].extend(s.latency_ms for s in steps[1:])
    assert ids["dynamic"] == ids["bucketed"], "bucketed decode gave other tokens than the dynamic cache"
    result = {"device": device, "tokens": tokens, "reps": reps, "seconds": time.perf_counter() - started,
              "load_before": os.getloadavg()[0], "facts": {n: e.facts.kv_cache for n, e in engines.items()}}
    for name in engines:
        result[name] = {"tok_s": statistics.median(rates[name]), "all_tok_s": rates[name],
                        "p50_ms": _quantile(latencies[name], 0.5), "p95_ms": _quantile(latencies[name], 0.95)}
    result["ratio"] = result["bucketed"]["tok_s"] / result["dynamic"]["tok_s"]
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=300, help="greedy tokens per run (300: crosses a bucket)")
    p.add_argument("--reps", type=int, default=3, help="timed runs per contender, alternated")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    result = measure(args.tokens, args.reps, args.device)
    for name in ("dynamic", "bucketed"):
        r = result[name]
        print(f"{name:9s} {r['tok_s']:6.1f} tok/s (runs {', '.join(f'{x:.1f}' for x in r['all_tok_s'])}), "
              f"step p50 {r['p50_ms']:.1f} ms, p95 {r['p95_ms']:.1f} ms")
    print(f"bucketed / dynamic: {result['ratio']:.3f} (load average {result['load_before']:.1f} at start, "
          f"{result['seconds']:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
