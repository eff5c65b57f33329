"""Kernels per decode step, from torch.profiler on CPU, as a proxy for GPU launches: `generate`'s eager step, the
engine's eager step (forward + selection; as on CPU, and with q/k/v and gate/up fused as on CUDA) and the engine's
`--compile` whole step (one compiled call).

    .venv/bin/python benchmarks/step_kernels.py [--model tiny|embedded] [--steps 16] [--json out.json]

What counts as a kernel: in eager code, every leaf op (an op that calls no other op: what would be one launch on a
GPU; views and reshapes that launch nothing are left out); in inductor's compiled code, every generated C++ kernel
(`torch._inductor.config.cpp.enable_kernel_profile` names each one in the profile, as "graph_<n>_cpp_...") plus the
leaf ops the graph still calls, of any namespace (extern matrix products such as mkldnn:: / mkl:: ones after
freezing, attention, the copy of its output). Per step = the profiled steps' count
divided by their number. `--model tiny` (the default on a small machine) is a SmolLM2-135M-shaped model (30
layers, the real vocabulary) with hidden size 64: the same ops per step as the embedded model, compiled in a
fraction of the time; `embedded` uses the real weights.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from measure.common import print_and_save  # noqa: E402
from tokentui.core.model.engine import Engine  # noqa: E402
from tokentui.core.model.quant.fused_linear import fuse_siblings  # noqa: E402
from tokentui.core.model.load.loader import LoadedModel, load_model, model_facts  # noqa: E402
from tokentui.core.model.speed import SpeedOptions  # noqa: E402
from tokentui.core.runs.events import StepEvent  # noqa: E402
from tokentui.core.settings import RunOptions, SamplerSettings  # noqa: E402

# ATen ops that launch nothing on a GPU (metadata only)
_NO_LAUNCH = {"aten::view", "aten::reshape", "aten::_reshape_alias", "aten::unsqueeze", "aten::squeeze",
              "aten::expand", "aten::as_strided", "aten::t", "aten::transpose", "aten::permute", "aten::slice",
              "aten::select", "aten::alias", "aten::detach", "aten::lift_fresh", "aten::empty", "aten::empty_like",
              "aten::empty_strided", "aten::resolve_conj", "aten::resolve_neg", "aten::_unsafe_view",
              "aten::result_type", "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::numpy_T",
              "aten::split", "aten::chunk", "aten::unbind", "aten::narrow", "aten::contiguous", "aten::view_as",
              "aten::flatten", "aten::_nested_tensor_from_mask_left_aligned", "aten::lift", "aten::set_"}


def _is_op(name: str) -> bool:
    """A dispatched op of any namespace: aten::, and what inductor calls instead (mkldnn::, mkl::, quantized::,
    a custom op's own namespace)."""
    return "::" in name and not name.startswith(("##", "profiler::"))


def _kernels(prof, names: Counter | None = None) -> int:
    """Kernels in `prof`; `names` (when given) counts them by name."""
    events = prof.events()
    count = 0
    for event in events:
        name = event.name
        if "cpp_" in name and "::" not in name:  # an inductor-generated kernel: "graph_0_cpp_fused_..."
            pass
        elif not _is_op(name) or name in _NO_LAUNCH:
            continue
        elif any(_is_op(child.name) and child.name not in _NO_LAUNCH for child in event.cpu_children):
            continue  # a composite op: its children are the launches
        count += 1
        if names is not None:
            names[name] += 1
    return count


def tiny_smollm(tokenizer):
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=192,
                                      num_hidden_layers=30, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=2048, tie_word_embeddings=True,
                                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = transformers.LlamaForCausalLM(config).eval()
    model.config.architectures = ["LlamaForCausalLM"]
    return model


def _engine_step_kernels(loaded, compile: bool, steps: int, settings: SamplerSettings,
                         names: Counter | None = None) -> tuple[float, float]:
    """(kernels per decode step, compile seconds) of the engine's run, profiling `steps` decode steps; `names`
    (when given) counts the kernels by name, over all profiled steps."""
    started = time.perf_counter()
    if compile:
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    engine = Engine(loaded, settings, RunOptions(max_new_tokens=steps + 8, ignore_eos=True),
                    speed=SpeedOptions(compile=compile, kv_shapes="dynamic"))
    compile_s = time.perf_counter() - started
    list(engine.run("Hi"))  # warm
    run = engine.run("Hi")
    for event in run:  # up to the 8th step, then profile the rest
        if isinstance(event, StepEvent) and event.index == 7:
            break
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        seen = sum(1 for event in run if isinstance(event, StepEvent))
    return _kernels(prof, names) / seen, compile_s


def _generate_step_kernels(model, prompt_ids: list[int], steps: int) -> float:
    """generate's kernels per decode step: (N + steps tokens) - (N tokens) profiles, so prefill and setup cancel."""
    x = torch.tensor([prompt_ids])

    def count(n: int) -> int:
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
            model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, eos_token_id=-1)
        return _kernels(prof)

    count(2)  # warm
    return (count(8 + steps) - count(8)) / steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("tiny", "embedded"), default="tiny")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    base = load_model(None, device="cpu", dtype="float32")  # the float model (the GPU path is a float one)
    model = base.model if args.model == "embedded" else tiny_smollm(base.tokenizer)
    loaded = LoadedModel(model=model, tokenizer=base.tokenizer,
                         facts=model_facts(model, base.tokenizer, name=args.model))
    prompt_ids = base.tokenizer("Hi")["input_ids"]
    greedy = SamplerSettings(temperature=0)
    result = {"model": args.model, "steps": args.steps,
              "generate": _generate_step_kernels(model, prompt_ids, args.steps)}
    sampling = SamplerSettings(temperature=0.7, top_k=40, top_p=0.9)
    result["eager"], _ = _engine_step_kernels(loaded, False, args.steps, greedy)
    result["eager_sampling"], _ = _engine_step_kernels(loaded, False, args.steps, sampling)
    fused = LoadedModel(model=copy.deepcopy(model), tokenizer=base.tokenizer, facts=loaded.facts)
    fuse_siblings(fused.model)  # what the engine does on CUDA (core/model/quant/fused_linear.py)
    result["eager_fused"], _ = _engine_step_kernels(fused, False, args.steps, greedy)
    result["eager_sampling_fused"], _ = _engine_step_kernels(fused, False, args.steps, sampling)
    if not args.no_compile:
        names: Counter = Counter()
        result["compiled"], result["compile_s"] = _engine_step_kernels(loaded, True, args.steps, greedy, names)
        result["compiled_kernels_per_step"] = {name: count / args.steps for name, count in names.most_common()}
        result["ratio_generate_to_compiled"] = result["generate"] / result["compiled"]
    print_and_save(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
