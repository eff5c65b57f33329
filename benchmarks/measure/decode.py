"""1 + 4: engine decode against transformers' generate, and against the physical limit (bandwidth / weight bytes)."""

from __future__ import annotations

import time
import torch  # noqa: E402
from tokentui.core.model.engine import Engine  # noqa: E402
from tokentui.core.settings import RunOptions, SamplerSettings  # noqa: E402
from tokentui.core.model.speed import SpeedOptions, use_threads  # noqa: E402
from measure.common import NEW_TOKENS, TORCH_DEFAULT_THREADS, bandwidth, log, med, run_engine, run_generate  # noqa: E402


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


def bench_decode(loaded, stock, reps: int, with_compile: bool) -> dict:
    """`loaded` goes to the engines (which re-lay its wide weights, core/model/quant/weight_layout.py); `stock`, a second copy exactly
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
