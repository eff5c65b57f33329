"""The GPU check: the real product on a CUDA machine, one table.

On a Qwen3-0.6B-shaped model with random weights built from its config (no download; bf16 on CUDA) and a real
tokenizer (the embedded SmolLM2 one, or a saved tokenizer folder: `--tokenizer DIR`), it times, each in a fresh
process (its first run) and again warmed (a second run in that process where the contender has one):

    generate           transformers' `model.generate`, greedy, eager
    headless           `tokentui --headless --json` (the real command line), eager
    headless compile   the same with `--compile` (the whole step compiled: forward, selection, packing)
    headless kv-shapes eager with the other `--kv-shapes` than the device's default (bucketed on a CPU, dynamic
                       on CUDA: the attention shape once per 256-position bucket against once per step)
    dashboard          the real dashboard in tmux (`tokentui`, eager); `dashboard compile` with `--compile`

and prints ms/token (decode steps only), the median and p95 step, the dashboard's UI lag (from the run's `done`
in its record to "done" on the screen) and the share of the HBM roofline (the weights' bytes read per step ÷ the
device's bandwidth, measured here). Nothing is downloaded or installed; it needs torch, transformers and
tokentui's own dependencies (textual & co. for the dashboard rows) importable by the Python it runs with, and tmux
for the dashboard rows (`--tmux PATH`; without it those rows say "not measured: no tmux").

    .venv/bin/python benchmarks/gpu_check.py                       # CUDA, bf16, 1,024 tokens
    .venv/bin/python benchmarks/gpu_check.py --device cpu --tiny   # dry run of every row on a CPU (tests run it)
    options: --tokens N, --no-compile, --no-dashboard, --json FILE, --workdir DIR, --tokenizer DIR, --tmux PATH
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QWEN3_0_6B = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True,
                  max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1_000_000.0)
TINY = dict(QWEN3_0_6B, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=128, max_position_embeddings=2048)
PROMPT = "What does a KV cache store?"


def say(*parts) -> None:
    print("gpu_check:", *parts, file=sys.stderr, flush=True)


# ---- the model folder ----------------------------------------------------------------------------------------
def build_model(folder: Path, tiny: bool, dtype: str, tokenizer_dir: Path | None) -> dict:
    """A Qwen3-0.6B-shaped model (random weights, seed 0) saved with a real tokenizer: what --model reads."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    if tokenizer_dir is not None:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    else:
        sys.path.insert(0, str(ROOT))
        from tokentui.core.model.load.precheck import embedded_gguf

        gguf = embedded_gguf()
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    shape = TINY if tiny else QWEN3_0_6B
    config = Qwen3Config(**shape, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                         else tokenizer.eos_token_id)
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(getattr(torch, dtype)).eval()
    # ids the tokenizer does not have would show as nothing; the model's rows stay Qwen3's (the LM head's cost)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    emb = model.get_input_embeddings().weight
    weights = sum(p.nbytes for p in model.parameters())  # a tied head reads the embedding once, as the LM head
    return {"parameters": sum(p.numel() for p in model.parameters()), "weight_bytes": weights,
            "embedding_bytes": emb.nbytes, "vocab": shape["vocab_size"], "tokenizer_vocab": len(tokenizer)}


def bandwidth_gbs(device: str) -> float:
    """The device's memory bandwidth: the best of read (sum) and read + write (copy) over a buffer larger than any
    cache, in GB/s."""
    import torch

    dev = torch.device(device)
    gib = 4.0 if dev.type == "cuda" else 0.5
    x = torch.ones(int(gib * 2**30 / 2), dtype=torch.bfloat16, device=dev)
    y = torch.empty_like(x)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    best = 0.0
    for i in range(8):
        sync(); t = time.perf_counter(); x.sum(); sync(); read = x.nbytes / (time.perf_counter() - t)  # noqa: E702
        sync(); t = time.perf_counter(); y.copy_(x); sync(); copy = 2 * x.nbytes / (time.perf_counter() - t)  # noqa
        if i >= 2:
            best = max(best, read, copy)
    return best / 1e9


# ---- contenders ----------------------------------------------------------------------------------------------
GENERATE = r"""
import json, sys, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, device, dtype, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tok = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device).eval()
ids = tok.apply_chat_template([{"role": "user", "content": %r}], add_generation_prompt=True, return_tensors="pt",
                              return_dict=True)["input_ids"].to(device)
def sync():
    if device.startswith("cuda"): torch.cuda.synchronize()
out = []
for _ in range(2):
    sync(); t = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=1, min_new_tokens=1)
    sync(); t1 = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, min_new_tokens=n)
    sync(); t2 = time.perf_counter()
    out.append(((t2 - t1) - (t1 - t)) / (n - 1) * 1000)  # less one prefill + first token: decode steps only
print(json.dumps({"first": out[0], "warm": out[1]}))
""" % PROMPT


