"""The report bench.py writes (BENCHMARKS.md's first part): the targets table and the details per measurement."""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from measure.branch import BRANCH_PREFIX  # noqa: E402
from measure.common import NEW_TOKENS, TORCH_DEFAULT_THREADS  # noqa: E402
from measure.lens import LENS_TOKENS  # noqa: E402
from measure.replay import REPLAY_SIZE  # noqa: E402
from measure.selection import SELECT_CASES  # noqa: E402


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


def verdict(key: str, value: float) -> str:
    threshold, higher = TARGETS[key]
    ok = value >= threshold if higher else value <= threshold
    return "met" if ok else "**not met**"


def select_paths(sel: dict) -> list[str]:
    """The one C++ call against the torch operations select() runs without it, timed alternately (ms, ratio)."""
    rows = [(k, v) for k, v in sel.items() if isinstance(v, dict) and "torch_ms" in v]
    if not rows:
        return ["select() ran its torch operations here (tokentui's native library is not available).", ""]
    out = ["The same calls through the torch operations select() runs where the native library is not available "
           "(accelerators, no compiler), timed alternately with the C++ call:", "",
           "| Vocabulary, setting | C++ call ms | torch operations ms | torch ÷ C++ |", "|---|---|---|---|"]
    for (vocab, name), v in rows:
        out.append(f"| {vocab}, {name} | {v['ms']:.3f} | {v['torch_ms']:.3f} | {v['torch_ms'] / v['ms']:.1f}x |")
    return out + [""]


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
             f"({d['layout'].bytes / 2**20:.0f} MiB) they stored transposed (core/model/quant/weight_layout.py)." + (" Compiling took " + " and ".join(
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
    r += select_paths(sel)
    r.append(f"In a real greedy run the whole step outside the model (selection, reporting, detokenizing, the "
             f"event) took {over['outside_ms']:.2f} ms of {over['step_ms']:.1f} ms ({100 * over['share']:.1f} %).\n")
    if lens:
        r.append("### 7 — logit lens\n")
        r.append(f"The same {LENS_TOKENS} greedy tokens with `--logit-lens` off and on, interleaved, {lens['reps']} "
                 f"repetitions, medians over the decode steps: a step takes {lens['off_ms']:.1f} ms off and "
                 f"{lens['on_ms']:.1f} ms on. Asking the forward for its hidden states moves the forward from "
                 f"{lens['forward_off_ms']:.1f} to {lens['forward_on_ms']:.1f} ms; the rest is the lens itself, "
                 f"the final norm and the LM head over all {lens['layers']} layers' states (one "
                 f"[{lens['layers']}, hidden] x [hidden, vocab] product per step, core/model/observe/lens.py).\n")
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


# Sections other scripts write into BENCHMARKS.md (server_vs_local.py's, bench_quant.py's, fanout_speed.py's, ...): kept
# when this one rewrites it.
KEPT_HEADINGS = ("## Same model, two engines (issue 15)", "## The 4-bit path (issue 25)",
                 "## GPU path, round 2 (issue 27)", "## Fan-out (issue 26)")


def _kept_sections(path: Path) -> str:
    try:
        old = path.read_text(encoding="utf-8")
    except OSError:
        return ""
    starts = sorted(i for i in (old.find(h) for h in KEPT_HEADINGS) if i >= 0)
    return ("\n" + old[starts[0]:]) if starts else ""
