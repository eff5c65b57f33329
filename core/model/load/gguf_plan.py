"""The first start's reading of a GGUF for the packed 4-bit path (core/model/load/gguf_load.py): transformers' config
of the file (`read_config`), the model skeleton on the meta device (`_skeleton`), and the plan of its tensors
(`plan_gguf`): every tensor read one by one, following transformers' own GGUF loop (`load_gguf_checkpoint`: its name
map and tensor processor for the architecture), a 4-bit matrix of an `nn.Linear` (and a 4-bit or Q8_0 LM head) read
as 4-bit values and scales, every other tensor de-quantized exactly as transformers does, and the sibling
projections that read one input grouped for fusing. `with_progress` is both GGUF loaders' reading loop
(gguf_load.py and gguf_stored.py).

Building the 4-bit modules from a plan, the cache of packed tensors and the load itself: gguf_load.py.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...runs.events import LoadProgress
from ..quant.gguf_quant import FOUR_BIT, GROUP, SPLIT_EIGHT_BIT, GroupedInt4, read_blocks, row_order
from .gguf_reader import fast_reader
from .model_cache import Progress

FUSE = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # siblings that read one input
STAGE_READ = "reading the GGUF's 4-bit blocks and de-quantizing the rest (first start only)"


@dataclass
class Plan:
    """What the conversion found: per module name the 4-bit matrix, the float tensors by parameter name, the fused
    groups (lists of module names), the head's module name if it is 4-bit, and the matrices left de-quantized."""

    matrices: dict[str, GroupedInt4] = field(default_factory=dict)
    floats: dict[str, torch.Tensor] = field(default_factory=dict)
    groups: list[list[str]] = field(default_factory=list)
    head: str | None = None
    tied_head: bool = False
    dequantized: dict[str, str] = field(default_factory=dict)  # weight name -> block type, 2-D weights only


def read_config(path: Path, reader=None):
    """transformers' config of the GGUF at `path` (`reader`: its GGUFReader, parsed here if None), with the head
    size the file states (`<arch>.attention.key_length`): transformers' GGUF reader does not map it, so a Qwen3
    file whose heads are not 128 wide got Qwen3Config's default 128 and a model its tensors do not fit."""
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import read_field

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    reader = reader if reader is not None else fast_reader(path)
    field = reader.fields.get(f"{read_field(reader, 'general.architecture')[0]}.attention.key_length")
    if field is not None and getattr(config, "head_dim", None) is not None:
        config.head_dim = int(field.parts[field.data[0]][0])
    return config