def run_generate(folder: Path, device: str, dtype: str, tokens: int, env: dict) -> dict:
    result = subprocess.run([sys.executable, "-c", GENERATE, str(folder), device, dtype, str(tokens)],
                            capture_output=True, text=True, env=env, timeout=1800)
    if result.returncode != 0:
        return {"error": result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed"}
    times = json.loads(result.stdout.strip().splitlines()[-1])
    return {"first_ms": times["first"], "warm_ms": times["warm"]}


def step_figures(events: list[dict]) -> dict:
    """ms/token, p50, p95 of a run's decode steps (its events as JSON)."""
    decode = [e["latency_ms"] for e in events if e.get("event") == "step" and e["index"] > 0]
    if not decode:
        return {"error": "no decode step"}
    ordered = sorted(decode)
    return {"ms": statistics.fmean(decode), "p50": statistics.median(decode),
            "p95": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], "steps": len(decode) + 1}


def tokentui_args(folder: Path, device: str, dtype: str, tokens: int, compile_: bool,
                  kv_shapes: str = "auto") -> list[str]:
    args = ["--model", str(folder), "--device", device, "--dtype", dtype, "--temperature", "0", "--ignore-eos",
            "--max-new-tokens", str(tokens), "--prompt", PROMPT, "--kv-shapes", kv_shapes]
    return args + (["--compile"] if compile_ else [])


WARM = r"""
import json, statistics, sys
from tokentui.core.link.protocol import EngineSpec
from tokentui.core.model.load.build import load_engine
from tokentui.core.runs.events import StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings
folder, device, dtype, n, compile_ = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
engine = load_engine(EngineSpec(model=folder, device=device, dtype=dtype, compile=compile_, kv_shapes=sys.argv[6],
                                sampler=SamplerSettings(temperature=0.0),
                                options=RunOptions(max_new_tokens=n, ignore_eos=True)))
runs = []
for _ in range(2):
    steps = [e for e in engine.run(%r) if isinstance(e, StepEvent)]
    runs.append(statistics.fmean(s.latency_ms for s in steps[1:]))
print(json.dumps({"first": runs[0], "warm": runs[1]}))
""" % PROMPT


def run_engine_warm(folder: Path, device: str, dtype: str, tokens: int, compile_: bool, env: dict,
                    kv_shapes: str = "auto") -> float | None:
    """The engine's second run in one process (the warmed figure of a headless row), in ms/token."""
    result = subprocess.run([sys.executable, "-c", WARM, str(folder), device, dtype, str(tokens),
                             "1" if compile_ else "0", kv_shapes], capture_output=True, text=True, env=env,
                            timeout=1800)
    if result.returncode != 0:
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])["warm"]


def run_headless(folder: Path, device: str, dtype: str, tokens: int, compile_: bool, env: dict,
                 kv_shapes: str = "auto") -> dict:
    """The real command line, a fresh process: its first run; and the engine's second run in one process."""
    cmd = [sys.executable, "-m", "tokentui", *tokentui_args(folder, device, dtype, tokens, compile_, kv_shapes),
           "--headless",
           "--json", "--no-record"]
    started = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        return {"error": (result.stderr.strip().splitlines() or ["failed"])[-1]}
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    figures = step_figures(events)
    figures["wall_s"] = wall
    figures["warm_ms"] = run_engine_warm(folder, device, dtype, tokens, compile_, env, kv_shapes)
    return figures


def run_dashboard(folder: Path, device: str, dtype: str, tokens: int, compile_: bool, env: dict, tmux: str,
                  workdir: Path) -> dict:
    """The real dashboard in a private tmux server (160x48): the run's steps from its record, and the UI lag from
    the record's `done` line appearing to "done" on the screen."""
    records = workdir / f"records-{'compile' if compile_ else 'eager'}"
    records.mkdir(parents=True, exist_ok=True)
    socket = f"tokentui-gpu-check-{os.getpid()}-{int(compile_)}"
    command = " ".join([sys.executable, "-m", "tokentui", *[f"'{a}'" for a in tokentui_args(
        folder, device, dtype, tokens, compile_)], "--record-dir", str(records)])
    tm = [tmux, "-L", socket]
    environ = " ".join(f"{k}='{v}'" for k, v in env.items() if k.startswith(("TOKENTUI_", "HF_", "PYTHON", "LD_")))
    subprocess.run([*tm, "new-session", "-d", "-x", "160", "-y", "48", f"env {environ} {command}"], check=True,
                   env={**os.environ, "TERM": "xterm-256color"})
    try:
        deadline = time.monotonic() + 1800
        record_done = screen_done = None
        while time.monotonic() < deadline and screen_done is None:
            now = time.monotonic()
            if record_done is None:
                for record in records.glob("*.jsonl"):
                    if not record.name.endswith(".tree.jsonl") and '"event": "done"' in record.read_text():
                        record_done = now
            screen = subprocess.run([*tm, "capture-pane", "-p"], capture_output=True, text=True).stdout
            if "✓ done" in screen or "✗ error" in screen:
                screen_done = now
                if record_done is None:
                    record_done = now
            time.sleep(0.01)
        subprocess.run([*tm, "send-keys", "q"], capture_output=True)
        time.sleep(2)
    finally:
        subprocess.run([*tm, "kill-server"], capture_output=True)
    files = [p for p in records.glob("*.jsonl") if not p.name.endswith(".tree.jsonl")]
    if not files:
        return {"error": "no record written"}
    events = [json.loads(line) for line in files[-1].read_text().splitlines()]
    figures = step_figures(events)
    if record_done is not None and screen_done is not None:
        figures["ui_lag_ms"] = (screen_done - record_done) * 1000
    return figures


