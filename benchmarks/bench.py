"""tokentui against what a user would run instead, in one process, as ratios; writes BENCHMARKS.md.

Each measurement is a module of benchmarks/measure/ (named in the list below), the report writer is
measure/report.py; this file only runs them in order.

    .venv/bin/python benchmarks/bench.py            # everything (~10 min on 2 cores)
    .venv/bin/python benchmarks/bench.py --quick    # fewer repetitions, no cold start, no compile (~3 min)

Shared machines are noisy (+-15 % between processes, worse while other jobs run), so every comparison runs in
this one process, the contenders interleaved (A B A B ...), each figure a median over repetitions, and each target
a ratio of two medians measured side by side. The embedded SmolLM2-135M-Instruct is used throughout: a 38-token
chat prompt, 128 greedy tokens with ignore_eos.

What is measured (the numbers match the issue's list):
 1. engine decode tok/s / transformers generate(do_sample=False) tok/s, same prompt, same 128 token IDs (asserted);
    generate at torch's default thread count (what a user gets) and at the engine's; the engine with defaults and
    with --compile. (measure/decode.py)
 2. decode tok/s with the real dashboard attached (TokentuiApp driven headless by textual's run_test) / headless.
    (measure/dashboard.py)
 3. selection + reporting (select(): temperature, top-k, top-p, sampling, top-K candidates, entropy) as a share of a
    decode step, at vocab 49,152 and 151,936 (random logits), top-p on and off. (measure/selection.py)
 4. decode tok/s / the physical limit = memory bandwidth (measured here) / weight bytes read per step. (measure/decode.py)
 5. launch to first token in fresh processes: cold (GGUF conversion, empty cache dir) and warm. (measure/launch.py)
 6. prefill time for 32 / 256 / 1,024 / 2,048-token prompts: the engine against a plain forward at torch defaults.
    (measure/prefill.py)
 7. the logit lens's cost per decode step (--logit-lens): the same 64 greedy tokens with it off and on. (measure/lens.py)
 8. a branch (core/model/branch.py) at a 256-token prefix, reusing the parent run's KV cache: time from the branch call to
    its first new token / the engine's prefill time of the same prefix. (measure/branch.py)
 9. `tokentui replay FILE` (no model): launch to the dashboard's first frame in a real terminal (tmux, 80x24), and
    `--headless --json` to its first line. (measure/replay.py)
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from measure.common import ROOT, log, machine  # noqa: E402  (first: it notes torch's default thread count)
from tokentui.core.model.load.loader import load_model  # noqa: E402
from measure.branch import bench_branch  # noqa: E402
from measure.dashboard import bench_dashboard  # noqa: E402
from measure.decode import bench_decode  # noqa: E402
from measure.launch import bench_launch  # noqa: E402
from measure.lens import bench_lens  # noqa: E402
from measure.prefill import bench_prefill  # noqa: E402
from measure.replay import bench_replay_first_frame  # noqa: E402
from measure.report import write_report  # noqa: E402
from measure.selection import bench_select, engine_overhead, real_scores  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 repetitions, no compile, no cold start")
    p.add_argument("--reps", type=int, default=None, help="repetitions per measurement (default 5; 2 with --quick)")
    p.add_argument("--no-compile", action="store_true", help="skip the --compile measurement")
    p.add_argument("--no-dashboard", action="store_true")
    p.add_argument("--no-launch", action="store_true")
    p.add_argument("--no-replay", action="store_true", help="skip `tokentui replay`'s first frame (needs tmux)")
    p.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = p.parse_args()
    args.reps = args.reps or (2 if args.quick else 5)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    info = machine()
    log(f"machine: {info}")
    loaded = load_model(None, device="cpu", dtype="float32")
    stock = load_model(None, device="cpu", dtype="float32")  # never given to a default engine: weights as loaded
    log("1, 4: decode against generate ...")
    d = bench_decode(loaded, stock, args.reps, with_compile=not (args.quick or args.no_compile))
    engine = d.pop("_engine")
    dash = None
    if not args.no_dashboard:
        log("2: dashboard attached ...")
        try:
            dash = bench_dashboard(engine, args.reps)
        except ImportError as err:
            log(f"  skipped: the dashboard is not importable ({err})")
    log("3: selection ...")
    sel = bench_select(1000 / d["tok_s"]["engine"], engine.speed.decode_threads(),
                       real_scores(stock, d["prompt_ids"]))
    over = engine_overhead(engine)
    log("7: logit lens ...")
    lens = bench_lens(loaded, args.reps)
    log("8: branch ...")
    branch = bench_branch(loaded, args.reps)
    log("6: prefill ...")
    pre = bench_prefill(loaded, stock, max(2, args.reps - 2))
    launch = None
    if not args.no_launch:
        log("5: launch to first token ...")
        launch = bench_launch(3 if not args.quick else 2, cold=not args.quick)
    replay = None
    if not args.no_replay:
        log("9: replay to the first frame ...")
        replay = bench_replay_first_frame(loaded, args.reps)
    text = write_report(args.out, info, d, dash, sel, over, pre, launch, started, load_before, os.getloadavg()[0],
                        args, lens, branch, replay)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
