"""tokentui against what a user would run instead, in one process, as ratios; writes BENCHMARKS.md.

    .venv/bin/python benchmarks/bench.py            # everything (~10 min on 2 cores)
    .venv/bin/python benchmarks/bench.py --quick    # fewer repetitions, no cold start, no compile (~3 min)

Shared machines are noisy (+-15 % between processes, worse while other jobs run), so every comparison runs in
this one process, the contenders interleaved (A B A B ...), each figure a median over repetitions, and each target
a ratio of two medians measured side by side. The embedded SmolLM2-135M-Instruct is used throughout: a 38-token
chat prompt, 128 greedy tokens with ignore_eos.

What is measured (the numbers match the issue's list):
 1. engine decode tok/s / transformers generate(do_sample=False) tok/s, same prompt, same 128 token IDs (asserted);
    generate at torch's default thread count (what a user gets) and at the engine's; the engine with defaults and
    with --compile.
 2. decode tok/s with the real dashboard attached (TokentuiApp driven headless by textual's run_test) / headless.
 3. selection + reporting (select(): temperature, top-k, top-p, sampling, top-K candidates, entropy) as a share of a
    decode step, at vocab 49,152 and 151,936 (random logits), top-p on and off.
 4. decode tok/s / the physical limit = memory bandwidth (measured here) / weight bytes read per step.
 5. launch to first token in fresh processes: cold (GGUF conversion, empty cache dir) and warm.
 6. prefill time for 32 / 256 / 1,024 / 2,048-token prompts: the engine against a plain forward at torch defaults.
 7. the logit lens's cost per decode step (--logit-lens): the same 64 greedy tokens with it off and on.
 8. a branch (core/model/branch.py) at a 256-token prefix, reusing the parent run's KV cache: time from the branch call to
    its first new token / the engine's prefill time of the same prefix.
 9. `tokentui replay FILE` (no model): launch to the dashboard's first frame in a real terminal (tmux, 80x24), and
    `--headless --json` to its first line.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

TORCH_DEFAULT_THREADS = torch.get_num_threads()  # before anything changes it

from tokentui.core.model.adapter import first_capacity, new_cache  # noqa: E402
from tokentui.core.model.engine import Engine  # noqa: E402
from tokentui.core.runs.events import DoneEvent, PromptEvent, StepEvent  # noqa: E402
from tokentui.core.model.loader import load_model  # noqa: E402
from tokentui.core.steps.prefill import prefill  # noqa: E402
from tokentui.core.steps.select import select  # noqa: E402
from tokentui.core.settings import RunOptions, SamplerSettings  # noqa: E402
from tokentui.core.model.speed import SpeedOptions, use_threads  # noqa: E402

PROMPT = "What does a KV cache store?"  # 38 tokens with the chat template and its default system prompt
NEW_TOKENS = 128
TARGETS = {  # name: (threshold, higher is better)
    "1-default": (1.10, True),
    "1-fastest": (1.5, True),
    "2": (0.95, True),
    "3": (0.03, False),
    "4": (0.5, True),
    "5-warm": (3.0, False),
    "8": (0.2, False),
    "9": (1.0, False),
}


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def med(values) -> float:
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------------------------------------------- machine
def machine() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__}
    import transformers

    info["transformers"] = transformers.__version__
    try:
        import textual

        info["textual"] = getattr(textual, "__version__", "?")
    except ImportError:
        pass
    cpu = platform.processor() or "?"
    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu in ("?", "", "x86_64"):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    info["cpu"] = cpu
    info["simd"] = ", ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags) or "?"
    info["cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info["torch_default_threads"] = TORCH_DEFAULT_THREADS
    try:
        mem = next(l for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal"))
        info["memory"] = f"{int(mem.split()[1]) / 2**20:.1f} GiB"
    except (OSError, StopIteration):
        pass
    info["blas"] = "MKL" if torch.backends.mkl.is_available() else "?"
    info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return info


# ---------------------------------------------------------------------------------------------------- helpers
def run_engine(engine: Engine, prompt: str = PROMPT) -> tuple[list[int], DoneEvent, list[StepEvent], list[int]]:
    steps, done, prompt_ids = [], None, []
    for event in engine.run(prompt):
        if isinstance(event, StepEvent):
            steps.append(event)
        elif isinstance(event, DoneEvent):
            done = event
        elif isinstance(event, PromptEvent):
            prompt_ids = event.ids
    assert done is not None, "the run ended without a done event"
    return [s.id for s in steps], done, steps, prompt_ids


class _Stamps:
    """A generate() streamer that timestamps each new token (the first put() is the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def run_generate(model, prompt_ids: list[int], n: int, threads: int) -> tuple[list[int], float]:
    """transformers' generate, greedy, exactly n tokens (eos_token_id=-1: never stops early, like ignore_eos).
    Returns the IDs and decode tok/s measured like the engine's: (n - 1) tokens / time from token 1 to token n."""
    torch.set_num_threads(threads)
    x = torch.tensor([prompt_ids])
    stamps = _Stamps()
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, eos_token_id=-1,
                         streamer=stamps)
    ids = out[0, len(prompt_ids):].tolist()
    first, last = stamps.times[1], stamps.times[-1]
    return ids, (len(ids) - 1) / (last - first)


def weight_bytes_per_step(model) -> int:
    """Bytes of weights a decode step reads: every parameter once, except an untied input embedding table, of
    which only one row is read."""
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    total = sum(p.nbytes for p in model.parameters())  # parameters() yields a tied tensor once
    if out is None or out.weight.data_ptr() != emb.data_ptr():
        total -= emb.nbytes - emb[0].nbytes
    return total


