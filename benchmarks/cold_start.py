"""Issue 37's cold-start and peak-memory figures alone: benchmarks/gguf_vs_server.py's cold rounds, timed by its own
`_events` and `cold_server` (the `tokentui` command from its start to its first step event, against llama-server
from its start through `/health` to the reply of a one-token `/completion`; each one's peak resident memory), without
its decode and prefill rounds, and with where tokentui's time went: the seconds from its start to each load stage's
first event and to its model, prompt, prefill and first step events.

    .venv/bin/python benchmarks/cold_start.py --gguf NAME=PATH [--gguf ...] [--threads 2] [--rounds 3]
                                              [--tokentui NAME=COMMAND ...] [--json out.json]

Each --tokentui contender is a command line that starts tokentui (default: this checkout's `.venv/bin/tokentui`):
two checkouts compared in the same rounds. Each round runs, per file, every contender and llama-server, the order
turned by one each round (the file in the page cache from a first, untimed run of each contender, which also fills
tokentui's own caches); the ratios to llama-server are per round, their median printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gguf_vs_server import TOKENTUI, _events, cold_server, cpu_flags  # noqa: E402


def tokentui_cold(command: list[str], threads: int) -> tuple[float, int, dict[str, float], list[int]]:
    """One cold start: (seconds to the first step, peak RSS KiB, seconds at each stage's start, the prompt ids)."""
    events, first, peak = _events([*command, "--headless", "--json", "--greedy", "--max-new-tokens", "8",
                                   "--threads", str(threads), "--no-record"])
    stages: dict[str, float] = {}
    for event in events:
        key = event["stage"] if event["event"] == "load" else event["event"]
        stages.setdefault(key, event["at_s"])
    ids = next(e["ids"] for e in events if e["event"] == "prompt")
    return first, peak, stages, ids


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokentui", action="append", metavar="NAME=COMMAND")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_flags()}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}", flush=True)
    files = [(name, Path(path)) for name, _, path in (spec.partition("=") for spec in args.gguf)]
    contenders = [(who, shlex.split(command)) for who, _, command in
                  (spec.partition("=") for spec in args.tokentui or [f"tokentui={TOKENTUI}"])]
    ids = {}
    for who, command in contenders:  # caches filled, the file in the page cache: untimed
        for name, path in files:
            ids[name] = tokentui_cold([*command, "--model", str(path)], args.threads)[3]
    results: dict = {(who, name): {"tokentui_s": [], "server_s": [], "ratio": [], "tokentui_kib": [],
                                   "server_kib": [], "stages": []} for who, _ in contenders for name, _ in files}
    for round_ in range(args.rounds):
        for name, path in files:
            # who starts right after whom matters: a start after one that just gave back its huge pages finds them
            # free, one after llama-server (whose memory the kernel hands back in small pages) may wait for the
            # kernel to compact memory (BENCHMARKS.md, "A later start without transformers' model"); so the order
            # turns by one each round, llama-server included
            order = [*contenders, ("llama-server", None)]
            shift = round_ % len(order)
            ours, sequence = {}, order[shift:] + order[:shift]
            for who, command in sequence:
                if command is None:
                    s_first, s_peak = cold_server(path, args.threads, ids[name])
                else:
                    ours[who] = tokentui_cold([*command, "--model", str(path)], args.threads)
            for who, (first, peak, stages, _) in ours.items():
                entry = results[who, name]
                for key, value in zip(("tokentui_s", "server_s", "ratio", "tokentui_kib", "server_kib", "stages"),
                                      (first, s_first, first / s_first, peak, s_peak, stages)):
                    entry[key].append(value)
                said = ", ".join(f"{stage} {at:.2f}" for stage, at in stages.items())
                print(f"{name} round {round_ + 1} (load {os.getloadavg()[0]:.1f}): {who} {first:.2f} s "
                      f"{peak / 1024:.0f} MiB, llama-server {s_first:.2f} s {s_peak / 1024:.0f} MiB, ratio "
                      f"{first / s_first:.2f} (order {', '.join(w for w, _ in sequence)}); its stages at: {said}",
                      flush=True)
    print(f"\n| file | MiB | contender | cold start | llama-server | ratio (median of rounds) | peak RSS | "
          "llama-server |")
    print("|---" * 8 + "|")
    for (who, name), e in results.items():
        path = dict(files)[name]
        print(f"| {name} | {path.stat().st_size / 2**20:.0f} | {who} | {statistics.median(e['tokentui_s']):.2f} s | "
              f"{statistics.median(e['server_s']):.2f} s | {statistics.median(e['ratio']):.2f} | "
              f"{statistics.median(e['tokentui_kib']) / 1024:,.0f} MiB | "
              f"{statistics.median(e['server_kib']) / 1024:,.0f} MiB |")
    if args.json:
        args.json.write_text(json.dumps({f"{who} {name}": e for (who, name), e in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
