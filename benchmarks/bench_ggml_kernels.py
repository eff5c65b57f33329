"""ggml's CPU kernels against tokentui's own, on a Qwen3-0.6B-sized layer stack (issue 37's "measure both before
choosing"), and GGMLLinear's prefill path.

    .venv/bin/python benchmarks/bench_ggml_kernels.py [--rounds 5] [--formats Q8_0,Q4_0,...] [--prefill-only]

1. Decode: the 28 layers' 7 matrix-vector products of one token (hidden 1024, q 2048, k / v 1024, MLP 3072: Qwen3-
   0.6B's shapes; random weights, each layer's own bytes), per format through ggml's product
   (torch.ops.tokentui_ggml.product, one call a matrix), and for Q4_0 / Q4_1 / Q4_K / Q8_0 through tokentui's own
   kernels on the same values (core/model/native/q4_native.py's NativeQ4 float32 and NativeQ4I16 int16
   activations, one call a matrix: the same call overhead); plus ggml's whole native step on the stack
   (torch.ops.tokentui_ggml.decode_step at position 0: the products with no call between them). Rounds alternate
   the kernels and 1 / 2 threads; each figure is the median over rounds of the best of 5 tokens, in ms per token.
2. Prefill: a 1024 -> 3072 matrix as stored (Q8_0, Q5_K, Q6_K, F16, BF16) at M = 16, 64, 512 rows: ggml's
   product (vec_dot; tinyBLAS for Q8_0), llama.cpp's matrix product through a ggml graph (mul_mat: GGMLLinear's
   path above PRODUCT_ROWS), and the matrix de-quantized to float32 then torch's F.linear (its path before), ms per
   call.

ggml's library: $TOKENTUI_GGML_LIB, else the cached build (core/model/native/ggml_build.py, built if missing).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tokentui.core.model.native.q4_native import NativeQ4, NativeQ4I16
from tokentui.core.model.quant import ggml_linear
from tokentui.core.model.quant.ggml_linear import GGMLMatrix
from tokentui.core.model.quant.gguf_quant import read_blocks

LAYERS, H, Q, KV, MLP = 28, 1024, 2048, 1024, 3072
SHAPES = [(Q, H), (KV, H), (KV, H), (H, Q), (MLP, H), (MLP, H), (H, MLP)]  # (rows, cols): q k v o gate up down
FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "F16", "BF16")
OURS = ("Q4_0", "Q4_1", "Q4_K", "Q8_0")  # what tokentui's own kernels take as stored (gguf_quant.py)
HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128


def layer_stack(fmt: str) -> list[list[GGMLMatrix]]:
    """28 layers of 7 matrices in `fmt`: one layer quantized by ggml, its bytes copied per layer (each its own
    memory, as a file's are)."""
    g = torch.Generator().manual_seed(0)
    first = [GGMLMatrix.quantize(torch.randn(rows, cols, generator=g) * 0.02, fmt) for rows, cols in SHAPES]
    return [[GGMLMatrix(m.raw.clone(), fmt, m.rows, m.cols) for m in first] for _ in range(LAYERS)]


def ours(stack: list[list[GGMLMatrix]], kernel) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """The same stack packed for one of tokentui's kernels, from the same bytes (gguf_quant.read_blocks)."""
    return [[kernel.pack(read_blocks(m.type_name, m.raw.numpy(), m.rows, m.cols)) for m in layer] for layer in stack]


def time_token(run, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def ggml_products(stack, xs):
    ops = torch.ops.tokentui_ggml

    def run():
        for layer in stack:
            for m in layer:
                ops.product(xs[m.cols], m.raw, m.type)
    return run


def our_products(packed, kernel, xs):
    def run():
        for layer in packed:
            for (p, s), (_, cols) in zip(layer, SHAPES):
                kernel.mm(xs[cols], p, s)
    return run


def ggml_step(stack):
    """ggml's whole native step over the stack at position 0 (norm weights 1, no biases)."""
    ones = torch.ones(H)
    head_ones = torch.ones(HEAD_DIM)
    mats = [m.raw for layer in stack for m in layer]
    types = [m.type for layer in stack for m in layer]
    vectors = [t for _ in stack for t in (ones, ones, None, None, None, head_ones, head_ones)]
    kbufs = [torch.zeros(1, KV_HEADS, 4, HEAD_DIM) for _ in stack]
    vbufs = [torch.zeros(1, KV_HEADS, 4, HEAD_DIM) for _ in stack]
    x = torch.randn(1, H)
    cos, sin = torch.ones(HEAD_DIM), torch.zeros(HEAD_DIM)

    def run():
        torch.ops.tokentui_ggml.decode_step(x, 0, cos, sin, kbufs, vbufs, mats, types, [0] * len(types), vectors, ones,
                                            HEADS, KV_HEADS, 1e-6, HEAD_DIM ** -0.5)  # [0]: none interleaved
    return run


def decode(formats, rounds: int) -> None:
    xs = {cols: torch.randn(1, cols) for cols in (H, Q, MLP)}
    print(f"decode, ms per token for the {LAYERS}-layer stack's products (median over {rounds} rounds of the best "
          "of 5)")
    for fmt in formats:
        stack = layer_stack(fmt)
        runs = {"ggml product": ggml_products(stack, xs), "ggml step": ggml_step(stack)}
        if fmt in OURS:
            for kernel in (NativeQ4(), NativeQ4I16()):
                runs[f"ours {kernel.name}"] = our_products(ours(stack, kernel), kernel, xs)
        times = {(name, t): [] for name in runs for t in (1, 2)}
        for _ in range(rounds):
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for name, run in runs.items():
                    run()  # warm
                    times[name, threads].append(time_token(run))
        nbytes = sum(m.nbytes for layer in stack for m in layer)
        for name in runs:
            print(f"  {fmt:5} {name:17} {nbytes / 2**20:6.0f} MiB   1 thread {statistics.median(times[name, 1]):7.2f}"
                  f"   2 threads {statistics.median(times[name, 2]):7.2f}")
        del stack, runs


def prefill(rounds: int) -> None:
    print("prefill, ms per call of a 1024 -> 3072 matrix (median over rounds of the best of 3)")
    g = torch.Generator().manual_seed(1)
    ops = torch.ops.tokentui_ggml
    for fmt in ("Q8_0", "Q5_K", "Q6_K", "F16", "BF16"):
        m = GGMLMatrix.quantize(torch.randn(MLP, H, generator=g) * 0.02, fmt)
        for rows in (16, 64, 512):
            x = torch.randn(rows, H, generator=g)
            runs = {"product": lambda: ops.product(x, m.raw, m.type),
                    "mul_mat": lambda: ops.mul_mat(x, m.raw, m.type),
                    "dequantize+F.linear": lambda: torch.nn.functional.linear(x, m.dequantize())}
            times = {(n, t): [] for n in runs for t in (1, 2)}
            for _ in range(rounds):
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    for name, run in runs.items():
                        run()
                        times[name, threads].append(time_token(run, 3))
            line = "   ".join(f"{n} {statistics.median(times[n, 1]):7.2f} / {statistics.median(times[n, 2]):7.2f}"
                             for n in runs)
            print(f"  {fmt:5} M={rows:3}   (1 / 2 threads)   {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--prefill-only", action="store_true")
    args = parser.parse_args()
    why = ggml_linear.load(lambda p: print(p.stage, file=sys.stderr))
    if why is not None:
        sys.exit(f"ggml's kernels: {why}")
    if NativeQ4.unavailable() is not None:
        sys.exit(f"tokentui's kernels: {NativeQ4.unavailable()}")
    flags = sorted({f for f in Path("/proc/cpuinfo").read_text().split() if f.startswith(("avx", "fma", "f16c"))}) \
        if Path("/proc/cpuinfo").exists() else []
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, CPU flags: "
          f"{' '.join(flags)}")
    np.random.seed(0)
    if not args.prefill_only:
        decode([f for f in args.formats.split(",") if f], args.rounds)
    prefill(args.rounds)


if __name__ == "__main__":
    main()