# ---- the table -----------------------------------------------------------------------------------------------
def table(rows: list[tuple[str, dict]], roofline_ms: float) -> str:
    def cell(value, fmt="{:.2f}"):
        return "—" if value is None else fmt.format(value)

    lines = ["| contender | ms/token (first run, fresh process) | ms/token (warmed) | p50 step | p95 step | UI lag "
             "| roofline share |", "|---|---|---|---|---|---|---|"]
    for name, r in rows:
        if "error" in r or "not measured" in r:
            lines.append(f"| {name} | {r.get('error') or r.get('not measured')} | | | | | |")
            continue
        ms = r.get("ms", r.get("first_ms"))
        share = roofline_ms / ms if ms else None
        lines.append(f"| {name} | {cell(ms)} | {cell(r.get('warm_ms'))} | {cell(r.get('p50'))} | "
                     f"{cell(r.get('p95'))} | {cell(r.get('ui_lag_ms'), '{:.0f} ms')} | "
                     f"{cell(share * 100 if share else None, '{:.1f} %')} |")
    lines.append(f"| HBM roofline | {roofline_ms:.3f} | | | | | 100 % |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer Qwen3 (a dry run of every row)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per run (1,024; --tiny: 16)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-dashboard", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--tokenizer", type=Path, default=None, help="a saved tokenizer folder (default: the embedded "
                                                                  "SmolLM2 tokenizer, read from its GGUF)")
    ap.add_argument("--tmux", default=None, help="the tmux binary (default: tmux on PATH)")
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:
        print(f"gpu_check: this Python ({sys.executable}) lacks {err.name}; it needs torch and transformers",
              file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible to torch here; for a dry run use --device cpu --tiny", file=sys.stderr)
        return 2
    tokens = args.tokens or (16 if args.tiny else 1024)
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tokentui-gpu-check-"))
    folder = workdir / "qwen3-0.6b-shaped"
    started = time.perf_counter()
    info = build_model(folder, args.tiny, dtype, args.tokenizer)
    say(f"model: {info['parameters'] / 1e6:.0f} M parameters ({dtype}) in {folder}, built in "
        f"{time.perf_counter() - started:.0f} s")
    bw = bandwidth_gbs(args.device)
    roofline_ms = info["weight_bytes"] / (bw * 1e9) * 1000
    say(f"bandwidth {bw:.0f} GB/s; weights read per step {info['weight_bytes'] / 1e9:.3f} GB -> roofline "
        f"{roofline_ms:.3f} ms/token")
    env = {**os.environ, "TOKENTUI_STATE_DIR": str(workdir / "state"), "TOKENTUI_CACHE_DIR": str(workdir / "cache"),
           "TOKENTUI_CONFIG_DIR": str(workdir / "config"), "HF_HUB_OFFLINE": "1"}
    rows: list[tuple[str, dict]] = []
    say("generate ..."); rows.append(("generate (eager)", run_generate(folder, args.device, dtype, tokens, env)))
    for compile_ in ([False] if args.no_compile else [False, True]):
        name = "headless" + (" --compile" if compile_ else " (eager)")
        say(f"{name} ..."); rows.append((name, run_headless(folder, args.device, dtype, tokens, compile_, env)))
    # eager with the KV shapes --kv-shapes auto does not pick on this device (core/model/decode/static_cache.py): bucketed
    # on a CPU, dynamic (a new attention shape every step) on CUDA
    other = "dynamic" if args.device.startswith("cuda") else "bucketed"
    name = f"headless --kv-shapes {other}"
    say(f"{name} ..."); rows.append((name, run_headless(folder, args.device, dtype, tokens, False, env, other)))
    tmux = args.tmux or shutil.which("tmux")
    for compile_ in ([False] if args.no_compile else [False, True]):
        name = "dashboard" + (" --compile" if compile_ else " (eager)")
        if args.no_dashboard:
            continue
        if tmux is None:
            rows.append((name, {"not measured": "not measured: no tmux (--tmux PATH)"}))
            continue
        say(f"{name} ...")
        rows.append((name, run_dashboard(folder, args.device, dtype, tokens, compile_, env, tmux, workdir)))
    out = table(rows, roofline_ms)
    print(out)
    say(f"done in {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps({"device": args.device, "dtype": dtype, "tokens": tokens, **info,
                                         "bandwidth_gbs": bw, "roofline_ms": roofline_ms,
                                         "rows": dict(rows)}, indent=2) + "\n")
    return 1 if any("error" in r for _, r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