def _skeleton(config):
    """The model with its parameters on the meta device and its buffers real (computed from the config)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False), _no_init_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model


@contextlib.contextmanager
def _no_init_on_meta():
    """transformers' weight initialization (post_init) made a no-op on meta tensors meanwhile: it draws nothing
    there, yet its ~200 calls on a Qwen3-0.6B skeleton took most of the skeleton's time at every start
    (BENCHMARKS.md, issue 37's cold start, measures it). Its initializers look up torch's functions in
    transformers.initialization.TORCH_INIT_FUNCTIONS at each call, so those entries are wrapped here and put back
    after; real tensors (the buffers, such as the rotary frequencies it recomputes) are initialized as before. Why
    not transformers' own no_init_weights: it skips init_weights whole, the weights' tying and the buffers'
    initialization too. Where that table has moved (another transformers), nothing is wrapped and the skeleton is
    built as before, only slower."""
    try:
        from transformers import initialization
        table = initialization.TORCH_INIT_FUNCTIONS
    except (ImportError, AttributeError):
        table = None
    if not isinstance(table, dict):
        yield
        return
    saved = dict(table)

    def skipping_meta(function):
        def init(tensor, *args, **kwargs):
            return tensor if getattr(tensor, "is_meta", False) else function(tensor, *args, **kwargs)
        return init

    try:
        table.update({name: skipping_meta(function) for name, function in saved.items()})
        yield
    finally:
        table.update(saved)


def _module_name(model: nn.Module, module: nn.Module | None) -> str | None:
    if module is None:
        return None
    return next((name for name, m in model.named_modules() if m is module), None)


def plan_gguf(path: Path, skeleton: nn.Module, progress: Progress = lambda _: None) -> Plan:
    """Read every tensor of `path` for `skeleton` (see the module docstring)."""
    from gguf import GGUFReader, dequantize
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                          get_gguf_hf_weights_map, load_gguf_checkpoint, read_field)

    parsed = load_gguf_checkpoint(str(path), return_tensors=False)
    reader = GGUFReader(str(path))
    architecture = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed["config"])
    mapping = get_gguf_hf_weights_map(skeleton, processor)
    plan = Plan()
    parsed["tensors"] = plan.floats  # processors that split tensors (MoE experts) write there, as in transformers
    embed = _module_name(skeleton, skeleton.get_input_embeddings())
    head = _module_name(skeleton, skeleton.get_output_embeddings())
    tied = bool(getattr(skeleton.config, "tie_word_embeddings", False))
    for tensor in with_progress(reader.tensors, STAGE_READ, progress):
        kind, name = tensor.tensor_type.name, tensor.name
        hf = mapping.get(name, "")
        module = hf.removesuffix(".weight") if hf.endswith(".weight") else None
        as_head = head is not None and module is not None and (module == head or (tied and module == embed))
        matrix = _four_bit(tensor, kind, module, skeleton, processor, as_head, mapping, parsed)
        if matrix is not None and module == embed:  # a tied head: the table is also needed as floats
            plan.matrices[head], plan.head, plan.tied_head = matrix, head, True
        elif matrix is not None:
            plan.matrices[module] = matrix
            if module == head:
                plan.head = head
            if module != head:
                continue
        weights = dequantize(tensor.data, tensor.tensor_type)
        result = processor.process(weights=weights, name=name, tensor_key_mapping=mapping, parsed_parameters=parsed)
        if result.name in mapping:
            target = mapping[result.name]
            plan.floats[target] = torch.from_numpy(np.copy(result.weights)).to(torch.float32)
            if result.weights.ndim == 2 and kind not in ("F32", "F16", "BF16"):
                plan.dequantized[target] = kind
    plan.groups = _groups(skeleton, plan)
    return plan


def _four_bit(tensor, kind: str, module: str | None, skeleton, processor, as_head: bool, mapping,
              parsed) -> GroupedInt4 | None:
    """The tensor as a 4-bit matrix for `module`, or None when it must be de-quantized (see gguf_quant.py)."""
    if module is None or not (kind in FOUR_BIT or (as_head and kind in SPLIT_EIGHT_BIT)):
        return None
    target = skeleton.get_submodule(module)
    if not as_head and type(target) is not nn.Linear:
        return None
    cols, rows = (int(n) for n in tensor.shape[:2])  # gguf lists dimensions innermost first
    if len(tensor.shape) != 2 or rows % 16 or cols % GROUP or target.weight.shape != (rows, cols):
        return None
    order = row_order(processor, tensor.name, rows, tensor_key_mapping=mapping, parsed_parameters=parsed)
    if order is None:
        return None
    matrix = read_blocks(kind, tensor.data, rows, cols)
    return matrix if np.array_equal(order, np.arange(rows)) else matrix.rows(order)


def with_progress(tensors, stage: str, progress: Progress):
    """The file's tensors in order, saying `stage` with the fraction of their bytes passed at every 1%, and 1.0 at
    the end (both GGUF loaders' reading loop)."""
    total = max(sum(int(t.n_bytes) for t in tensors), 1)
    done, sent = 0, -1.0
    for tensor in tensors:
        if done / total - sent >= 0.01:
            sent = done / total
            progress(LoadProgress(stage, sent))
        done += int(tensor.n_bytes)
        yield tensor
    progress(LoadProgress(stage, 1.0))


def _groups(skeleton: nn.Module, plan: Plan) -> list[list[str]]:
    """Sibling 4-bit projections that read one input (FUSE), same input size and block type."""
    groups = []
    for parent, _ in skeleton.named_modules():
        for names in FUSE:
            members = [f"{parent}.{n}" if parent else n for n in names]
            found = [plan.matrices.get(m) for m in members]
            if all(m is not None for m in found) and len({(m.in_features, m.source, m.halves) for m in found}) == 1:
                groups.append(members)
    return groups
