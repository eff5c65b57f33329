"""Issue 38's speed target: with every stage on, selection stays <= 3 % of a step at a 151,936-entry vocabulary.

One short run (a few minutes on 2 cores), in one process: two decode steps as users run them, 1 thread, the median
of 24 greedy steps each: the embedded SmolLM2's default CPU step (V = 49,152) and a Qwen3-0.6B GGUF file on ggml's
native step (V = 151,936; the bench-qwen3-0.6b fixture, benchmarks/gguf_models.py). Then `select()` on
N(0, 3.5^2) scores (sigma: the spread of SmolLM2's own scores) at both vocabularies, over a 256-token history,
for "T 0.7, top-p 0.9" (the classic chain's C++ call) and "every stage on" (benchmarks/measure/selection.py's case)
on the native chain (core/model/native/select_chain.cpp) and on torch's, interleaved, medians of 200 calls after
20 warm-up calls. Share = select / (step + select), as section 3 of BENCHMARKS.md computes it.

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

CASES = {"T 0.7, top-p 0.9 (native)": (SELECT_CASES["T=0.7, top-p 0.9"], None),
         "every stage on (native chain)": (SELECT_CASES["every stage on"], True),
         "every stage on (torch chain)": (SELECT_CASES["every stage on"], False)}


def qwen3_step_ms(fmt: str, steps: int = 24) -> float:
    """The median time of a greedy decode step of the Qwen3-0.6B GGUF file `fmt` on ggml's native step."""
    import gguf_models
    from tokentui.core.model.decode.adapter import forward_last_logits, new_cache
    from tokentui.core.model.load.gguf_stored import load_stored
    from tokentui.core.model.native import ggml_native

    model = load_stored(gguf_models.gguf_model("qwen3-0.6b", fmt)).model
    step = ggml_native.ggml_step(model)
    if step is None:
        sys.exit(f"qwen3-0.6b {fmt}: no native step ({ggml_native.why_not(model)})")
    prompt = [(i * 7919) % 49000 + 10 for i in range(16)]
    times = []
    with torch.inference_mode():
        cache = new_cache(model, len(prompt) + steps + 1)
        token = int(forward_last_logits(model, torch.tensor([prompt]), cache).argmax())
        for _ in range(steps):
            start = time.perf_counter()
            token = int(step.step(token, cache).argmax())
            times.append(time.perf_counter() - start)
    return statistics.median(times[2:]) * 1000


def main() -> None:
    load = os.getloadavg()[0]
    loaded = load_model(None, device="cpu")
    engine = Engine(loaded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=24, ignore_eos=True))
    torch.set_num_threads(1)
    _, _, steps, _ = run_engine(engine)
    step_ms = {49_152: statistics.median(s.latency_ms for s in steps[2:])}
    print(f"decode step, 1 thread: embedded SmolLM2 {step_ms[49_152]:.2f} ms; load before {load:.2f}")
    for fmt in ("Q4_0", "Q8_0"):
        ms = qwen3_step_ms(fmt)
        print(f"decode step, 1 thread: qwen3-0.6b {fmt} {ms:.2f} ms")
        step_ms.setdefault(151_936, ms)
    torch.set_num_threads(1)
    gen, src = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    for vocab in (49_152, 151_936):
        logits = [torch.randn(vocab, generator=src) * 3.5 for _ in range(8)]
        times = {name: [] for name in CASES}
        for i in range(220):
            for name, (settings, native) in CASES.items():
                start = time.perf_counter()
                select(logits[i % 8], settings, gen, 10, native=native, given=HISTORY)
                times[name].append((time.perf_counter() - start) * 1000)
        for name in CASES:
            ms = statistics.median(times[name][20:])
            print(f"V = {vocab:,} {name}: {ms:.2f} ms, {100 * ms / (step_ms[vocab] + ms):.1f} % of a "
                  f"{step_ms[vocab]:.1f} ms step")
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