def matvec_sweep_tok_s(model, threads: int, reps: int = 15) -> float:
    """Tokens/s if a decode step were nothing but torch's matrix-vector products: one F.linear of a [1, in] vector
    by every nn.Linear weight of `model` (the vocabulary head included), back to back, median of `reps`. No
    attention, norms, activations or Python model code: a ceiling for any step built from torch's CPU kernels."""
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    vectors = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights}
    use_threads(torch.device("cpu"), threads)
    times = []
    with torch.inference_mode():
        for rep in range(reps + 3):
            start = time.perf_counter()
            for w in weights:
                torch.nn.functional.linear(vectors[w.shape[1]], w)
            if rep >= 3:  # the first sweeps warm up
                times.append(time.perf_counter() - start)
    return 1.0 / med(times)


def bandwidth(threads: int, gib: float = 1.0, reps: int = 7) -> float:
    """Read bandwidth in GB/s: best of `reps` sums over a `gib` GiB float32 tensor (far larger than any cache)."""
    torch.set_num_threads(threads)
    x = torch.ones(int(gib * 2**30 / 4))
    x.sum()
    best = 0.0
    for _ in range(reps):
        start = time.perf_counter()
        x.sum()
        best = max(best, x.nbytes / (time.perf_counter() - start) / 1e9)
    del x
    return best


