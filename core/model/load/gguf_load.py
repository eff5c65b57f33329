"""A GGUF model with its 4-bit matrices kept as stored (core/model/quant/gguf_quant.py, core/model/quant/qlinear.py): converted
once per file, torch build, CPU kind and 4-bit kernel (core/model/quant/int4_kernel.py), then loaded from the cache in
about a second.

First start: the tokenizer and config come from transformers' GGUF reader (as for the float32 path); the tensors
are read one by one by core/model/load/gguf_plan.py (`plan_gguf`, following transformers' own GGUF loop): a 4-bit
matrix of an `nn.Linear` (and a 4-bit or Q8_0 LM head) is read as 4-bit values and scales and packed for the kernel
here (`build_modules`); every other tensor is de-quantized exactly as transformers does. The model is built with its
parameters on the meta device (gguf_plan._skeleton: accelerate's init_empty_weights; buffers such as rotary
frequencies are made for real), the 4-bit modules put in place of the Linear layers, the float tensors assigned
(`assemble`). Before any of this the file's metadata is checked against its tensor table
(core/model/load/gguf_check.py), and the model built is cached only once its first pass gives finite scores
(core/model/load/model_cache.py). The packed tensors, the float tensors, the config, the tokenizer and a manifest are
saved together; later starts read those and build the same modules with no GGUF parsing (where the cache cannot be
written, the model runs from memory, with a notice). This module holds the cache, the load and the model facts'
account of the 4-bit weights (`quant_facts`).

Why a cache of packed tensors rather than the file: reading the blocks and packing them takes ~1.5 s for
SmolLM2-135M on this machine, and transformers' GGUF tokenizer and config conversion ~3 s more, every start.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ...errors import ModelLoadError, error_line
from ...runs.events import LoadProgress
from ..quant.gguf_quant import FOUR_BIT, GROUP
from .gguf_check import check_gguf, checked_reader, reading
from .gguf_plan import Plan, _skeleton, plan_gguf, read_config
from .tokenizer_cache import cached_tokenizer, save_tokenizer, settled
from .model_cache import STAGE_GGUF_TOKENIZER, STAGE_WEIGHTS, Progress, check_first_pass, write_cache
from .packed_folder import FORMAT, cached_folder
from ..native.native_step import decode_step_for
from ..native import q4_native
from ..quant.int4_kernel import Int4Kernel
from ..quant.qlinear import KERNELS, FusedQLinear, QLinear, QLMHead, chosen_kernel, kernel_available, wants_native

STAGE_PACK = "packing {matrices} 4-bit matrices for the {kernel} kernel (first start only)"
STAGE_SAVE = "saving the packed weights (first start only)"


def quantizable_gguf(path: Path) -> bool:
    """Whether the file has any 4-bit tensor: yes when its 4-bit cache is there (a later start), else a look at its
    tensor table (no tensor data read, but gguf-py parses all the metadata: ~3 s for a 49k-token vocabulary), the
    file checked on the way (core/model/load/gguf_check.py: ModelLoadError when its metadata and tensors disagree)."""
    if any((cached_folder(path, kernel) / ".complete").is_file() for kernel in KERNELS.values()):
        return True
    return any(t.tensor_type.name in FOUR_BIT for t in checked_reader(path).tensors)


# ---------------------------------------------------------------------------------------------- the model
def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _bias(floats: dict, module: str):
    return floats.pop(f"{module}.bias", None)


def assemble(skeleton: nn.Module, modules: dict[str, nn.Module], floats: dict[str, torch.Tensor]) -> nn.Module:
    """Put the 4-bit modules in place and assign the float tensors; every parameter must then be real."""
    for name, module in modules.items():
        _set(skeleton, name, module)
    skeleton.load_state_dict(floats, strict=False, assign=True)
    out = skeleton.get_output_embeddings()
    if isinstance(getattr(out, "weight", None), nn.Parameter) and out.weight.is_meta:
        # A tied file (no output.weight) whose embedding is not a 4-bit head (Q6_K in a Q4_K_M or Q4_0 file): the
        # head is a plain Linear, and assign=True gave the embedding a new Parameter, leaving the head's tied one on
        # the meta device; transformers ties it again to the table just assigned (where the config says tied).
        skeleton.tie_weights()
    still_meta = [n for n, p in skeleton.named_parameters() if p.is_meta]
    if still_meta:
        raise ModelLoadError(f"the GGUF file has no tensor for {still_meta[0]} (and {len(still_meta) - 1} more): "
                             "it does not match its own architecture; pass --dtype float32 to load it as "
                             "transformers does")
    head = skeleton.get_output_embeddings()
    if isinstance(head, QLMHead) and head.tied:
        head.tie(skeleton.get_input_embeddings().weight)  # the same Parameter: the model stays tied
    skeleton.eval()
    return skeleton


def build_modules(plan: Plan, kernel: Int4Kernel, *, fuse: bool = True
                  ) -> tuple[dict[str, nn.Module], dict[str, torch.Tensor]]:
    """(the 4-bit modules for `plan` by the name of the module each replaces, fused parts included; the float
    tensors left for the rest of the model: the 4-bit modules' biases and a separate head's float rows are theirs).
    `plan` is not changed, so one plan can build several models (benchmarks/bench_quant.py: fused and not)."""
    modules: dict[str, nn.Module] = {}
    floats = dict(plan.floats)
    grouped = {name for group in plan.groups for name in group} if fuse else set()
    for group in (plan.groups if fuse else []):
        fused = FusedQLinear.from_matrices([plan.matrices[name] for name in group], kernel)
        parent = group[0].rpartition(".")[0]
        modules[f"{parent}.fused_{'_'.join(n.rpartition('.')[2] for n in group)}"] = fused
        for name, part in zip(group, fused.parts([_bias(floats, n) for n in group])):
            modules[name] = part
    for name, matrix in plan.matrices.items():
        if name in grouped:
            continue
        if name == plan.head:
            weight = None if plan.tied_head else nn.Parameter(floats.pop(f"{name}.weight"), requires_grad=False)
            modules[name] = QLMHead.from_matrix(matrix, bias=_bias(floats, name), weight=weight, kernel=kernel)
        else:
            modules[name] = QLinear.from_matrix(matrix, bias=_bias(floats, name), kernel=kernel)
    return modules, floats


# ---------------------------------------------------------------------------------------------- the cache
def _manifest(modules: dict[str, nn.Module], plan: Plan, kernel: Int4Kernel) -> dict:
    """What `_modules_from` needs to rebuild `modules` from the saved tensors (and what the model facts say)."""
    entries = []
    for name, module in modules.items():
        if isinstance(module, FusedQLinear):
            parts = [n for n, m in modules.items() if getattr(m, "fused", None) is module]
            entries.append({"kind": "fused", "name": name, "parts": parts, "widths": module.widths,
                            "in": module.in_features, "source": module.source,
                            "bias": [modules[p].bias is not None for p in parts]})
        elif isinstance(module, QLinear):
            entries.append({"kind": "head" if isinstance(module, QLMHead) else "linear", "name": name,
                            "in": module.in_features, "out": module.out_features, "source": module.source,
                            "halves": module.halves, "bias": module.bias is not None,
                            "tied": bool(getattr(module, "tied", False))})
    return {"format": FORMAT, "kernel": kernel.name, "modules": entries, "dequantized": plan.dequantized}


def _tensors(modules: dict[str, nn.Module], floats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {f"float.{name}": tensor.contiguous() for name, tensor in floats.items()}
    for name, module in modules.items():
        if isinstance(module, (QLinear, FusedQLinear)):
            out[f"packed.{name}"], out[f"scale_zeros.{name}"] = module.packed, module.scale_zeros
        if getattr(module, "bias", None) is not None:
            out[f"bias.{name}"] = module.bias.data
        if isinstance(module, QLMHead) and not module.tied:
            out[f"rows.{name}"] = module.weight.data
    return out


def _modules_from(manifest: dict, tensors: dict[str, torch.Tensor]) -> dict[str, nn.Module]:
    modules: dict[str, nn.Module] = {}
    kernel = KERNELS[manifest["kernel"]]
    for entry in manifest["modules"]:
        name = entry["name"]
        packed, scale_zeros = tensors[f"packed.{name}"], tensors[f"scale_zeros.{name}"]
        if entry["kind"] == "fused":
            fused = FusedQLinear(packed, scale_zeros, entry["in"], entry["widths"], entry["source"], kernel)
            modules[name] = fused
            biases = [tensors.get(f"bias.{part}") for part in entry["parts"]]
            for part_name, part in zip(entry["parts"], fused.parts(biases)):
                modules[part_name] = part
        else:
            kwargs = dict(source=entry["source"], kernel=kernel, halves=entry["halves"], bias=tensors.get(f"bias.{name}"))
            if entry["kind"] == "head":
                rows = tensors.get(f"rows.{name}")
                weight = None if entry["tied"] else nn.Parameter(rows, requires_grad=False)
                modules[name] = QLMHead(entry["in"], entry["out"], packed, scale_zeros, weight=weight, **kwargs)
            else:
                modules[name] = QLinear(entry["in"], entry["out"], packed, scale_zeros, **kwargs)
    return modules


def _save(target: Path, source: Path, config, generation_config, tokenizer, manifest: dict,
          tensors: dict) -> str | None:
    """Cache the conversion (core/model/load/model_cache.py's write_cache: None, or why the cache is off)."""
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        config.save_pretrained(tmp)
        if generation_config is not None:
            generation_config.save_pretrained(tmp)
        save_tokenizer(tmp, tokenizer)  # with whether a later start may read it without transformers
        save_file(tensors, str(tmp / "weights.safetensors"))
        (tmp / "manifest.json").write_text(json.dumps(manifest))

    return write_cache(target, write, source)


@dataclass
class QuantizedLoad:
    model: nn.Module
    tokenizer: object
    manifest: dict
    converted: bool  # True on the first start (the GGUF was read here), False from the cache
    notice: str | None = None  # why the conversion was not cached (a cache folder that cannot be written)


def load_quantized(path: Path, progress: Progress = lambda _: None, *, fuse: bool = True) -> QuantizedLoad:
    """The GGUF at `path` with its 4-bit matrices as stored (see the module docstring); CPU only."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    if not kernel_available():
        raise ModelLoadError(f"this torch ({torch.__version__}) has no int4 CPU kernel; pass --dtype float32 "
                             "to de-quantize the GGUF instead")
    if wants_native():
        q4_native.load(progress)  # chosen_kernel says why not, if it does not load
    try:
        kernel = chosen_kernel()
    except ValueError as err:
        raise ModelLoadError(str(err)) from None
    target = cached_folder(path, kernel)
    if (target / ".complete").is_file() and (target / "manifest.json").is_file():
        progress(LoadProgress(STAGE_WEIGHTS, None))
        try:
            manifest = json.loads((target / "manifest.json").read_text())
            tensors = load_file(str(target / "weights.safetensors"))
            model = _skeleton(AutoConfig.from_pretrained(target))
            floats = {k.removeprefix("float."): v for k, v in tensors.items() if k.startswith("float.")}
            model = assemble(model, _modules_from(manifest, tensors), floats)
            tokenizer = cached_tokenizer(target)
            decode_step_for(model)  # checked now, while loading, rather than before the first run's prefill
            return QuantizedLoad(model, tokenizer, manifest, converted=False)
        except ModelLoadError:
            raise
        except Exception:  # a damaged cache: convert again below
            shutil.rmtree(target, ignore_errors=True)
    folder, name = str(path.parent), path.name
    check_gguf(path)  # its metadata against its tensors, before anything is built from them
    with reading(path):
        progress(LoadProgress(STAGE_GGUF_TOKENIZER, None))
        tokenizer = settled(AutoTokenizer.from_pretrained(folder, gguf_file=name))  # as later starts read it
        config = read_config(path)
        model = _skeleton(config)
        plan = plan_gguf(path, model, progress)
    progress(LoadProgress(STAGE_PACK.format(matrices=len(plan.matrices), kernel=kernel.name), None))
    modules, floats = build_modules(plan, kernel, fuse=fuse)
    manifest = _manifest(modules, plan, kernel)
    tensors = _tensors(modules, floats)
    try:
        model = assemble(model, modules, floats)
    except RuntimeError as err:  # load_state_dict: a tensor whose shape the config does not give
        raise ModelLoadError(f"{path}: corrupt GGUF file: its tensors do not fit its own metadata "
                             f"({error_line(err)}); download it again or pass another --model") from err
    decode_step_for(model)
    check_first_pass(model, tokenizer, path)  # cached only once its first scores are numbers
    progress(LoadProgress(STAGE_SAVE, None))
    notice = _save(target, path, config, getattr(model, "generation_config", None), tokenizer, manifest, tensors)
    return QuantizedLoad(model, tokenizer, manifest, converted=True, notice=notice)


def quant_facts(model: nn.Module, manifest: dict):
    """The model event's account of the 4-bit weights (ModelFacts.quantization)."""
    from ...runs.facts import QuantFacts
    from ..quant.qlinear import step_weight_bytes

    entries, kernel = manifest["modules"], KERNELS[manifest["kernel"]]
    sources = sorted({part for e in entries if e["kind"] != "head" for part in e["source"].split("+")})
    head = next((e for e in entries if e["kind"] == "head"), None)
    if head is None:
        head_words = "float (its block type is not 4-bit)"
    elif head["halves"]:
        head_words = f"{head['source']} as two 4-bit halves" if kernel.eight_bit_halves else f"{head['source']} 8-bit"
    else:
        head_words = f"{head['source']} 4-bit"
    exact = 0
    out = model.get_output_embeddings()
    if isinstance(out, QLMHead) and out.exact_scores:
        exact = out.exact_scores
        head_words += f"; its {exact} highest scores recomputed in float32"
    count = sum(len(e["parts"]) if e["kind"] == "fused" else 1 for e in entries)
    return QuantFacts(blocks="+".join(sources) or (head["source"] if head else ""), bits=4, group=GROUP,
                      scale_dtype=str(kernel.scale_dtype).removeprefix("torch."),
                      activation_dtype=kernel.activations, head=head_words,
                      kernel=kernel.name,
                      exact_scores=exact, matrices=count, dequantized=len(manifest.get("dequantized", {})),
                      dequantized_blocks="+".join(sorted(set(manifest.get("dequantized", {}).values()))),
                      weight_bytes=step_weight_bytes(model))
