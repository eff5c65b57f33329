"""Issue 39: what the attention and sublayer views cost per decode step, and in bytes per step in a record.

On the embedded model as tokentui runs it by default on CPU (the 4-bit native step) and on the float32 reference:
the same greedy run with the views off, with `--attention` (top 8, head mean), the dashboard's attention view (`A`:
top 24, head mean; tui/attention_view.py's HEAT_TOP), `--attention --attention-heads`, and `--attention --sublayers`,
interleaved, medians over the decode steps of every repetition. On the 4-bit model the views stay on the native
step, which then writes its queries and residual stream, and the weights and norms come from them and the cached keys
(core/model/observe/attention_native.py, sublayers_native.py); on the float32 model every view goes through
transformers' forward (core/model/observe/inside.py), so "on" is that forward plus the capture. "Off" is the plan's
own step, whose only addition is one check of the options per step (measured apart: `off_check_us`). Each view's
`forward_ms` says which: the native step's or the torch forward's.
Bytes: each step's JSON line (`StepEvent.to_dict()`, as a record writes it) with
the views less without them. Prints a summary; writes nothing (the figures go into BENCHMARKS.md by hand).

    .venv/bin/python benchmarks/bench_attention.py [--reps 3] [--tokens 48] [--float32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tokentui.core.model.engine import Engine  # noqa: E402
from tokentui.core.model.load.loader import load_model  # noqa: E402
from tokentui.core.runs.events import StepEvent  # noqa: E402
from tokentui.core.settings import RunOptions, SamplerSettings  # noqa: E402
from tokentui.tui.attention_view import HEAT_TOP  # noqa: E402

PROMPT = "Is OpenAI open?"
VIEWS = {"off": {}, "attention": {"attention": True}, "dashboard view": {"attention": True, "attention_top": HEAT_TOP},
         "attention+heads": {"attention": True, "attention_heads": True},
         "attention+sublayers": {"attention": True, "sublayers": True}}


def _steps(engine) -> list[StepEvent]:
    return [e for e in engine.run(PROMPT) if isinstance(e, StepEvent)]


def bench(loaded, label: str, reps: int, tokens: int) -> dict:
    greedy = SamplerSettings(temperature=0.0)
    base = RunOptions(max_new_tokens=tokens, ignore_eos=True)
    engine = Engine(loaded, greedy, base)
    step_ms: dict[str, list[float]] = {name: [] for name in VIEWS}
    forward_ms: dict[str, list[float]] = {name: [] for name in VIEWS}
    ids: dict[str, list[int]] = {}
    bytes_per_step: dict[str, float] = {}
    _steps(engine)  # warm-up
    for rep in range(reps):
        for name, view in VIEWS.items():
            engine.set_options(replace(base, **view))
            steps = _steps(engine)
            assert all((s.attention is not None) == bool(view.get("attention")) for s in steps), name
            got = [s.id for s in steps]
            assert ids.setdefault(name, got) == got
            step_ms[name] += [s.latency_ms for s in steps[1:]]
            forward_ms[name] += [s.forward_ms for s in steps[1:]]
            plain = [len(json.dumps(replace(s, attention=None, sublayers=None).to_dict())) for s in steps]
            full = [len(json.dumps(s.to_dict())) for s in steps]
            bytes_per_step[name] = statistics.mean(f - p for f, p in zip(full, plain))
        print(f"  {label} rep {rep + 1}/{reps}: " + ", ".join(
            f"{n} {statistics.median(v):.1f} ms" for n, v in step_ms.items()), flush=True)
    assert len({tuple(v) for v in ids.values()}) == 1, "a view changed the tokens"
    engine.set_options(base)
    checks = 2000
    start = time.perf_counter()
    for _ in range(checks):
        engine._inside_for(None, said=True)  # the off path's one addition per step
    off_check_us = (time.perf_counter() - start) / checks * 1e6
    off = statistics.median(step_ms["off"])
    return {"label": label, "plan": engine.plan.description, "layers": loaded.facts.layers,
            "off_check_us": off_check_us,
            **{name: {"step_ms": statistics.median(v), "ratio": statistics.median(v) / off,
                      "forward_ms": statistics.median(forward_ms[name]), "bytes": bytes_per_step[name]}
               for name, v in step_ms.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--float32", action="store_true", help="also the float32 reference (transformers' forward)")
    args = p.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    models = [("4-bit (default)", load_model(None, device="cpu"))]
    if args.float32:
        models.append(("float32", load_model(None, device="cpu", dtype="float32")))
    for label, loaded in models:
        r = bench(loaded, label, args.reps, args.tokens)
        print(f"{label}: {r['plan']}")
        print(f"  off path's added check: {r['off_check_us']:.1f} us per step")
        for name in VIEWS:
            v = r[name]
            print(f"  {name:20s} step {v['step_ms']:6.1f} ms ({v['ratio']:.2f}x)  forward {v['forward_ms']:6.1f} ms  "
                  f"+{v['bytes']:.0f} B/step in a record")
    print(f"load average at end: {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
