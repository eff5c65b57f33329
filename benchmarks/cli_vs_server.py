"""The speed figure as users get it: the `tokentui` command (the model in its own process, `--headless --json`'s
done event) against llama-server started plainly (`-t N`), timed by its own `timings` of a plain greedy
`/completion` (no `n_probs`), on the embedded GGUF (or --gguf's file), alternated, medians of --rounds.

    .venv/bin/python benchmarks/cli_vs_server.py [--threads 1,2] [--rounds 5] [--steps 128] [--gguf PATH]
                                                 [--tokentui NAME=COMMAND ...] [--json out.json]

Each --tokentui contender is a command line (split like a shell would) that starts tokentui; the default is this
checkout's `.venv/bin/tokentui`; with --gguf, each runs with `--model PATH` added. Several contenders (e.g. two
checkouts) run in the same rounds, so their ratios to llama-server are comparable. Every round runs each contender
once and the server once, in turn; the server is started once per thread count and sits idle while tokentui runs.
Prints one line per round and a summary table (Markdown).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import llama_build  # noqa: E402
import llama_serve  # noqa: E402


def tokentui_run(command: list[str], threads: int, steps: int) -> tuple[float, list[int], list[int]]:
    """One headless run; (decode tok/s of its done event, its prompt ids, its answer ids)."""
    argv = [*command, "--headless", "--json", "--greedy", "--ignore-eos", "--max-new-tokens", str(steps),
            "--threads", str(threads), "--no-record"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} exited {out.returncode}: {out.stderr.strip()[-400:]}")
    prompt, answer, done = [], [], None
    for line in out.stdout.splitlines():
        event = json.loads(line)
        if event["event"] == "prompt":
            prompt = event["ids"]
        elif event["event"] == "step":
            answer.append(event["id"])
        elif event["event"] == "done":
            done = event
    if done is None or done["tokens"] != steps:
        raise SystemExit(f"{shlex.join(argv)}: no done event of {steps} tokens")
    return float(done["decode_tok_s"]), prompt, answer


def server_run(server, prompt: list[int], steps: int) -> tuple[float, list[int]]:
    """One plain greedy /completion (no n_probs); (llama-server's own predicted tok/s, its token ids)."""
    import httpx

    body = {"prompt": prompt, "n_predict": steps, "temperature": 0.0, "ignore_eos": True, "cache_prompt": False,
            "return_tokens": True}
    with httpx.Client(trust_env=False, timeout=600) as client:
        reply = client.post(f"{server.url}/completion", json=body)
        reply.raise_for_status()
        data = reply.json()
    return float(data["timings"]["predicted_per_second"]), list(data.get("tokens") or [])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--tokentui", action="append", default=[], metavar="NAME=COMMAND")
    parser.add_argument("--gguf", type=Path, help="a GGUF file both run (default: the embedded model)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    contenders = {}
    for spec in args.tokentui or [f"tokentui={ROOT / '.venv/bin/tokentui'}"]:
        name, _, command = spec.partition("=")
        contenders[name] = shlex.split(command) + (["--model", str(args.gguf)] if args.gguf else [])
    gguf = args.gguf or llama_build.embedded_gguf()
    started = time.monotonic()
    results: dict = {}
    for threads in [int(t) for t in args.threads.split(",")]:
        server = llama_serve.start(gguf, threads=threads, extra_args=["--cache-ram", "0"])
        try:
            rates: dict[str, list[float]] = {name: [] for name in [*contenders, "llama-server"]}
            ratios: dict[str, list[float]] = {name: [] for name in contenders}
            prompt = None
            for round_ in range(args.rounds):
                line = []
                for name, command in contenders.items():
                    rate, prompt, _answer = tokentui_run(command, threads, args.steps)
                    rates[name].append(rate)
                    line.append(f"{name} {rate:.1f}")
                rate, _ids = server_run(server, prompt, args.steps)
                rates["llama-server"].append(rate)
                for name in contenders:
                    ratios[name].append(rates[name][-1] / rate)
                print(f"-t {threads} round {round_ + 1}: " + ", ".join(line) + f", llama-server {rate:.1f} tok/s",
                      flush=True)
        finally:
            server.stop()
        results[threads] = {"tok_s": {k: statistics.median(v) for k, v in rates.items()},
                            "ratio": {k: statistics.median(v) for k, v in ratios.items()}, "rounds": rates}
    print(f"\n{args.rounds} rounds, {args.steps} greedy tokens (ignore_eos), {time.monotonic() - started:.0f} s\n")
    print("| threads | " + " | ".join(f"{n} tok/s" for n in contenders) + " | llama-server tok/s | "
          + " | ".join(f"{n} ÷ llama-server (median of rounds)" for n in contenders) + " |")
    print("|---" * (2 + 2 * len(contenders)) + "|")
    for threads, r in results.items():
        print(f"| {threads} | " + " | ".join(f"{r['tok_s'][n]:.1f}" for n in contenders)
              + f" | {r['tok_s']['llama-server']:.1f} | " + " | ".join(f"{r['ratio'][n]:.2f}" for n in contenders)
              + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