# ---------------------------------------------------------------------------------------------------- 1 + 4
def bench_decode(loaded, stock, reps: int, with_compile: bool) -> dict:
    """`loaded` goes to the engines (which re-lay its wide weights, core/model/weight_layout.py); `stock`, a second copy exactly
    as transformers loads it, runs generate (what a user would run instead) and the stock-layout engine."""
    model = stock.model
    opts = RunOptions(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    greedy = SamplerSettings(temperature=0.0)
    engine = Engine(loaded, greedy, opts)
    stock_engine = Engine(stock, greedy, opts, speed=SpeedOptions(weight_layout="stock"))
    assert engine.layout.matrices and not stock_engine.layout.matrices
    threads = engine.speed.decode_threads()
    ids, _, _, prompt_ids = run_engine(engine)
    assert len(prompt_ids) == 38, f"the benchmark prompt should be 38 tokens, got {len(prompt_ids)}"
    res: dict = {"prompt_tokens": len(prompt_ids), "prompt_ids": prompt_ids, "engine_threads": threads,
                 "generate_default_threads": TORCH_DEFAULT_THREADS}
    gen_ids, _ = run_generate(model, prompt_ids, NEW_TOKENS, TORCH_DEFAULT_THREADS)
    assert ids == gen_ids, "engine and generate chose different tokens"
    compiled = {}  # name -> Engine: --compile at the default thread count, and with every core (headless)
    if with_compile:
        variants = {"compiled": SpeedOptions(compile=True)}
        if TORCH_DEFAULT_THREADS > threads:
            variants["compiled@all-threads"] = SpeedOptions(compile=True, threads=TORCH_DEFAULT_THREADS)
        for name, speed in variants.items():
            log(f"compiling the decode step for {name} (minutes on a small CPU) ...")
            started = time.perf_counter()
            compiled[name] = Engine(loaded, greedy, opts, speed=speed)
            res.setdefault("compile_s", {})[name] = time.perf_counter() - started
            c_ids = run_engine(compiled[name])[0]
            assert c_ids == gen_ids, f"{name} chose different tokens from generate"
    series: dict[str, list[float]] = {}
    # 4: the machine's read bandwidth, sampled before and after every repetition and the best kept, so that a
    # neighbour's burst during one sample cannot lower the limit (the harsher, steadier figure)
    bw1, bw_all = bandwidth(1), bandwidth(TORCH_DEFAULT_THREADS)
    for rep in range(reps):
        for name in ("engine", "generate@default", "generate@engine-threads", "engine@stock-layout", *compiled):
            if name in ("engine", "engine@stock-layout"):
                got, done, _, _ = run_engine(engine if name == "engine" else stock_engine)
                rate = done.decode_tok_s
            elif name in compiled:
                got, done, _, _ = run_engine(compiled[name])
                rate = done.decode_tok_s
            else:
                t = TORCH_DEFAULT_THREADS if name == "generate@default" else threads
                got, rate = run_generate(model, prompt_ids, NEW_TOKENS, t)
            assert got == gen_ids, f"{name} chose different tokens"
            series.setdefault(name, []).append(rate)
        log(f"  decode rep {rep + 1}/{reps}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in series.items()))
        bw1, bw_all = max(bw1, bandwidth(1)), max(bw_all, bandwidth(TORCH_DEFAULT_THREADS))
    res["tok_s"] = {k: med(v) for k, v in series.items()}
    res["ratio_default"] = med([e / g for e, g in zip(series["engine"], series["generate@default"])])
    res["ratio_default_same_threads"] = med(
        [e / g for e, g in zip(series["engine"], series["generate@engine-threads"])])
    res["ratio_stock_layout"] = med([e / g for e, g in zip(series["engine@stock-layout"], series["generate@default"])])
    res["layout"] = engine.layout
    for name in compiled:
        res[f"ratio_{name}"] = med([c / g for c, g in zip(series[name], series["generate@default"])])
    if "compiled" in compiled:
        res["ratio_compiled_same_threads"] = med(
            [c / g for c, g in zip(series["compiled"], series["generate@engine-threads"])])
    # 4: the physical limit, measured now
    weights = weight_bytes_per_step(model)
    res.update(weight_bytes=weights, bandwidth_1=bw1, bandwidth_all=bw_all)
    best_bw = max(bw1, bw_all)
    res["limit_tok_s"] = best_bw * 1e9 / weights
    res["limit_ratio_default"] = res["tok_s"]["engine"] / res["limit_tok_s"]
    res["sweep_tok_s"] = {t: matvec_sweep_tok_s(loaded.model, t) for t in sorted({1, TORCH_DEFAULT_THREADS})}
    use_threads(torch.device("cpu"), threads)
    for name in compiled:
        res[f"limit_ratio_{name}"] = res["tok_s"][name] / res["limit_tok_s"]
    res["_engine"] = engine
    return res


# ---------------------------------------------------------------------------------------------------- 2
class _ChildSource:
    """The dashboard's engine as the command line makes it: a client for the model in a child process."""

    def __init__(self, spec) -> None:
        self.spec = spec

    def client(self, sampler, options, recorder):
        from tokentui.core.link.process_client import ProcessClient

        return ProcessClient(self.spec, sampler, options, recorder)


async def _dashboard_once(spec) -> float:
    from tokentui.tui.app import TokentuiApp
    from tokentui.tui.config import DashboardConfig

    config = DashboardConfig(load=_ChildSource(spec), prompt=PROMPT, sampler=spec.sampler, options=spec.options,
                             recorder=None, user_theme_dir=None)
    app = TokentuiApp(config)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            deadline = time.monotonic() + 600
            while app.state.run.done is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("the dashboard run did not finish")
                await pilot.pause(0.05)
            await pilot.pause(0.2)  # let the last repaint happen inside the measured app
    finally:
        app.client.close()
    return app.state.run.done.decode_tok_s


def bench_dashboard(engine: Engine, reps: int) -> dict:
    """The dashboard as the command line runs it: the app in this process, the model in a child process
    (core/link/process_client.py) built from the same settings, a fresh one per rep; headless is the in-process engine."""
    from tokentui.core.link.protocol import EngineSpec

    spec = EngineSpec(sampler=engine.sampler, options=engine.options)
    series: dict[str, list[float]] = {"headless": [], "dashboard": []}
    for rep in range(reps):
        series["headless"].append(run_engine(engine)[1].decode_tok_s)
        series["dashboard"].append(asyncio.run(_dashboard_once(spec)))
        log(f"  dashboard rep {rep + 1}/{reps}: headless {series['headless'][-1]:.1f}, "
            f"dashboard {series['dashboard'][-1]:.1f}")
    return {"tok_s": {k: med(v) for k, v in series.items()},
            "ratio": med([d / h for d, h in zip(series["dashboard"], series["headless"])])}


# ---------------------------------------------------------------------------------------------------- 3
SELECT_CASES = {
    "greedy": SamplerSettings(temperature=0.0),
    "T=0.7, top-p 0.9": SamplerSettings(temperature=0.7, top_p=0.9),
    "T=0.7, top-p off": SamplerSettings(temperature=0.7, top_p=1.0),
    "T=0.7, top-k 50, top-p 0.95": SamplerSettings(temperature=0.7, top_k=50, top_p=0.95),
}
def real_scores(loaded, prompt_ids: list[int], n: int = 16) -> list[torch.Tensor]:
    """The model's own scores for its first n greedy steps on the benchmark prompt."""
    x = torch.tensor([prompt_ids])
    out = loaded.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                eos_token_id=-1, output_scores=True, return_dict_in_generate=True)
    return [s[0].float() for s in out.scores]


def bench_select(step_ms: float, threads: int, real: list[torch.Tensor], reps: int = 200) -> dict:
    """select() per setting on random N(0, sigma^2) logits, sigma = the model's own score spread, at both vocabulary
    sizes (the targets), and on the model's own scores (V = 49,152; not a target). Gaussian scores are a hard case
    for top-p: their nucleus holds hundreds to thousands of tokens, where real next-token distributions have a
    perplexity of ~10."""
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    src = torch.Generator().manual_seed(1)
    sigma = statistics.median(float(s.std()) for s in real)
    out: dict = {"sigma": sigma}
    for vocab in (49152, 151936, "real"):
        if vocab == "real":
            logits = real
        else:
            logits = [torch.randn(vocab, generator=src) * sigma for _ in range(16)]
        for name, settings in SELECT_CASES.items():
            times = []
            for i in range(reps + 20):
                x = logits[i % len(logits)]
                start = time.perf_counter()
                select(x, settings, gen, 10)
                times.append((time.perf_counter() - start) * 1000)
            ms = med(times[20:])
            out[(vocab, name)] = {"ms": ms, "share": ms / (step_ms + ms)}
    return out


def engine_overhead(engine: Engine) -> dict:
    """In a real run: the step's time outside the model (selection, reporting, detokenizing, the event) as a share."""
    _, done, steps, _ = run_engine(engine)
    decode = steps[1:]
    outside = [s.latency_ms - s.forward_ms for s in decode]
    total = [s.latency_ms for s in decode]
    return {"outside_ms": med(outside), "step_ms": med(total), "share": med(outside) / med(total)}


# ---------------------------------------------------------------------------------------------------- 7
LENS_TOKENS = 64


def bench_lens(loaded, reps: int) -> dict:
    """The logit lens's cost per decode step: the same greedy LENS_TOKENS-token run with it off and on, interleaved,
    on the same model; medians over the decode steps of every repetition. The lens is computed after the forward,
    so it shows in a step's latency_ms; forward_ms shows what asking for the hidden states adds to the forward."""
    greedy = SamplerSettings(temperature=0.0)
    engines = {name: Engine(loaded, greedy, RunOptions(max_new_tokens=LENS_TOKENS, ignore_eos=True, logit_lens=on))
               for name, on in (("off", False), ("on", True))}
    step_ms: dict[str, list[float]] = {"off": [], "on": []}
    forward_ms: dict[str, list[float]] = {"off": [], "on": []}
    ids: dict[str, list[int]] = {}
    for rep in range(reps):
        for name, engine in engines.items():
            got, _, steps, _ = run_engine(engine)
            assert all((s.lens is not None) == (name == "on") for s in steps), "the lens was not where asked for"
            assert ids.setdefault(name, got) == got
            step_ms[name] += [s.latency_ms for s in steps[1:]]
            forward_ms[name] += [s.forward_ms for s in steps[1:]]
        log(f"  lens rep {rep + 1}/{reps}: step off {med(step_ms['off']):.1f} ms, on {med(step_ms['on']):.1f} ms")
    assert ids["on"] == ids["off"], "the logit lens changed the tokens"
    off, on = med(step_ms["off"]), med(step_ms["on"])
    return {"off_ms": off, "on_ms": on, "extra_ms": on - off, "ratio": on / off, "layers": loaded.facts.layers,
            "forward_off_ms": med(forward_ms["off"]), "forward_on_ms": med(forward_ms["on"]), "reps": reps}


# ---------------------------------------------------------------------------------------------------- 8
BRANCH_PREFIX = 256


def bench_branch(loaded, reps: int) -> dict:
    """A branch at a BRANCH_PREFIX-token prefix (prompt + the parent's tokens before the step), three contenders
    interleaved on one engine: the branch reusing the parent's KV cache (the dashboard's case), the same branch with
    no cache held (`release_cache`: the prefix prefilled, as `tokentui branch` in a fresh process), and the engine's
    prefill of the prefix alone. "First new token" = the first token the branch selects after the forced one
    (forced step: one decode recomputing its scores; then one decode of the forced token); the forced step's own
    time is reported too. The target ratio is reuse / prefill alone."""
    from tokentui.core.model.branch import BranchPoint
    from tokentui.core.runs.events import BranchEvent

    tok = loaded.tokenizer
    pool = tok((ROOT / "README.md").read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    engine = Engine(loaded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=64, ignore_eos=True))
    prompt = tok.decode(pool[:210])
    parent_ids, _, steps, prompt_ids = run_engine(engine, prompt)
    at = BRANCH_PREFIX - len(prompt_ids)
    assert 1 <= at < len(parent_ids), f"prompt of {len(prompt_ids)} tokens: no branch point at a {BRANCH_PREFIX} prefix"
    point = BranchPoint(tuple(prompt_ids), tuple(parent_ids[:at]), at, steps[at].candidates[1].id)
    engine.options = RunOptions(max_new_tokens=2, ignore_eos=True)  # the forced step and one more
    speed = engine.speed
    series: dict[str, list[float]] = {"reuse": [], "reuse_forced": [], "fresh": [], "prefill": []}
    ids: dict[str, list[int]] = {}
    for _ in range(reps):
        for name in ("reuse", "fresh"):
            if name == "fresh":
                engine.release_cache()
            start = time.perf_counter()
            times, got, reused = [], [], None
            for event in engine.branch(point):
                if isinstance(event, StepEvent):
                    times.append((time.perf_counter() - start) * 1000)
                    got.append(event.id)
                elif isinstance(event, BranchEvent):
                    reused = event.kv_reused_tokens
            assert (reused == BRANCH_PREFIX - 1) == (name == "reuse"), f"{name}: {reused} positions reused"
            assert ids.setdefault("branch", got) == got, "the branch gave other tokens without its cache"
            series[name].append(times[1])
            if name == "reuse":
                series["reuse_forced"].append(times[0])
        cache = new_cache(loaded.model, first_capacity(BRANCH_PREFIX, 2))
        use_threads(torch.device("cpu"), speed.prefill_thread_count(BRANCH_PREFIX))
        _, ms = prefill(loaded.model, list(point.prompt_ids + point.tokens), cache)
        use_threads(torch.device("cpu"), speed.decode_threads())
        series["prefill"].append(ms)
        # the fresh branch left its own cache held, which holds the prefix: the next "reuse" reuses it
    out = {name: med(values) for name, values in series.items()}
    out.update(ratio=out["reuse"] / out["prefill"], forced_ratio=out["reuse_forced"] / out["prefill"],
               fresh_ratio=out["reuse"] / out["fresh"], prompt_tokens=len(prompt_ids), at=at, reps=reps)
    log(f"  branch at a {BRANCH_PREFIX}-token prefix: reuse {out['reuse']:.0f} ms to the first new token "
        f"(forced step {out['reuse_forced']:.0f} ms), no cache {out['fresh']:.0f} ms, prefill alone "
        f"{out['prefill']:.0f} ms: ratio {out['ratio']:.3f}")
    return out


# ---------------------------------------------------------------------------------------------------- 6
def bench_prefill(loaded, stock, reps: int) -> dict:
    """The engine's prefill (its model re-laid) against a plain forward of the stock copy at torch's defaults."""
    model = loaded.model
    speed = SpeedOptions()
    text = (ROOT / "README.md").read_text(encoding="utf-8") * 4
    pool = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    out = {}
    for n in (32, 256, 1024, 2048):
        ids = pool[:n]
        assert len(ids) == n
        series: dict[str, list[float]] = {"engine": [], "plain": []}
        for _ in range(reps):
            cache = new_cache(model, first_capacity(n, NEW_TOKENS))
            use_threads(torch.device("cpu"), speed.prefill_thread_count(n))
            _, ms = prefill(model, ids, cache)
            series["engine"].append(ms)
            torch.set_num_threads(TORCH_DEFAULT_THREADS)  # what a plain forward / generate's prefill gets
            from transformers import DynamicCache

            with torch.inference_mode():
                start = time.perf_counter()
                stock.model(input_ids=torch.tensor([ids]), past_key_values=DynamicCache(config=model.config),
                      use_cache=True, logits_to_keep=1)
                series["plain"].append((time.perf_counter() - start) * 1000)
        out[n] = {"engine_ms": med(series["engine"]), "plain_ms": med(series["plain"]),
                  "threads": speed.prefill_thread_count(n)}
        log(f"  prefill {n}: engine {out[n]['engine_ms']:.0f} ms, plain forward {out[n]['plain_ms']:.0f} ms")
    use_threads(torch.device("cpu"), speed.decode_threads())
    return out


# ---------------------------------------------------------------------------------------------------- 9
REPLAY_SIZE = (80, 24)  # the smallest terminal the dashboard is laid out for


def _replay_dashboard_seconds(record: Path, env: dict) -> float:
    """Seconds from pressing Enter on `python -m tokentui replay RECORD` in a fresh tmux pane (80x24) to the first
    captured screen that shows the dashboard: the prompt panel's title and the key bar. The pane's shell is
    started first (not timed); the replay is quit with q once seen, and must exit 0."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tmux_pane import EXIT_MARK, Pane

    import shlex

    with Pane("bench-replay", *REPLAY_SIZE, env=env) as pane:
        command = shlex.join([sys.executable, "-m", "tokentui", "replay", str(record)])
        pane.tmux("send-keys", "-t", pane.session, "-l", f"{command}; echo {EXIT_MARK}$?")
        start = time.perf_counter()
        pane.send("Enter")
        seconds = None
        while time.perf_counter() - start < 60:
            text = pane.capture()  # one tmux call, ~5-10 ms: the resolution of this figure
            if "chat template" in text and "q quit" in text:
                seconds = time.perf_counter() - start
                break
        if seconds is None:
            raise RuntimeError(f"no dashboard after 60 s; the screen:\n{pane.capture()}")
        pane.send("q")
        if pane.exit_status(30.0) != 0:
            raise RuntimeError(f"tokentui replay failed: {pane.capture()[-500:]}")
    return seconds


def _replay_headless_seconds(record: Path, env: dict) -> tuple[float, float]:
    """`tokentui replay RECORD --headless --json --speed 0` in a fresh process: seconds to its first line (the
    model event: the record read, the replay started) and to its first step line."""
    cmd = [sys.executable, "-m", "tokentui", "replay", str(record), "--headless", "--json", "--speed", "0"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = step = None
    for line in proc.stdout:
        now = time.perf_counter() - start
        first = now if first is None else first
        if step is None and line.startswith('{"event": "step"'):
            step = now
    err = proc.stderr.read()
    if proc.wait() != 0 or first is None or step is None:
        raise RuntimeError(f"tokentui replay --headless failed: {err.strip()[-500:]}")
    return first, step


def bench_replay_first_frame(loaded, reps: int) -> dict:
    """`tokentui replay FILE` (no torch, no model: tokentui/commands/replay.py) on a record of this benchmark's run
    (NEW_TOKENS greedy tokens, recorded here in-process): launch to the dashboard's first frame in a real
    terminal, and `--headless --json` to its first line, fresh processes, interleaved, medians."""
    from tokentui.core.runs.run import Run

    engine = Engine(loaded, SamplerSettings(temperature=0.0), RunOptions(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    series: dict[str, list[float]] = {"dashboard": [], "headless_first": [], "headless_step": []}
    with tempfile.TemporaryDirectory(prefix="tokentui-bench-replay-") as tmp:
        run = Run(engine.facts)
        for event in engine.run(PROMPT):
            run.apply(event)
        record = run.save(Path(tmp) / "record.jsonl")
        env = dict(os.environ, TOKENTUI_CONFIG_DIR=tmp, TOKENTUI_STATE_DIR=tmp, TOKENTUI_CACHE_DIR=tmp)
        _replay_headless_seconds(record, env)  # once untimed: the page cache warm, as for the launch rows
        for rep in range(reps):
            series["dashboard"].append(_replay_dashboard_seconds(record, env))
            first, step = _replay_headless_seconds(record, env)
            series["headless_first"].append(first)
            series["headless_step"].append(step)
            log(f"  replay rep {rep + 1}/{reps}: dashboard first frame {series['dashboard'][-1]:.2f} s, headless "
                f"first line {first:.2f} s, first step line {step:.2f} s")
        out = {name: med(values) for name, values in series.items()}
        out.update(dashboard_all=series["dashboard"], reps=reps, record_lines=len(record.read_text().splitlines()),
                   record_kib=record.stat().st_size / 1024)
    return out


# ---------------------------------------------------------------------------------------------------- 5
def first_token_seconds(env: dict) -> float:
    """Seconds from spawning `tokentui --headless --json --max-new-tokens 1` to its first step event line."""
    cmd = [sys.executable, "-m", "tokentui", "--headless", "--json", "--no-record", "--greedy",
           "--max-new-tokens", "1", "--prompt", PROMPT]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds = None
    for line in proc.stdout:
        if seconds is None and line.startswith('{"event": "step"'):
            seconds = time.perf_counter() - start
    err = proc.stderr.read()
    if proc.wait() != 0 or seconds is None:
        raise RuntimeError(f"tokentui failed: {err.strip()[-500:]}")
    return seconds


def bench_launch(reps: int, cold: bool) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="tokentui-bench-") as tmp:
        env["TOKENTUI_CACHE_DIR"] = tmp
        if cold:
            out["cold_s"] = first_token_seconds(env)  # converts the GGUF into the empty cache
            log(f"  launch cold: {out['cold_s']:.1f} s")
        else:
            first_token_seconds(env)
        warm = []
        for _ in range(reps):
            warm.append(first_token_seconds(env))
            log(f"  launch warm: {warm[-1]:.1f} s")
        out["warm_s"] = med(warm)
        out["warm_all"] = warm
        floor: dict[str, list[float]] = {name: [] for name in IMPORTS_ONLY}
        for _ in range(reps):
            for name, code in IMPORTS_ONLY.items():
                floor[name].append(imports_seconds(env, code))
            log("  imports alone: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in floor.items()))
        out["imports_s"] = med(floor["transformers"])
        out["imports_torch_s"] = med(floor["torch"])
        out["imports_compiler_s"] = med(floor["torch+compiler"])
    return out


_GC_OFF = "import gc; gc.disable(); "  # as tokentui imports
IMPORTS_ONLY = {  # the floor under a warm launch, in three layers, each timed in a fresh Python
    "torch": _GC_OFF + "import torch",
    # torch's compiler and distributed-tensor packages: transformers 5.23 imports both on every model load
    # (masking_utils and integrations/deepgemm import torch._dynamo; core_model_loading -> distributed/
    # sharding_utils imports torch.distributed.tensor), though a single-device eager run uses neither
    "torch+compiler": _GC_OFF + "import torch, torch._dynamo, torch.distributed.tensor",
    # what any transformers-based start must import before it can load SmolLM2
    "transformers": _GC_OFF + "import torch; from transformers import AutoModelForCausalLM, AutoTokenizer; "
                    "import transformers.models.llama.modeling_llama",
}


def imports_seconds(env: dict, code: str) -> float:
    """Seconds from spawning a Python that only runs the imports in `code` to its line saying it did (not to its
    exit, which tears torch down), timed the way the launch is."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code + "; print('imported', flush=True)"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    seconds = time.perf_counter() - start
    proc.wait()
    if line.strip() != "imported":
        raise RuntimeError("the import-only process failed")
    return seconds


# ---------------------------------------------------------------------------------------------------- report
def verdict(key: str, value: float) -> str:
    threshold, higher = TARGETS[key]
    ok = value >= threshold if higher else value <= threshold
    return "met" if ok else "**not met**"


def write_report(path: Path, info: dict, d: dict, dash: dict | None, sel: dict, over: dict, pre: dict,
                 launch: dict | None, started: float, load_before, load_after, args, lens: dict | None = None,
                 branch: dict | None = None, replay: dict | None = None) -> str:
    r = []
    r.append("# Benchmarks\n")
    r.append(f"Written by `.venv/bin/python benchmarks/bench.py{' --quick' if args.quick else ''}` on "
             f"{datetime.date.today().isoformat()} in {(time.perf_counter() - started) / 60:.1f} min. "
             "Every ratio compares two contenders measured in the same process, interleaved; each figure is a "
             f"median of {args.reps} repetitions. Model: the embedded SmolLM2-135M-Instruct (float32), a "
             f"{d['prompt_tokens']}-token chat prompt, {NEW_TOKENS} greedy tokens with ignore_eos.\n")
    r.append("## Machine\n")
    r.append(f"- CPU: {info['cpu']} — {info['cores']} cores usable, torch default {info['torch_default_threads']} "
             f"threads; SIMD: {info['simd']}; BLAS: {info['blas']}; memory {info.get('memory', '?')}; GPU: {info['cuda']}")
    r.append(f"- Python {info['python']}, torch {info['torch']}, transformers {info['transformers']}, "
             f"textual {info.get('textual', '?')}")
    r.append(f"- Load average (1 min) at start / end: {load_before:.2f} / {load_after:.2f} "
             "(other jobs were running on this shared machine when it is > 0.5; absolute tok/s move with it, "
             "the side-by-side ratios much less)\n")
    r.append("## Targets\n")
    r.append("| # | What | Target | Measured | Verdict |")
    r.append("|---|------|--------|----------|---------|")
    r.append(f"| 1 | engine decode ÷ `generate(do_sample=False)`, defaults (generate at torch's default "
             f"{TORCH_DEFAULT_THREADS} threads, engine at its {d['engine_threads']}) | ≥ 1.10 | "
             f"{d['ratio_default']:.2f} | {verdict('1-default', d['ratio_default'])} |")
    r.append(f"| 1 | same, both at {d['engine_threads']} thread(s) (not a target: the like-for-like kernel ratio) "
             f"| — | {d['ratio_default_same_threads']:.2f} | — |")
    r.append(f"| 1 | engine with `--weight-layout stock` ÷ generate (not a target: what the transposed layout adds) "
             f"| — | {d['ratio_stock_layout']:.2f} | — |")
    if "ratio_compiled" in d:
        r.append(f"| 1 | engine `--compile` decode ÷ generate (defaults) | ≥ 1.5 | {d['ratio_compiled']:.2f} | "
                 f"{verdict('1-fastest', d['ratio_compiled'])} |")
        r.append(f"| 1 | same, both at {d['engine_threads']} thread(s) | — | {d['ratio_compiled_same_threads']:.2f} | — |")
        if "ratio_compiled@all-threads" in d:
            v = d["ratio_compiled@all-threads"]
            r.append(f"| 1 | engine `--compile --threads {TORCH_DEFAULT_THREADS}` (every core: headless) ÷ generate "
                     f"(defaults) | ≥ 1.5 | {v:.2f} | {verdict('1-fastest', v)} |")
    else:
        r.append("| 1 | engine `--compile` ÷ generate | ≥ 1.5 | not run (--quick / --no-compile) | — |")
    if dash:
        r.append(f"| 2 | decode with the dashboard attached ÷ headless | ≥ 0.95 | {dash['ratio']:.2f} | "
                 f"{verdict('2', dash['ratio'])} |")
    else:
        r.append("| 2 | dashboard ÷ headless | ≥ 0.95 | not run | — |")
    for vocab in (49152, 151936):
        worst_name, worst = max(((n, v) for key, v in sel.items() if isinstance(key, tuple) and key[0] == vocab
                                 for n in [key[1]]), key=lambda kv: kv[1]["share"])
        r.append(f"| 3 | selection + reporting share of a step, V = {vocab:,} (worst setting: {worst_name}) | ≤ 3 % | "
                 f"{100 * worst['share']:.1f} % | {verdict('3', worst['share'])} |")
    r.append(f"| 4 | decode ÷ physical limit, defaults | ≥ 0.5 | {d['limit_ratio_default']:.2f} | "
             f"{verdict('4', d['limit_ratio_default'])} |")
    if "limit_ratio_compiled" in d:
        r.append(f"| 4 | decode ÷ physical limit, `--compile` | ≥ 0.5 | {d['limit_ratio_compiled']:.2f} | "
                 f"{verdict('4', d['limit_ratio_compiled'])} |")
    if "limit_ratio_compiled@all-threads" in d:
        v = d["limit_ratio_compiled@all-threads"]
        r.append(f"| 4 | decode ÷ physical limit, `--compile --threads {TORCH_DEFAULT_THREADS}` (every core: "
                 f"headless) | ≥ 0.5 | {v:.2f} | {verdict('4', v)} |")
    best_sweep = max(d["sweep_tok_s"].values())
    r.append(f"| 4 | torch's matrix-vector products alone, every weight once (not a target: the ceiling for a step "
             f"built from torch's CPU kernels; best of {', '.join(f'{t}' for t in d['sweep_tok_s'])} thread(s)) ÷ "
             f"physical limit | — | {best_sweep / d['limit_tok_s']:.2f} | — |")
    if launch:
        r.append(f"| 5 | launch to first token, warm (cached conversion) | ≤ 3 s | {launch['warm_s']:.1f} s | "
                 f"{verdict('5-warm', launch['warm_s'])} |")
        if "cold_s" in launch:
            r.append(f"| 5 | launch to first token, cold (GGUF conversion) | — | {launch['cold_s']:.1f} s | — |")
    else:
        r.append("| 5 | launch to first token | ≤ 3 s warm | not run | — |")
    r.append(f"| 6 | prefill 32 / 256 / 1,024 / 2,048 tokens (engine) | — | "
             + " / ".join(f"{pre[n]['engine_ms']:.0f}" for n in (32, 256, 1024, 2048)) + " ms | — |")
    if lens:
        r.append(f"| 7 | logit lens (`--logit-lens`): decode step, off → on ({LENS_TOKENS} greedy tokens) | — | "
                 f"{lens['off_ms']:.1f} → {lens['on_ms']:.1f} ms (+{lens['extra_ms']:.1f} ms, "
                 f"{lens['ratio']:.2f}x) | — |")
    if branch:
        r.append(f"| 8 | branch at a {BRANCH_PREFIX}-token prefix, KV cache reused: time to its first new token ÷ "
                 f"prefill of the prefix | ≤ 0.2 | {branch['ratio']:.3f} | {verdict('8', branch['ratio'])} |")
    if replay:
        r.append(f"| 9 | `tokentui replay FILE`: launch to the dashboard's first frame ({REPLAY_SIZE[0]}x{REPLAY_SIZE[1]}, "
                 f"tmux) | ≤ 1 s | {replay['dashboard']:.2f} s | {verdict('9', replay['dashboard'])} |")
        r.append(f"| 10 | `tokentui replay FILE --headless --json`: launch to its first line / first step line "
                 f"(not a target) | — | {replay['headless_first']:.2f} / {replay['headless_step']:.2f} s | — |")
    r.append("")
    r.append("## Details\n")
    r.append("### 1, 4 — decode\n")
    r.append("| Contender | tok/s (median) |")
    r.append("|-----------|----------------|")
    names = {"engine": f"engine, defaults ({d['engine_threads']} decode thread(s))",
             "compiled": "engine, `--compile`",
             "compiled@all-threads": f"engine, `--compile --threads {TORCH_DEFAULT_THREADS}`",
             "generate@default": f"generate, torch default ({TORCH_DEFAULT_THREADS} threads)",
             "generate@engine-threads": f"generate, {d['engine_threads']} thread(s)",
             "engine@stock-layout": "engine, `--weight-layout stock`"}
    for key, value in d["tok_s"].items():
        r.append(f"| {names[key]} | {value:.1f} |")
    for t, rate in d["sweep_tok_s"].items():
        r.append(f"| torch's matrix-vector products alone (F.linear by every weight once), {t} thread(s) | "
                 f"{rate:.1f} |")
    r.append(f"| physical limit: {d['weight_bytes'] / 1e6:.0f} MB of weights per step ÷ "
             f"{max(d['bandwidth_1'], d['bandwidth_all']):.1f} GB/s | {d['limit_tok_s']:.1f} |")
    r.append("")
    r.append(f"Read bandwidth (sum over 1 GiB, the best of 7 sums before and after each repetition): {d['bandwidth_1']:.1f} GB/s on 1 thread, {d['bandwidth_all']:.1f} GB/s "
             f"on {TORCH_DEFAULT_THREADS}; the limit uses the larger. All contenders produced the same "
             f"{NEW_TOKENS} token IDs (asserted); generate ran on a second copy of the model, exactly as "
             f"transformers loads it, the engines on a copy whose {d['layout'].matrices} wide matrices "
             f"({d['layout'].bytes / 2**20:.0f} MiB) they stored transposed (core/model/weight_layout.py)." + (" Compiling took " + " and ".join(
                 f"{v:.0f} s ({names[k]})" for k, v in d["compile_s"].items()) + ", once per process."
                 if "compile_s" in d else "") + "\n")
    if "compiled@all-threads" in d["tok_s"]:
        r.append(f"`--compile --threads {TORCH_DEFAULT_THREADS}` is an option, not the default: its kernels wait on "
                 "each other at every step, so as soon as anything else wants a core (the dashboard, another job) "
                 "it collapses (~3 tok/s measured on this box under load); core/model/speed.py says more.\n")
    if dash:
        r.append("### 2 — dashboard\n")
        r.append(f"Decode tok/s as the engine measures it: headless {dash['tok_s']['headless']:.1f}, with the "
                 f"dashboard (TokentuiApp under textual's run_test, 160x48, the model in its child process as "
                 f"`tokentui` runs it) {dash['tok_s']['dashboard']:.1f}.\n")
    r.append("### 3 — selection and reporting\n")
    r.append(f"`select()` on random logits N(0, {sel['sigma']:.1f}²) (σ = the spread of SmolLM2's own scores), 10 "
             f"candidates reported, as a share of a default decode step of {1000 / d['tok_s']['engine']:.1f} ms "
             "(SmolLM2; a model with a 151,936-token vocabulary has a longer step, so that column overstates its "
             "share). Gaussian scores are a hard case for top-p (a nucleus of hundreds to thousands of tokens; "
             "SmolLM2's real next-token distributions have a perplexity of ~10), so the last column, on the "
             "model's own scores, is what a run sees.\n")
    r.append("| Setting | V = 49,152 ms | share | V = 151,936 ms | share | SmolLM2's scores ms | share |")
    r.append("|---------|---------------|-------|----------------|-------|---------------------|-------|")
    for name in SELECT_CASES:
        a, b, c = sel[(49152, name)], sel[(151936, name)], sel[("real", name)]
        r.append(f"| {name} | {a['ms']:.2f} | {100 * a['share']:.1f} % | {b['ms']:.2f} | {100 * b['share']:.1f} % | "
                 f"{c['ms']:.2f} | {100 * c['share']:.1f} % |")
    r.append("")
    r.append(f"In a real greedy run the whole step outside the model (selection, reporting, detokenizing, the "
             f"event) took {over['outside_ms']:.2f} ms of {over['step_ms']:.1f} ms ({100 * over['share']:.1f} %).\n")
    if lens:
        r.append("### 7 — logit lens\n")
        r.append(f"The same {LENS_TOKENS} greedy tokens with `--logit-lens` off and on, interleaved, {lens['reps']} "
                 f"repetitions, medians over the decode steps: a step takes {lens['off_ms']:.1f} ms off and "
                 f"{lens['on_ms']:.1f} ms on. Asking the forward for its hidden states moves the forward from "
                 f"{lens['forward_off_ms']:.1f} to {lens['forward_on_ms']:.1f} ms; the rest is the lens itself, "
                 f"the final norm and the LM head over all {lens['layers']} layers' states (one "
                 f"[{lens['layers']}, hidden] x [hidden, vocab] product per step, core/model/lens.py).\n")
    if branch:
        r.append("### 8 — branch\n")
        r.append(f"A greedy branch at step {branch['at'] + 1} after a {branch['prompt_tokens']}-token prompt (a "
                 f"{BRANCH_PREFIX}-token prefix), {branch['reps']} repetitions, interleaved: with the parent's KV "
                 f"cache reused, {branch['reuse_forced']:.0f} ms to the forced step and {branch['reuse']:.0f} ms to "
                 f"the first new token; with no cache held (the prefix prefilled) {branch['fresh']:.0f} ms; the "
                 f"engine's prefill of the prefix alone {branch['prefill']:.0f} ms. Both branches gave the same "
                 "token IDs (asserted).\n")
    if replay:
        r.append("### 9 — replay\n")
        r.append(f"A record of this benchmark's run ({replay['record_lines']} lines, {replay['record_kib']:.0f} KiB) "
                 f"played back in fresh processes, {replay['reps']} repetitions, interleaved. Dashboard: `python -m "
                 f"tokentui replay FILE` typed into a bash in a private tmux server ({REPLAY_SIZE[0]}x{REPLAY_SIZE[1]}), "
                 "timed from Enter to the first `capture-pane` showing the prompt panel's title and the key bar "
                 "(captured back to back, ~5-10 ms each): " + ", ".join(f"{s:.2f}" for s in replay["dashboard_all"])
                 + f" s. Headless: `--headless --json --speed 0` to its first line (the model event: Python "
                 f"started, the record read) {replay['headless_first']:.2f} s, to its first step line "
                 f"{replay['headless_step']:.2f} s. No torch in either (tokentui/commands/replay.py).\n")
    r.append("### 6 — prefill\n")
    r.append(f"| Prompt tokens | engine ms (threads) | plain forward at torch defaults ({TORCH_DEFAULT_THREADS} threads) ms |")
    r.append("|---------------|---------------------|------------------------------|")
    for n in (32, 256, 1024, 2048):
        r.append(f"| {n:,} | {pre[n]['engine_ms']:.0f} ({pre[n]['threads']}) | {pre[n]['plain_ms']:.0f} |")
    r.append("")
    if launch:
        r.append("### 5 — launch\n")
        r.append("`tokentui --headless --json --max-new-tokens 1` in a fresh process, timed to its first step event; "
                 "cold = empty TOKENTUI_CACHE_DIR (the GGUF is de-quantized and cached), warm = cached. Warm runs: "
                 + ", ".join(f"{s:.1f}" for s in launch["warm_all"]) + " s.\n")
        r.append(f"The floor under a warm launch: a fresh Python that only imports torch and transformers' Llama "
                 f"modules (the cyclic GC off, as tokentui does) takes {launch['imports_s']:.1f} s here "
                 f"(median of {len(launch['warm_all'])}), {100 * launch['imports_s'] / launch['warm_s']:.0f} % of "
                 "the warm launch; loading the cached weights and tokenizer (~0.7 s), storing the wide weights transposed (0.2–1.2 s in a fresh process, mostly page faults on the new memory; `--weight-layout stock` skips it), the template, and the prefill are "
                 "the rest.\n")
        r.append(f"Of that floor, torch alone takes {launch['imports_torch_s']:.1f} s; torch's compiler and "
                 f"distributed-tensor packages add {launch['imports_compiler_s'] - launch['imports_torch_s']:.1f} s "
                 "(transformers 5.23 imports `torch._dynamo` from masking_utils and integrations/deepgemm, and "
                 "`torch.distributed.tensor` from distributed/sharding_utils, on every model load, though a "
                 "single-device eager run uses neither); the rest of transformers "
                 f"{launch['imports_s'] - launch['imports_compiler_s']:.1f} s. Skipping those two packages "
                 "would mean standing in for torch's own modules while transformers imports (deepgemm applies "
                 "`@torch._dynamo.assume_constant_result` at import time), and even then the warm launch would be "
                 f"~{launch['warm_s'] - (launch['imports_compiler_s'] - launch['imports_torch_s']):.1f} s by "
                 "subtraction: over 3 s either way on this machine, so tokentui does not.\n")
    text = "\n".join(r)
    path.write_text(text + _kept_sections(path), encoding="utf-8")
    return text


# Sections other scripts write into BENCHMARKS.md (benchmarks/server_vs_local.py's): kept when this one rewrites it.
KEPT_HEADINGS = ("## Same model, two engines (issue 15)", "## GPU path, round 2 (issue 27)")


def _kept_sections(path: Path) -> str:
    try:
        old = path.read_text(encoding="utf-8")
    except OSError:
        return ""
    starts = sorted(i for i in (old.find(h) for h in KEPT_HEADINGS) if i >= 0)
    return ("\n" + old[starts[0]:]) if starts else ""


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
