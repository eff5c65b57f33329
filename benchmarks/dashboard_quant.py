"""Issue 25: dashboard ÷ headless on the 4-bit default path and on the float32 reference, the two alternated in one
process (bench.py's bench_dashboard for each: the app here, the model in a child process as `tokentui` runs it),
to tell whether a low ratio is the 4-bit path's or the machine's load. Prints each round; writes nothing.

    .venv/bin/python benchmarks/dashboard_quant.py [--reps 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from measure.dashboard import bench_dashboard  # noqa: E402
from tokentui.core.model.engine import Engine  # noqa: E402
from tokentui.core.model.load.loader import load_model  # noqa: E402
from tokentui.core.settings import RunOptions, SamplerSettings  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    options, greedy = RunOptions(max_new_tokens=128, ignore_eos=True), SamplerSettings(temperature=0.0)
    engines = {"4-bit": Engine(load_model(None, device="cpu"), greedy, options),
               "float32": Engine(load_model(None, device="cpu", dtype="float32"), greedy, options)}
    print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    for round_ in range(args.rounds):
        for name, engine in engines.items():
            r = bench_dashboard(engine, args.reps)
            print(f"round {round_ + 1} {name}: headless {r['tok_s']['headless']:.1f} tok/s, dashboard "
                  f"{r['tok_s']['dashboard']:.1f}, ratio {r['ratio']:.2f} (load {os.getloadavg()[0]:.1f})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
