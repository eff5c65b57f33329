"""Issue 37's table: tokentui against llama-server on the same GGUF files, as users run them.

    .venv/bin/python benchmarks/gguf_vs_server.py --gguf NAME=PATH [--gguf ...] [--threads 1,2] [--rounds 5]
                                                  [--steps 128] [--prefill 512] [--cold 3] [--json out.json]

Per file and thread count, alternated in each round (medians of --rounds):
- decode: the `tokentui` command's `--headless --json` done event (`decode_tok_s`) of a plain greedy run against
  llama-server's own `timings.predicted_per_second` of a plain greedy `/completion` (no `n_probs`) on the same prompt
  ids (benchmarks/cli_vs_server.py's two runs);
- prefill of a --prefill-token prompt: tokentui's prefill event (tokens / ms) against llama-server's
  `timings.prompt_per_second` on the same ids (`cache_prompt` off);
and per file, at the largest thread count, --cold rounds of a cold start (the file in the page cache, the processes
new): tokentui from its command to its first step event, against llama-server from its command through `/health` to
the reply of a one-token `/completion`; each one's peak resident memory (tokentui: wait4's ru_maxrss of the `tokentui`
process, which on Linux is the larger of its own and its reaped model process's; llama-server: VmHWM).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import llama_serve  # noqa: E402
from cli_vs_server import server_run, tokentui_run  # noqa: E402

TOKENTUI = ROOT / ".venv" / "bin" / "tokentui"
PARAGRAPH = ("The quick brown fox jumps over the lazy dog while the tokenizer splits every word into pieces, and "
             "the model reads them all in one pass that fills the cache with keys and values for each position. ")


def _events(argv: list[str]) -> tuple[list[dict], float | None, int]:
    """Run a headless tokentui; (its events, seconds from the command to its first step event, its peak RSS in KiB
    over it and its children)."""
    started = time.monotonic()
    first_step: list[float] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events = []
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    for line in proc.stdout:
        event = json.loads(line)
        event["at_s"] = time.monotonic() - started  # when it came (benchmarks/cold_start.py's stage times)
        if event["event"] == "step" and not first_step:
            first_step.append(time.monotonic() - started)
        events.append(event)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} exited {proc.returncode}: {''.join(err)[-400:]}")
    # Linux: a reaped child's ru_maxrss is the larger of its own and its reaped descendants' (the model process)
    return events, (first_step[0] if first_step else None), usage.ru_maxrss


def prompt_file(command: list[str], tokens: int, folder: Path) -> tuple[Path, int]:
    """A prompt file whose chat-templated ids are about `tokens` long (one trial run measures the ratio)."""
    path = folder / "prompt.txt"
    words = tokens
    for _ in range(3):
        path.write_text(" ".join((PARAGRAPH * (words // 30 + 1)).split()[:words]))
        events, _, _ = _events([*command, "--headless", "--json", "--prompt-file", str(path), "--max-new-tokens",
                                "1", "--no-record", "--greedy"])
        ids = next(e["ids"] for e in events if e["event"] == "prompt")
        if abs(len(ids) - tokens) <= 4:
            break
        words = max(1, round(words * tokens / len(ids)))
    return path, len(ids)


def tokentui_prefill(command: list[str], prompt: Path, threads: int) -> tuple[float, list[int]]:
    events, _, _ = _events([*command, "--headless", "--json", "--prompt-file", str(prompt), "--max-new-tokens", "1",
                            "--threads", str(threads), "--no-record", "--greedy"])
    prefill = next(e for e in events if e["event"] == "prefill")
    ids = next(e["ids"] for e in events if e["event"] == "prompt")
    return 1000.0 * len(ids) / prefill["ms"], ids


def server_prefill(server, ids: list[int]) -> float:
    import httpx

    body = {"prompt": ids, "n_predict": 1, "temperature": 0.0, "cache_prompt": False}
    with httpx.Client(trust_env=False, timeout=600) as client:
        reply = client.post(f"{server.url}/completion", json=body)
        reply.raise_for_status()
    return float(reply.json()["timings"]["prompt_per_second"])


def cold_tokentui(command: list[str], threads: int) -> tuple[float, int]:
    _, first, peak = _events([*command, "--headless", "--json", "--greedy", "--max-new-tokens", "8", "--threads",
                              str(threads), "--no-record"])
    return first, peak


def cold_server(gguf: Path, threads: int, ids: list[int]) -> tuple[float, int]:
    import httpx

    started = time.monotonic()
    server = llama_serve.start(gguf, threads=threads, extra_args=["--cache-ram", "0"])
    try:
        with httpx.Client(trust_env=False, timeout=600) as client:
            client.post(f"{server.url}/completion", json={"prompt": ids, "n_predict": 1, "temperature": 0.0}
                        ).raise_for_status()
        elapsed = time.monotonic() - started
        status = Path(f"/proc/{server.process.pid}/status").read_text()
        peak = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM")))
    finally:
        server.stop()
    return elapsed, peak


def cpu_flags() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags = [f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "fma", "f16c", "amx"))]
            return f"{model}; {' '.join(flags)}"
    return "?"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--cold", type=int, default=3)
    parser.add_argument("--tokentui", default=str(TOKENTUI))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    threads_list = [int(t) for t in args.threads.split(",")]
    print(f"CPU: {cpu_flags()}; {os.cpu_count()} cores", flush=True)
    results: dict = {}
    for spec in args.gguf:
        name, _, path = spec.partition("=")
        gguf = Path(path)
        command = [*shlex.split(args.tokentui), "--model", str(gguf)]
        with tempfile.TemporaryDirectory() as tmp:
            prompt, prompt_len = prompt_file(command, args.prefill, Path(tmp))
            entry: dict = {"file_mib": gguf.stat().st_size / 2**20, "prefill_tokens": prompt_len}
            for threads in threads_list:
                server = llama_serve.start(gguf, threads=threads, extra_args=["--cache-ram", "0"])
                decode = {"tokentui": [], "llama-server": [], "ratio": []}
                prefill = {"tokentui": [], "llama-server": [], "ratio": []}
                try:
                    for round_ in range(args.rounds):
                        ours, ids, _ = tokentui_run(command, threads, args.steps)
                        theirs, _ = server_run(server, ids, args.steps)
                        pours, long_ids = tokentui_prefill(command, prompt, threads)
                        ptheirs = server_prefill(server, long_ids)
                        for table, a, b in ((decode, ours, theirs), (prefill, pours, ptheirs)):
                            table["tokentui"].append(a)
                            table["llama-server"].append(b)
                            table["ratio"].append(a / b)
                        print(f"{name} -t {threads} round {round_ + 1}: decode {ours:.1f} vs {theirs:.1f} tok/s, "
                              f"prefill {pours:.0f} vs {ptheirs:.0f} tok/s", flush=True)
                finally:
                    server.stop()
                entry[threads] = {"decode": {k: statistics.median(v) for k, v in decode.items()},
                                  "prefill": {k: statistics.median(v) for k, v in prefill.items()},
                                  "rounds": {"decode": decode, "prefill": prefill}}
            threads = max(threads_list)
            cold = {"tokentui_s": [], "server_s": [], "tokentui_kib": [], "server_kib": []}
            for round_ in range(args.cold):
                first, peak = cold_tokentui(command, threads)
                s_first, s_peak = cold_server(gguf, threads, ids)
                for key, value in zip(cold, (first, s_first, peak, s_peak)):
                    cold[key].append(value)
                print(f"{name} cold -t {threads} round {round_ + 1}: tokentui {first:.1f} s {peak / 1024:.0f} MiB, "
                      f"llama-server {s_first:.1f} s {s_peak / 1024:.0f} MiB", flush=True)
            if args.cold:  # --cold 0: decode and prefill only (benchmarks/cold_start.py times the starts alone)
                entry["cold"] = {k: statistics.median(v) for k, v in cold.items()} | {"rounds": cold}
            results[name] = entry
    print(f"\n| file | MiB | threads | decode tokentui | decode llama-server | ratio | prefill tokentui | prefill "
          "llama-server | ratio |")
    print("|---" * 9 + "|")
    for name, entry in results.items():
        for threads in threads_list:
            d, p = entry[threads]["decode"], entry[threads]["prefill"]
            print(f"| {name} | {entry['file_mib']:.0f} | {threads} | {d['tokentui']:.1f} | {d['llama-server']:.1f} | "
                  f"{d['ratio']:.2f} | {p['tokentui']:.0f} | {p['llama-server']:.0f} | {p['ratio']:.2f} |")
    print("\n| file | cold start to first token: tokentui | llama-server | ratio | peak RSS tokentui | llama-server |")
    print("|---" * 6 + "|")
    for name, entry in results.items():
        if "cold" not in entry:
            continue
        c = entry["cold"]
        print(f"| {name} | {c['tokentui_s']:.1f} s | {c['server_s']:.1f} s | {c['tokentui_s'] / c['server_s']:.1f} | "
              f"{c['tokentui_kib'] / 1024:.0f} MiB | {c['server_kib'] / 1024:.0f} MiB |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
