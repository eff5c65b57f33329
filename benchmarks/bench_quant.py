"""Issue 25: the embedded model's 4-bit path (its GGUF's Q4_1 blocks as stored, core/model/load/gguf_load.py) against
its float32 de-quantized reference and against llama-server on the same file; writes its section of BENCHMARKS.md.

    .venv/bin/python benchmarks/bench_quant.py [--reps 3] [--steps 128] [--threads 1,2] [--no-server]
                                               [--compile] [--no-launch] [--no-dashboard] [--out BENCHMARKS.md]

Everything runs in this one process (llama-server in its own, idle while the others run), the contenders
alternated (A B C ... A B C ...), every figure a median of --reps, every target a median of per-repetition ratios.

 A. decode tok/s at each thread count of --threads (prefill and decode both): the float32 reference engine
    (--dtype float32, wide weights re-laid as tokentui does), and the same weights quantized here (--quantize int4,
    core/model/quant/quantize.py); the 4-bit model through transformers' forward, its projections unfused and fused
    (q/k/v, gate/up); through the eager lean step (core/model/decode/lean_step.py); the default, the native step
    (core/model/native/native_step.py); the same model on torch's int4 kernel and on tokentui's float32-activation kernel
    where the default is another; llama-server -t N (its own `timings` of a plain request: no HTTP per token, no
    tokentui client). Target: default ÷ llama-server >= 1.0 at 2 threads. With --compile also the 4-bit model's
    --compile step.
 B. fidelity against the float32 reference, teacher-forced on its own 128 greedy tokens: top-1 agreement and max /
    mean |dp| over the shown (top-10) candidates, for the 4-bit path as a run decodes (the native step), through the
    model's forward, on the float32-activation kernel (core/model/observe/fidelity.py) and for llama-server
    (one /completion per position, benchmarks/server_vs_local.py's teacher_forced); the free-running first
    divergence.
 C. the physical limit: bytes of weights a 4-bit step reads (ModelFacts.quantization.weight_bytes) ÷ the read
    bandwidth measured here, and the share of it reached.
 D. bench.py's ratios on the default path: engine ÷ transformers generate (the same 4-bit model), dashboard ÷
    headless, selection's share of a step; launch to first token (fresh processes, cold and warm cache).
 E. prefill of 32 / 256 / 1,024 tokens, 4-bit and float32.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402

from measure.common import (TORCH_DEFAULT_THREADS, bandwidth, log, machine, med, run_engine,  # noqa: E402
                            run_generate)
from measure.dashboard import bench_dashboard  # noqa: E402
from measure.launch import bench_launch  # noqa: E402
from measure.selection import bench_select, real_scores  # noqa: E402
from tokentui.core.model.decode.steps import TorchForward  # noqa: E402
from tokentui.core.model.engine import Engine  # noqa: E402
from tokentui.core.model.observe.fidelity import agreement, first_divergence, teacher_forced_logits  # noqa: E402
from tokentui.core.model.load.loader import LoadedModel, load_model  # noqa: E402
from tokentui.core.model.native.native_step import decode_step_for  # noqa: E402
from tokentui.core.model.speed import SpeedOptions, use_threads  # noqa: E402
from tokentui.core.settings import RunOptions, SamplerSettings  # noqa: E402
from tokentui.core.steps.prefill import prefill  # noqa: E402

PROMPT = "Is OpenAI open?"  # tokentui's default prompt, benchmarks/server_vs_local.py's too
HEADING = "## The 4-bit path (issue 25)"
GREEDY = SamplerSettings(temperature=0.0)
HERE = "float32 reference quantized here (--quantize int4)"
COMPILED = "4-bit, the lean step compiled (--compile where the native step does not serve)"
TORCH_KERNEL = "4-bit, torch's int4 kernel (fused + eager lean step)"
DEFAULT = "4-bit, default (fused + native step)"
FP32_KERNEL = "4-bit, float32-activation kernel avx2-fp32 (fused + native step)"
EAGER_LEAN = "4-bit, eager lean step (fused, Python between the kernels)"


def heading(simd: str) -> str:
    """The section's heading for a CPU class: torch's int4 kernel has an AVX-512 path and a much slower AVX2 one, so
    the two classes keep a section each (a run replaces only its own class's)."""
    return f"{HEADING}, {'AVX-512' if 'avx512f' in simd else 'AVX2-only' if 'avx2' in simd else 'other'} CPU"


# ---------------------------------------------------------------------------------------------------- models
def unfused_copy(quantized: LoadedModel) -> LoadedModel:
    """The same 4-bit weights with every projection its own kernel call (no fused q/k/v, gate/up): read from the
    GGUF again and packed without fusing (the lean step needs the fused products, so this one decodes through
    transformers' forward)."""
    from tokentui.core.model.load.gguf_load import assemble, build_modules
    from tokentui.core.model.load.gguf_plan import _skeleton, plan_gguf
    from tokentui.core.model.load.precheck import embedded_gguf
    from tokentui.core.model.quant.qlinear import chosen_kernel

    skeleton = _skeleton(quantized.model.config)
    plan = plan_gguf(embedded_gguf(), skeleton)
    modules, floats = build_modules(plan, chosen_kernel(), fuse=False)
    model = assemble(skeleton, modules, floats)
    return LoadedModel(model=model, tokenizer=quantized.tokenizer, facts=quantized.facts)


def torch_kernel_copy() -> LoadedModel | None:
    """The 4-bit model on torch's int4 kernel, where the default is tokentui's AVX2 kernel (else None)."""
    from tokentui.core.model.quant.int4_kernel import TorchInt4
    from tokentui.core.model.quant.qlinear import KERNEL_ENV, chosen_kernel

    if chosen_kernel().name == TorchInt4.name or not TorchInt4.available():
        return None
    os.environ[KERNEL_ENV] = TorchInt4.name
    try:
        return load_model(None, device="cpu")
    finally:
        del os.environ[KERNEL_ENV]


def fp32_kernel_copy() -> LoadedModel | None:
    """The 4-bit model on tokentui's float32-activation kernel, where the default is its int16 one (else None)."""
    from tokentui.core.model.native.q4_native import NativeQ4, NativeQ4I16
    from tokentui.core.model.quant.qlinear import KERNEL_ENV, chosen_kernel

    if chosen_kernel().name != NativeQ4I16.name:
        return None
    os.environ[KERNEL_ENV] = NativeQ4.name
    try:
        return load_model(None, device="cpu")
    finally:
        del os.environ[KERNEL_ENV]


def engines(reference, quantized, unfused, here, threads: int, options: RunOptions, with_compile: bool,
            on_torch_kernel: LoadedModel | None = None, on_fp32_kernel: LoadedModel | None = None) -> dict:
    from tokentui.core.model.decode import lean_step
    from tokentui.core.model.native import native_step

    speed = SpeedOptions(threads=threads, prefill_threads=threads)
    out = {"float32 reference": Engine(reference, GREEDY, options, speed=speed)}
    # an engine's decode step is chosen as it is made (core/model/decode/plan.py): the contenders that decode
    # through transformers' forward, or through the eager lean step, are made while the faster steps are off
    for name, loaded in (("4-bit, transformers forward, unfused", unfused), ("4-bit, transformers forward, fused",
                                                                             quantized)):
        with native_step.disabled(loaded.model), lean_step.disabled(loaded.model):
            out[name] = Engine(loaded, GREEDY, options, speed=speed)
    with native_step.disabled(quantized.model):
        out[EAGER_LEAN] = Engine(quantized, GREEDY, options, speed=speed)
    out[DEFAULT] = Engine(quantized, GREEDY, options, speed=speed)
    if on_torch_kernel is not None:
        out[TORCH_KERNEL] = Engine(on_torch_kernel, GREEDY, options, speed=speed)
    if on_fp32_kernel is not None:
        out[FP32_KERNEL] = Engine(on_fp32_kernel, GREEDY, options, speed=speed)
    if here is not None:
        out[HERE] = Engine(here, GREEDY, options, speed=speed)
    if with_compile:  # where the native step serves, --compile keeps it: made without it, to measure the compiled one
        log(f"  compiling the 4-bit lean decode step at {threads} thread(s) (minutes) ...")
        started = time.perf_counter()
        with native_step.disabled(quantized.model):
            out[COMPILED] = Engine(quantized, GREEDY, options,
                                   speed=SpeedOptions(compile=True, threads=threads, prefill_threads=threads))
        log(f"  compiled in {time.perf_counter() - started:.0f} s")
    return out


def run_contender(name: str, engine: Engine):
    """One run of a contender (`engines` made each with the decode step its name says)."""
    return run_engine(engine, PROMPT)


# ---------------------------------------------------------------------------------------------------- server
def start_servers(thread_counts: list[int]):
    """llama-server -t N for each N, started once. When its default start crashes on this CPU (llama.cpp's AMX
    path segfaulted on this Xeon), it is started again with --no-repack and the report says so."""
    import llama_server

    servers, notes = {}, []
    gguf = llama_server.embedded_gguf()
    for n in thread_counts:
        extra = ["--cache-ram", "0"]
        try:
            servers[n] = llama_server.start(gguf, threads=n, extra_args=extra)
        except llama_server.ServerError as err:
            if "code -11" not in str(err):
                raise
            note = "llama-server's default start crashed here (SIGSEGV, llama.cpp's AMX matmul): run with --no-repack"
            if note not in notes:
                notes.append(note)
            servers[n] = llama_server.start(gguf, threads=n, extra_args=[*extra, "--no-repack"])
    return servers, notes


def server_own_tok_s(native, prompt_ids: list[int], steps: int) -> float:
    native.clear_cache()
    answer = native.completion(prompt_ids, steps, ignore_eos=True)
    return answer["timings"]["predicted_per_second"]


# ---------------------------------------------------------------------------------------------------- A + B + C
def bench_decode(reference, quantized, unfused, here, args, servers, on_torch_kernel=None, on_fp32_kernel=None) -> dict:
    from server_vs_local import Native

    options = RunOptions(max_new_tokens=args.steps, ignore_eos=True)
    res: dict = {"threads": {}}
    natives = {n: Native(s.url) for n, s in servers.items()}
    bw = {1: bandwidth(1), TORCH_DEFAULT_THREADS: bandwidth(TORCH_DEFAULT_THREADS)}
    for threads in args.threads:
        contenders = engines(reference, quantized, unfused, here, threads, options, args.compile, on_torch_kernel,
                             on_fp32_kernel)
        ids = {}
        for name, engine in contenders.items():  # a warm-up run each, not counted
            got = run_contender(name, engine)
            ids[name] = got[0]
            prompt_ids = got[3]
        series: dict[str, list[float]] = {}
        for rep in range(args.reps):
            for name, engine in contenders.items():
                got = run_contender(name, engine)
                series.setdefault(name, []).append(got[1].decode_tok_s)
            if threads in natives:
                series.setdefault(f"llama-server -t {threads}", []).append(
                    server_own_tok_s(natives[threads], prompt_ids, args.steps))
            log(f"  {threads} thread(s), rep {rep + 1}/{args.reps}: "
                + ", ".join(f"{k} {v[-1]:.1f}" for k, v in series.items()))
            bw = {t: max(b, bandwidth(t)) for t, b in bw.items()}
        default = series[DEFAULT]
        entry = {"tok_s": {k: med(v) for k, v in series.items()}, "each": series, "prompt_tokens": len(prompt_ids),
                 "divergence": {k: first_divergence(v, ids["float32 reference"]) for k, v in ids.items()},
                 "default_over_reference": med([d / r for d, r in zip(default, series["float32 reference"])])}
        server = series.get(f"llama-server -t {threads}")
        if server:
            entry["default_over_server"] = med([d / s for d, s in zip(default, server)])
            entry["reference_over_server"] = med([r / s for r, s in zip(series["float32 reference"], server)])
            if COMPILED in series:
                entry["compiled_over_server"] = med([c / s for c, s in zip(series[COMPILED], server)])
        for name in series:
            if name.startswith("4-bit") and name != DEFAULT:
                entry.setdefault("default_over", {})[name] = med([d / o for d, o in zip(default, series[name])])
        res["threads"][threads] = entry
        res["prompt_ids"] = prompt_ids
        use_threads(torch.device("cpu"), 1)
    weights = quantized.facts.quantization.weight_bytes
    res.update(weight_bytes=weights, bandwidth=bw)
    best = max(bw.values())
    res["limit_tok_s"] = best * 1e9 / weights
    res["reference_limit_tok_s"] = best * 1e9 / reference_weight_bytes(reference.model)
    return res


def reference_weight_bytes(model) -> int:
    return sum(p.nbytes for p in model.parameters())  # tied: the table is the head, read whole


def bench_fidelity(reference, quantized, here, servers, steps: int, with_compile: bool, on_fp32_kernel=None) -> dict:
    """B: teacher-forced on the reference's own greedy tokens, every contender against the reference (`here`: the
    reference's own weights quantized by --quantize int4, core/model/quant/quantize.py)."""
    from server_vs_local import Native, collect, teacher_forced

    use_threads(torch.device("cpu"), 1)
    options = RunOptions(max_new_tokens=steps, ignore_eos=True, top_candidates=10)
    ref_run = collect(Engine(reference, GREEDY, options).run(PROMPT))
    q_run = collect(Engine(quantized, GREEDY, options).run(PROMPT))
    prompt_ids, tokens = list(ref_run["prompt"].ids), ref_run["ids"]
    ref_scores = teacher_forced_logits(reference.model, prompt_ids, tokens)
    default_step = decode_step_for(quantized.model)  # what a run decodes with: the native step where it serves
    ours = agreement(ref_scores, teacher_forced_logits(quantized.model, prompt_ids, tokens, lean_step=default_step))
    out = {"tokens": len(tokens), "quantized": ours.__dict__, "step": type(default_step).__name__,
           "free_run_divergence": first_divergence(q_run["ids"], tokens),
           "eager": agreement(ref_scores, teacher_forced_logits(quantized.model, prompt_ids, tokens)).__dict__}
    if on_fp32_kernel is not None:
        out["float32_kernel"] = agreement(ref_scores, teacher_forced_logits(
            on_fp32_kernel.model, prompt_ids, tokens, lean_step=decode_step_for(on_fp32_kernel.model))).__dict__
    if here is not None:
        out["quantized_here"] = agreement(ref_scores, teacher_forced_logits(here.model, prompt_ids, tokens)).__dict__
        here_run = collect(Engine(here, GREEDY, options).run(PROMPT))
        out["quantized_here_divergence"] = first_divergence(here_run["ids"], tokens)
    if with_compile:
        from tokentui.core.model.decode.compiled_lean import CompiledLeanStep

        step = CompiledLeanStep.for_model(quantized.model, 1)
        step.warm_up(quantized.model)
        out["compiled"] = agreement(ref_scores, teacher_forced_logits(quantized.model, prompt_ids, tokens,
                                                                      lean_step=step)).__dict__
    at = out["free_run_divergence"]
    if at is not None:
        raw = sorted((c.raw_prob for c in ref_run["steps"][at].candidates), reverse=True)
        out["free_run_divergence_margin"] = raw[0] - raw[1]
    if servers:
        pieces = {s.id: s.piece for s in ref_run["steps"]}
        native = Native(next(iter(servers.values())).url)
        tf = teacher_forced(native, prompt_ids, ref_run, pieces)
        out["server"] = {k: v for k, v in tf.items() if k not in ("positions", "disagreements")}
        out["server"]["disagreement_margins"] = [r["local_margin"] for r in tf["disagreements"]]
    return out


# ---------------------------------------------------------------------------------------------------- D + E
def bench_ratios(quantized, reps: int, with_dashboard: bool) -> dict:
    """bench.py's targets 1-3 on the default path."""
    options = RunOptions(max_new_tokens=128, ignore_eos=True)
    engine = Engine(quantized, GREEDY, options)
    threads = engine.speed.decode_threads()
    ids, _, _, prompt_ids = run_engine(engine)
    gen_ids, _ = run_generate(quantized.model, prompt_ids, 128, threads)
    series: dict[str, list[float]] = {"engine": [], "generate": []}
    for _ in range(reps):
        series["engine"].append(run_engine(engine)[1].decode_tok_s)
        series["generate"].append(run_generate(quantized.model, prompt_ids, 128, threads)[1])
    use_threads(torch.device("cpu"), threads)
    out = {"threads": threads, "ids_equal_generate": ids == gen_ids,
           "tok_s": {k: med(v) for k, v in series.items()},
           "engine_over_generate": med([e / g for e, g in zip(series["engine"], series["generate"])])}
    step_ms = 1000 / out["tok_s"]["engine"]
    out["select"] = {str(k): v for k, v in bench_select(step_ms, threads, real_scores(quantized, prompt_ids)).items()}
    out["step_ms"] = step_ms
    if with_dashboard:
        out["dashboard"] = bench_dashboard(engine, reps)
    return out


def bench_prefill(reference, quantized, reps: int) -> dict:
    text = (ROOT / "README.md").read_text(encoding="utf-8") * 4
    pool = quantized.tokenizer(text, add_special_tokens=False)["input_ids"]
    speed = SpeedOptions()
    out = {}
    for n in (32, 256, 1024):
        series: dict[str, list[float]] = {"4-bit": [], "float32": []}
        for _ in range(reps):
            for name, loaded in (("4-bit", quantized), ("float32", reference)):
                cache, _ = TorchForward(loaded.model).new_cache(n, 16)
                use_threads(torch.device("cpu"), speed.prefill_thread_count(n))
                series[name].append(prefill(loaded.model, pool[:n], cache)[1])
        out[n] = {k: med(v) for k, v in series.items()}
        log(f"  prefill {n}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in out[n].items()))
    return out


# ---------------------------------------------------------------------------------------------------- report
def _ratio_rows(res: dict) -> list[str]:
    rows = []
    for threads, entry in res["decode"]["threads"].items():
        if "default_over_server" in entry:
            ok = "met" if entry["default_over_server"] >= 1.0 else "**not met**"
            rows.append(f"| 4-bit default ÷ llama-server, {threads} thread(s) each | ≥ 1.0 (moonshot 1.3) | "
                        f"{entry['default_over_server']:.2f} | {ok} |")
            rows.append(f"| float32 reference ÷ llama-server, {threads} thread(s) (today's default) | — | "
                        f"{entry['reference_over_server']:.2f} | — |")
            if "compiled_over_server" in entry:
                rows.append(f"| 4-bit, the lean step compiled ÷ llama-server, {threads} thread(s) each | — | "
                            f"{entry['compiled_over_server']:.2f} | — |")
        rows.append(f"| 4-bit default ÷ float32 reference, {threads} thread(s) | — | "
                    f"{entry['default_over_reference']:.2f} | — |")
        for other, what in ((TORCH_KERNEL, f"default ({res.get('kernel')}) ÷ the same on torch's int4 kernel"),
                            (FP32_KERNEL, f"default ({res.get('kernel')}) ÷ the same on the float32-activation kernel"),
                            (COMPILED, "default (native step) ÷ the lean step compiled"),
                            (EAGER_LEAN, "default (native step) ÷ the eager lean step, same kernel")):
            if other in entry.get("default_over", {}):
                rows.append(f"| 4-bit {what}, {threads} thread(s) | — | {entry['default_over'][other]:.2f} | — |")
    return rows


def _agreement(a: dict) -> str:
    """A fidelity table cell: top-1 agreement and max / mean |dp| over the shown candidates."""
    return f"{a['agree']}/{a['positions']}; max / mean \\|Δp\\| {a['dp_max']:.5f} / {a['dp_mean']:.6f}"


def render(res: dict, args, started: float) -> str:
    info, load = res["machine"], res["load"]
    lines = [heading(info["simd"]), ""]
    lines.append(f"Written by `.venv/bin/python benchmarks/bench_quant.py` on {datetime.date.today().isoformat()} in "
                 f"{(time.perf_counter() - started) / 60:.1f} min; contenders alternated in one process, medians of "
                 f"{args.reps}; {args.steps} greedy tokens (ignore_eos) after the {res['decode']['prompt_ids'].__len__()}"
                 f"-token chat prompt of {PROMPT!r}. Machine: {info['cpu']}, {info['cores']} cores ({info['simd']}), "
                 f"torch {info['torch']}; the default 4-bit kernel: {res.get('kernel') or 'torch-int4'}; load average (1 min) {load[0]:.1f} at start, {load[1]:.1f} at the end "
                 "(other engineers' jobs share this machine: absolute tok/s move with them, the ratios less).")
    for note in res.get("server_notes", []):
        lines.append(f"Note: {note}.")
    lines += ["", "| What | Target | Measured | Verdict |", "|---|---|---|---|"]
    lines += _ratio_rows(res)
    fid = res["fidelity"]
    q = fid["quantized"]
    lines.append(f"| top-1 agreement with the float32 reference, teacher-forced, 4-bit | more than llama-server | "
                 f"{q['agree']}/{q['positions']} | "
                 + ("met" if "server" not in fid or q["agree"] > fid["server"]["agree"] else "**not met**") + " |")
    if "eager" in fid:
        lines.append(f"| same, 4-bit through the model's forward (the eager lean step: the default step is "
                     f"{fid.get('step')}) | — | {_agreement(fid['eager'])} | — |")
    if "float32_kernel" in fid:
        lines.append(f"| same, 4-bit on the float32-activation kernel (avx2-fp32, native step) | — | "
                     f"{_agreement(fid['float32_kernel'])} | — |")
    if "quantized_here" in fid:
        div = fid["quantized_here_divergence"]
        lines.append(f"| same, the float32 reference quantized here (`--dtype float32 --quantize int4`) | — | "
                     f"{_agreement(fid['quantized_here'])}; free-running greedy "
                     + ("identical" if div is None else f"first differs at step {div + 1}") + " | — |")
    if "compiled" in fid:
        c = fid["compiled"]
        lines.append(f"| same, 4-bit, the lean step compiled (its decode step teacher-forced) | more than llama-server | "
                     f"{_agreement(c)} | "
                     + ("met" if "server" not in fid or c["agree"] > fid["server"]["agree"] else "**not met**") + " |")
    if "server" in fid:
        s = fid["server"]
        lines.append(f"| same, llama-server | — | {s['agree']}/{s['comparable']} | — |")
        lines.append(f"| max / mean \\|Δp\\| over the shown candidates, 4-bit vs llama-server | 4-bit lower | "
                     f"{q['dp_max']:.5f} / {q['dp_mean']:.6f} vs {s['dp_max']:.4f} / {s['dp_mean']:.5f} | "
                     + ("met" if q["dp_max"] < s["dp_max"] and q["dp_mean"] < s["dp_mean"] else "**not met**")
                     + " |")
    dec = res["decode"]
    d2 = dec["threads"][min(dec["threads"])]["tok_s"][DEFAULT]
    lines.append(f"| 4-bit decode ÷ physical limit ({dec['weight_bytes'] / 1e6:.0f} MB a step ÷ "
                 f"{max(dec['bandwidth'].values()):.1f} GB/s = {dec['limit_tok_s']:.0f} tok/s), "
                 f"{min(dec['threads'])} thread(s) | — | {d2 / dec['limit_tok_s']:.2f} | — |")
    if "ratios" in res:
        r = res["ratios"]
        lines.append(f"| engine ÷ transformers generate, same 4-bit model ({r['threads']} thread(s)) | ≥ 1.10 | "
                     f"{r['engine_over_generate']:.2f} | {'met' if r['engine_over_generate'] >= 1.10 else '**not met**'} |")
        if "dashboard" in r:
            dr = r["dashboard"]["ratio"]
            lines.append(f"| dashboard ÷ headless (4-bit) | ≥ 0.95 | {dr:.2f} | {'met' if dr >= 0.95 else '**not met**'} |")
        worst = max((v["share"], k) for k, v in r["select"].items() if isinstance(v, dict) and "49152," in k)
        lines.append(f"| selection share of a 4-bit step ({r['step_ms']:.1f} ms), V = 49,152, worst setting | ≤ 3 % | "
                     f"{100 * worst[0]:.1f} % | {'met' if worst[0] <= 0.03 else '**not met**'} |")
        if "torch_ms" in (w := r["select"][worst[1]]):
            torch_share = 100 * w["torch_ms"] / (r["step_ms"] + w["torch_ms"])
            lines.append(f"| selection at that setting: torch operations ÷ the one C++ call ({w['torch_ms']:.2f} ÷ "
                         f"{w['ms']:.2f} ms; the torch path's share: {torch_share:.1f} %) | — | "
                         f"{w['torch_ms'] / w['ms']:.1f} | — |")
    if res.get("launch"):
        la = res["launch"]
        lines.append(f"| launch to first token, warm / cold (4-bit default, fresh processes; importing torch and "
                     f"transformers alone: {la['imports_s']:.1f} s) | — | "
                     f"{la['warm_s']:.1f} / {la.get('cold_s', float('nan')):.1f} s | — |")
    lines += ["", "Decode tok/s (medians):", "", "| Contender | " + " | ".join(
        f"{t} thread(s)" for t in dec["threads"]) + " |", "|---|" + "---|" * len(dec["threads"])]
    names = list(dict.fromkeys(n for e in dec["threads"].values() for n in e["tok_s"]))
    for name in names:
        cells = [f"{e['tok_s'][name]:.1f}" if name in e["tok_s"] else "—" for e in dec["threads"].values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    differ = sorted({(name, at) for e in dec["threads"].values() for name, at in e["divergence"].items()
                     if at is not None})
    lines.append("Free runs: every local contender gave the float32 reference's token ids"
                 + ("." if not differ else ", except " + ", ".join(
                     f"{name} (first divergence at step {at + 1})" for name, at in differ) + "."))
    div = fid["free_run_divergence"]
    lines.append("Free-running greedy, 4-bit against float32: " + (
        f"no divergence in {fid['tokens']} tokens." if div is None else
        f"first divergence at step {div + 1} (reference top-1 margin {fid['free_run_divergence_margin']:.4f})."))
    if q["disagreements"]:
        lines.append("Teacher-forced 4-bit disagreements (step: reference top-1 margin): "
                     + ", ".join(f"{p + 1}: {m:.4f}" for p, m in q["disagreements"]) + ".")
    if "server" in fid and fid["server"]["disagreement_margins"]:
        lines.append("llama-server's (reference margin at each): "
                     + ", ".join(f"{m:.4f}" for m in fid["server"]["disagreement_margins"] if m is not None) + ".")
    if res.get("prefill"):
        lines.append("Prefill, engine ms (4-bit / float32): " + "; ".join(
            f"{n} tokens {v['4-bit']:.0f} / {v['float32']:.0f}" for n, v in res["prefill"].items()) + ".")
    return "\n".join(lines) + "\n"


def write(path: Path, section: str) -> None:
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    title = section.splitlines()[0]
    start = old.find(title + "\n")
    if start >= 0:
        end = old.find("\n## ", start + len(title))
        old = old[:start] + old[end + 1:] if end >= 0 else old[:start]
    path.write_text(old.rstrip("\n") + "\n\n" + section, encoding="utf-8")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--threads", default="1,2", help="thread counts to measure decode at (default 1,2)")
    p.add_argument("--no-server", action="store_true")
    p.add_argument("--compile", action="store_true", help="also the 4-bit model's --compile step (minutes)")
    p.add_argument("--no-launch", action="store_true")
    p.add_argument("--no-dashboard", action="store_true")
    p.add_argument("--json", type=Path)
    p.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = p.parse_args()
    args.threads = [int(t) for t in args.threads.split(",")]
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    res: dict = {"machine": machine()}
    log("loading the float32 reference and the 4-bit model ...")
    reference = load_model(None, device="cpu", dtype="float32")
    quantized = load_model(None, device="cpu")
    unfused = unfused_copy(quantized)
    here = load_model(None, device="cpu", dtype="float32", quantize="int4")  # the reference, quantized here
    on_torch_kernel = torch_kernel_copy()
    on_fp32_kernel = fp32_kernel_copy()
    res["kernel"] = quantized.facts.quantization.kernel
    servers, res["server_notes"] = ({}, []) if args.no_server else start_servers(args.threads)
    try:
        log("A, C: decode ...")
        res["decode"] = bench_decode(reference, quantized, unfused, here, args, servers, on_torch_kernel,
                                     on_fp32_kernel)
        log("B: fidelity ...")
        res["fidelity"] = bench_fidelity(reference, quantized, here, servers, args.steps, args.compile, on_fp32_kernel)
    finally:
        for server in servers.values():
            server.stop()
    log("D: bench.py's ratios on the default path ...")
    res["ratios"] = bench_ratios(quantized, args.reps, not args.no_dashboard)
    log("E: prefill ...")
    res["prefill"] = bench_prefill(reference, quantized, args.reps)
    if not args.no_launch:
        log("D: launch ...")
        res["launch"] = bench_launch(3, cold=True)
    res["load"] = (load_before, os.getloadavg()[0])
    section = render(res, args, started)
    print(section)
    write(args.out, section)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
