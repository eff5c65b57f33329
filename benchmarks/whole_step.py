"""--compile's whole step (core/model/decode/compiled.py, core/model/decode/fused_step.py): recompiles over 1,000 steps with sampler
changes (--steps), and what Dynamo's guards cost per call, in one process.

    .venv/bin/python benchmarks/whole_step.py [--model embedded|tiny] [--calls 400] [--json out.json]

Dynamo's eager backend (the graph Dynamo captures, run by eager ATen): recompiles and guards are Dynamo's, the
same whatever backend compiles the graph, and the eager backend captures in seconds where inductor's autotuning
takes minutes here. Guard cost: the captured step called in alternated blocks with guard evaluation on (the
default, what tokentui runs) and skipped (`torch.compiler.set_stance(skip_guard_eval_unsafe=True)`); the
difference of the medians per call is what the guards cost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import tokentui.core.model.decode.compiled as compiled  # noqa: E402
from measure.common import print_and_save  # noqa: E402
from tokentui.core.model.load.loader import load_model  # noqa: E402
from tokentui.core.settings import SamplerSettings  # noqa: E402

SAMPLERS = [SamplerSettings(temperature=0), SamplerSettings(temperature=0.8, top_k=40, seed=3),
            SamplerSettings(temperature=1.0, top_p=0.9), SamplerSettings(temperature=1.2, top_k=200, top_p=0.95)]
BUCKET = 1024


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("tiny", "embedded"), default="embedded")
    p.add_argument("--calls", type=int, default=400, help="timed calls per guard setting")
    p.add_argument("--steps", type=int, default=1000, help="whole steps counted for recompiles")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    compiled.compile_settings = lambda device: (dict(fullgraph=True, dynamic=False, backend="eager"), {})
    base = load_model(None, device="cpu")
    if args.model == "tiny":
        from step_kernels import tiny_smollm

        model = tiny_smollm(base.tokenizer)
    else:
        model = base.model
    decoder = compiled.CompiledDecoder(model, top_n=10)
    started = time.perf_counter()
    decoder.warm_up(BUCKET)
    warm_s = time.perf_counter() - started
    assert decoder.failure is None, decoder.failure
    cache = decoder.cache(BUCKET)
    prompt = torch.full((1, 8), 1, dtype=torch.long)
    decoder.prefill(prompt, cache)
    held = [prompt.shape[1]]  # the positions the static cache holds (a run's RunCache counts them on the host)

    def refill_when_full() -> None:
        if held[0] >= BUCKET - 1:
            decoder.prefill(prompt, cache)
            held[0] = prompt.shape[1]

    graphs, frames = counters["stats"]["unique_graphs"], counters["frames"]["ok"]
    token = 1
    for step in range(args.steps):  # the sampler changes four times
        sampler = SAMPLERS[min(len(SAMPLERS) - 1, step * len(SAMPLERS) // args.steps)]
        refill_when_full()
        packed = decoder.step_select(token, cache, held[0], sampler, None)
        held[0] += 1
        token = int(packed[2])
    recompiles = counters["stats"]["unique_graphs"] - graphs, counters["frames"]["ok"] - frames

    def block(skip: bool, n: int = 50) -> list[float]:
        out = []
        with torch.inference_mode(), torch.compiler.set_stance("default", skip_guard_eval_unsafe=skip):
            for _ in range(n):
                refill_when_full()
                t0 = time.perf_counter()
                decoder._step(decoder._ids, cache, decoder._sampler, decoder._noise)  # the captured step itself
                out.append(time.perf_counter() - t0)
                held[0] += 1
        return out

    times = {False: [], True: []}
    for _ in range(max(1, args.calls // 50)):
        for skip in (False, True):  # alternated
            times[skip].extend(block(skip))
    with_guards, without = statistics.median(times[False]) * 1e3, statistics.median(times[True]) * 1e3
    result = {"model": args.model, "capture_s": warm_s, "steps": args.steps, "new_graphs": recompiles[0],
              "new_frames": recompiles[1], "step_ms_with_guards": with_guards,
              "step_ms_guards_skipped": without, "guard_ms": with_guards - without,
              "guard_share": (with_guards - without) / with_guards}
    print_and_save(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
