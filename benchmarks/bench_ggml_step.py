"""The native decode step on ggml's kernels (core/model/native/ggml_native.py) on a Qwen3-0.6B-shaped model with random
weights, every matrix stored by ggml in one format (or a Q4_K_M-like mix): how far its final hidden states are from
the model's forward through the same GGMLLinear modules (the figure ggml_native.TOLERANCE bounds), whether their
greedy choices agree, and ms per token of each.

    .venv/bin/python benchmarks/bench_ggml_step.py [--formats Q8_0,Q4_K_M,Q4_0] [--layers 28] [--steps 32]

Per format: the prompt (16 ids) through the forward on two caches, then `--steps` tokens teacher-forced on the
forward's greedy ids through the step and through the forward: max |difference| / max(1, max |forward|) of the final
hidden state (max and median over steps) and top-1 agreement of the (tied, ggml) head's scores; then 5 tokens of
each at 1 and 2 threads (best and median ms). Memory: the float32 model (~2.4 GB) plus one stored copy at a time.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
import transformers
from torch import nn

from tokentui.core.model.decode.adapter import cache_keyword, forward_last_logits, new_cache
from tokentui.core.model.native import ggml_native
from tokentui.core.model.quant import ggml_linear
from tokentui.core.model.quant.ggml_linear import GGMLEmbedding, GGMLLinear, GGMLMatrix

Q4_K_M = {"v_proj": "Q6_K", "down_proj": "Q6_K", "embed": "Q6_K"}  # Q4_K for the rest


def qwen3_shaped(layers: int) -> nn.Module:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                      num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=8,
                                      head_dim=128, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=1e6,
                                      max_position_embeddings=4096)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # norm weights as a trained model's, not all ones (test_ggml_step.py's float_model says why)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def stored(model: nn.Module, fmt: str) -> nn.Module:
    def format_of(name: str) -> str:
        return Q4_K_M.get(name, "Q4_K") if fmt == "Q4_K_M" else fmt

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and name != "lm_head":
                setattr(module, name, GGMLLinear(GGMLMatrix.quantize(child.weight, format_of(name)), child.bias))
    table = GGMLEmbedding(GGMLMatrix.quantize(model.model.embed_tokens.weight, format_of("embed")))
    model.model.embed_tokens, model.lm_head = table, GGMLLinear(table.matrix)
    return model


def measure(model: nn.Module, fmt: str, steps: int) -> None:
    torch.set_num_threads(1)
    step = ggml_native.ggml_step(model)
    if step is None:
        print(f"{fmt}: refused: {ggml_native.why_not(model)}")
        return
    prompt = [(i * 7919) % 150000 + 10 for i in range(16)]
    ours, theirs = new_cache(model, 64), new_cache(model, 64)
    diffs, agree = [], 0
    with torch.inference_mode():
        forward_last_logits(model, torch.tensor([prompt]), ours)
        token = int(forward_last_logits(model, torch.tensor([prompt]), theirs).argmax())
        for _ in range(steps):
            a = step.hidden(token, ours)
            b = model.model(input_ids=torch.tensor([[token]]), use_cache=True,
                            **{cache_keyword(model.model): theirs}).last_hidden_state[:, -1]
            diffs.append(float((a - b).abs().max()) / max(1.0, float(b.abs().max())))
            mine, forward = int(model.lm_head(a).argmax()), int(model.lm_head(b).argmax())
            agree += mine == forward
            token = forward
        print(f"{fmt}: step vs forward, final hidden state: max {max(diffs):.2e}, median "
              f"{statistics.median(diffs):.2e}; top-1 agreement {agree}/{steps}")
        for threads in (1, 2):
            torch.set_num_threads(threads)
            times = {"ggml step": [], "forward": []}
            for _ in range(5):
                start = time.perf_counter()
                step.step(token, ours)
                times["ggml step"].append(time.perf_counter() - start)
                start = time.perf_counter()
                forward_last_logits(model, torch.tensor([[token]]), theirs)
                times["forward"].append(time.perf_counter() - start)
            print(f"  {threads} thread(s): " + "   ".join(
                f"{name} {min(t) * 1e3:.1f} ms/token (median {statistics.median(t) * 1e3:.1f})"
                for name, t in times.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="Q8_0,Q4_K_M,Q4_0")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    why = ggml_linear.load(lambda p: print(p.stage, file=sys.stderr))
    if why is not None:
        sys.exit(f"ggml's kernels: {why}")
    base = qwen3_shaped(args.layers)
    for fmt in args.formats.split(","):
        model = stored(copy.deepcopy(base), fmt)
        measure(model, fmt, args.steps)
        del model


if __name__ == "__main__":
    main()
