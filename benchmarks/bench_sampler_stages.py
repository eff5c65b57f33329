"""Issue 38's speed target: with every stage on, selection stays <= 3 % of a step at a 151,936-entry vocabulary.

One short run (about a minute on 2 cores), in one process: the embedded SmolLM2's default CPU decode step (24
greedy tokens, the median step's time), then `select()` on N(0, 3.5^2) scores (sigma: the spread of SmolLM2's own
scores) at V = 49,152 and 151,936, over a 256-token history, for "T 0.7, top-p 0.9" (today's chain, the native
call on CPU) and "every stage on" (benchmarks/measure/selection.py's case: the whole chain on torch),
interleaved, medians of 200 calls after 20 warm-up calls. Share = select / (step + select), as section 3 of
BENCHMARKS.md computes it (a model with a 151,936-token vocabulary has a longer step, so that column overstates
its share).

    .venv/bin/python benchmarks/bench_sampler_stages.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from measure.common import run_engine  # noqa: E402
from measure.selection import HISTORY, SELECT_CASES  # noqa: E402
from tokentui.core.model.engine import Engine  # noqa: E402
from tokentui.core.model.load.loader import load_model  # noqa: E402
from tokentui.core.settings import RunOptions, SamplerSettings  # noqa: E402
from tokentui.core.steps.select import select  # noqa: E402

CASES = {"T 0.7, top-p 0.9": SELECT_CASES["T=0.7, top-p 0.9"], "every stage on": SELECT_CASES["every stage on"]}


def main() -> None:
    load = os.getloadavg()[0]
    loaded = load_model(None, device="cpu")
    engine = Engine(loaded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=24, ignore_eos=True))
    _, _, steps, _ = run_engine(engine)
    step_ms = statistics.median(s.latency_ms for s in steps[2:])
    threads = engine.speed.decode_threads()
    torch.set_num_threads(threads)
    print(f"decode step (embedded model, CPU default, {threads} threads): {step_ms:.2f} ms; load before {load:.2f}")
    gen, src = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    for vocab in (49_152, 151_936):
        logits = [torch.randn(vocab, generator=src) * 3.5 for _ in range(8)]
        times = {name: [] for name in CASES}
        for i in range(220):
            for name, settings in CASES.items():
                start = time.perf_counter()
                select(logits[i % 8], settings, gen, 10, given=HISTORY)
                times[name].append((time.perf_counter() - start) * 1000)
        for name in CASES:
            ms = statistics.median(times[name][20:])
            print(f"V = {vocab:,} {name}: {ms:.2f} ms, {100 * ms / (step_ms + ms):.1f} % of a step")
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
