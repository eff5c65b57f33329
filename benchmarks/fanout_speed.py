"""Fan-out speed (issue 26): N samples of M tokens from one step, in one batched decode that shares the prefix's KV
cache (core/model/fanout.py), against one M-token branch from the same step (core/model/branch.py), on the
embedded model, CPU, float32. Target: N = 8, M = 32: fan-out ÷ branch ≤ 2.5× (a decode step is memory-bound: the
weights are read once per step whatever the batch, so eight rows cost little more than one).

Both contenders run on one engine, interleaved (branch, fan-out, branch, ...), each from the cache the other left
held (the branch reuses the fan-out's prefix cache, the fan-out cuts the branch's back to the prefix), with the same
sampler settings (T = 0.8, top-p 0.9, end tokens ignored so every row makes M tokens); each figure is the median
wall time of a whole call (its first event to its `done`) over the repetitions. Other N are measured too (not
targets). The figures go into BENCHMARKS.md ("Fan-out"); this module prints them as a table and, with --json, a JSON
object.

    .venv/bin/python benchmarks/fanout_speed.py [--reps 5] [--n 1 8 16] [--tokens 32] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tokentui.core.model.load.build import load_engine  # noqa: E402
from tokentui.core.link.protocol import EngineSpec  # noqa: E402
from tokentui.core.runs.branch_point import BranchPoint  # noqa: E402
from tokentui.core.runs.events import DoneEvent, PromptEvent, StepEvent  # noqa: E402
from tokentui.core.runs.explore_events import SampleEvent  # noqa: E402
from tokentui.core.runs.requests import FanoutRequest  # noqa: E402
from tokentui.core.settings import RunOptions, SamplerSettings  # noqa: E402

PROMPT = "Is OpenAI open? Answer in a paragraph."
AT = 8  # the step both leave from


def timed(events) -> tuple[float, list]:
    start = time.perf_counter()
    got = list(events)
    ms = (time.perf_counter() - start) * 1000
    assert isinstance(got[-1], DoneEvent) and got[-1].reason != "error", got[-2:]
    return ms, got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--n", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    m = args.tokens
    sampler = SamplerSettings(temperature=0.8, top_p=0.9, seed=1)
    spec = EngineSpec(model=None, device=args.device, dtype="float32" if args.device == "cpu" else "auto",
                      sampler=sampler, options=RunOptions(max_new_tokens=AT + 4, ignore_eos=True))
    engine = load_engine(spec, lambda progress: None)
    events = list(engine.run(PROMPT))
    parent = [e for e in events if isinstance(e, StepEvent)]
    prompt_ids = tuple(next(e for e in events if isinstance(e, PromptEvent)).ids)
    tokens = tuple(s.id for s in parent[:AT])
    engine.options = RunOptions(max_new_tokens=m, ignore_eos=True)
    point = BranchPoint(prompt_ids, tokens, AT, parent[AT].candidates[1].id)
    load_1m = os.getloadavg()[0]
    series: dict[str, list[float]] = {"branch": [], **{f"fanout{n}": [] for n in args.n}}
    for _ in range(args.reps):
        for n in args.n:
            ms, got = timed(engine.branch(point))
            assert sum(isinstance(e, StepEvent) for e in got) == m
            series["branch"].append(ms)
            request = FanoutRequest(prompt_ids, tokens, AT, n, m, seed=7)
            ms, got = timed(engine.fanout(request))
            samples = [e for e in got if isinstance(e, SampleEvent)]
            assert len(samples) == n and all(len(s.ids) == m for s in samples)
            series[f"fanout{n}"].append(ms)
    branch = statistics.median(series["branch"])
    result = {"device": args.device, "tokens": m, "reps": args.reps, "at": AT, "prefix": len(prompt_ids) + AT,
              "load_1m_start": load_1m, "load_1m_end": os.getloadavg()[0], "branch_ms": branch,
              "fanout": {n: {"ms": statistics.median(series[f"fanout{n}"]),
                             "ratio": statistics.median(series[f"fanout{n}"]) / branch} for n in args.n}}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{m}-token branch from step {AT + 1} (a {result['prefix']}-token prefix): {branch:.0f} ms "
              f"(median of {args.reps * len(args.n)})")
        for n, row in result["fanout"].items():
            print(f"fan-out N={n:<3} M={m}: {row['ms']:.0f} ms = {row['ratio']:.2f}x the branch"
                  f"{'  (target <= 2.5x)' if n == 8 else ''}")
        print(f"load average (1 min) at start / end: {load_1m:.2f} / {result['load_1m_end']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
