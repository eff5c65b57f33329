"""A GGUF run as stored: every matrix of an `nn.Linear`, the input embedding and the LM head stays the file's own
bytes, memory-mapped (no copy, no de-quantized float32 matrix), and is multiplied by ggml's own CPU kernels
(core/model/quant/ggml_linear.py's GGMLLinear / GGMLEmbedding over a GGMLMatrix; core/model/native/ggml_build.py
builds llama.cpp's libggml-cpu). This is how llama.cpp itself loads a file.

Each start: the file is checked and parsed once (core/model/load/gguf_check.py's checked_reader, gguf-py's GGUFReader
with the vocabulary's arrays skimmed: its tensors are views of one read-only memory map); the config and the
tokenizer come from transformers' GGUF reader on a first start only, the model's first pass is checked then
(model_cache.check_first_pass) and so is the ggml decode step against the forward (its verdict kept with the
libraries it held for: a later start with the same ones takes it), and they are cached under
`cache_dir()/stored/<key>` (the file's identity: path, size, mtime, transformers' version; stored_folder.py), because
converting the vocabulary takes seconds (151k entries for Qwen); the model is built on the meta device
(gguf_plan._skeleton) and each GGUF tensor named for its parameter as transformers names it (`get_gguf_hf_weights_map` and the architecture's
TensorProcessor, as gguf_plan.plan_gguf does):

    2-D weight of an nn.Linear, the input embedding,     a GGMLLinear / GGMLEmbedding over the mapped bytes; rows
    the LM head (in a block type ggml runs)              the processor permutes (llama's q/k) are the one copy
    tied head (no output.weight)                         a GGMLLinear over the embedding's same GGMLMatrix
    1-D tensors (norms, biases)                          de-quantized to float32 (small)
    a type ggml cannot run, or a tensor the processor    de-quantized to float32 as transformers does, and counted
    changes beyond a row order, or any other tensor      in the model facts (with its bytes)

The model facts' account of the weights: core/model/load/gguf_stored_facts.py. A later start whose cache folder holds
the first start's placement, facts and step verdict builds no transformers' model at all (`StoredLoad.direct`:
core/model/load/gguf_direct.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...errors import ModelLoadError
from ...runs.events import LoadProgress
from ...runs.facts import ModelFacts
from ..quant.gguf_quant import FOUR_BIT, SPLIT_EIGHT_BIT
from .gguf_check import checked_reader, reading
from .gguf_direct import (FACTS, DirectModel, Placement, StepShape, full_config, read_facts, rope_agrees,
                          save_facts)
from .gguf_plan import _skeleton, read_config, with_progress
from .tokenizer_cache import cached_tokenizer, save_tokenizer, settled
from .model_cache import STAGE_GGUF_TOKENIZER, Progress, check_first_pass, write_cache, write_whole
from .stored_folder import cached_folder

STAGE_CACHED = "reading the cached tokenizer and config"
STAGE_MAP = "mapping the GGUF's {tensors} tensors as stored"
STEP_VERDICT = "ggml_step.json"  # the first start's verdict on the ggml step, and the libraries it held for
FOUR_BIT_PACKED = FOUR_BIT  # the types the packed path's own kernels run (gguf_load.py)


@dataclass
class StoredLoad:
    """A GGUF loaded as stored: the model, its tokenizer, the de-quantized 2-D tensors (HF name -> (block type, the
    float32 bytes they now take)), and why the config / tokenizer were not cached (None: cached, or read from it).
    A later start that needs no transformers' model (core/model/load/gguf_direct.py) has `model` None, `direct` its
    step and the model built on demand, and `facts` the first start's."""

    model: nn.Module | None
    tokenizer: object
    dequantized: dict[str, tuple[str, int]] = field(default_factory=dict)
    notice: str | None = None
    from_cache: bool = False
    direct: DirectModel | None = None
    facts: ModelFacts | None = None


def packed_serves(reader) -> bool:
    """Whether tokentui's own 4-bit kernels (the packed path, gguf_load.py) serve the file: every 2-D matrix of its
    blocks (`blk.N.`) is Q4_0, Q4_1 or Q4_K, and so is its head (`output.weight`, or the embedding a tied head reads),
    or Q8_0 (held as two 4-bit halves). A head in another type (the Q6_K `token_embd` of a small tied model's Q4_0
    file) would be de-quantized there into a float32 matrix read whole every step (622 MB at Qwen3-0.6B's 151,936
    rows): such a file runs as stored, its head on ggml's kernel for its type."""
    matrices = [t for t in reader.tensors if t.name.startswith("blk.") and len(t.shape) == 2]
    by_name = {t.name: t for t in reader.tensors}
    head = by_name.get("output.weight") or by_name.get("token_embd.weight")
    return (bool(matrices) and all(t.tensor_type.name in FOUR_BIT_PACKED for t in matrices)
            and head is not None and head.tensor_type.name in (*FOUR_BIT_PACKED, *SPLIT_EIGHT_BIT))


def huge_page_bytes(reader) -> int:
    """At most what a stored load of `reader`'s file copies into huge-page memory (ggml_linear's resident and
    repacked copies): its blocks' 2-D weights and its head (`output.weight`, or the embedding a tied head reads) in
    the formats ggml runs. A reservation of this many bytes (ggml_linear.reserve_huge_pages) is trimmed to what was
    used once the model is placed."""
    from ..quant.ggml_linear import RUNNABLE

    names = {t.name for t in reader.tensors}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    return sum(int(t.n_bytes) for t in reader.tensors
               if len(t.shape) == 2 and t.tensor_type.name in RUNNABLE
               and (t.name == head or (t.name.startswith("blk.") and t.name.endswith(".weight"))))


def _verdict(target: Path) -> dict | None:
    """The cache folder's verdict on the ggml step (written on the file's first start, once compared with the
    forward) where it accepted the step with the libraries bound now; None otherwise (another build, or no verdict:
    the comparison is made again)."""
    from ..native.ggml_native import libraries

    try:
        verdict = json.loads((target / STEP_VERDICT).read_text())
    except (OSError, ValueError):
        return None
    accepted = isinstance(verdict, dict) and verdict.get("accepted") is True \
        and verdict.get("libraries") == libraries()
    return verdict if accepted else None


def _direct(target: Path, reader, progress: Progress) -> tuple[DirectModel, ModelFacts] | None:
    """The step made from the file's tensors without transformers' model (core/model/load/gguf_direct.py), with the
    first start's facts, where the cache folder has all a later start needs for it; None: load as the first start
    does."""
    verdict = _verdict(target)
    shape = StepShape.from_dict(verdict.get("shape")) if verdict is not None else None
    if shape is None or verdict.get("rope") is not True:
        return None
    placement, facts = Placement.read(target), read_facts(target)
    if placement is None or facts is None:
        return None
    progress(LoadProgress(STAGE_MAP.format(tensors=len(reader.tensors)), None))
    try:
        return DirectModel(reader, placement, shape, target), facts
    except ValueError:  # the placement does not cover the step (a family or file it was not made for)
        return None


def _keep_verdict(target: Path, config):
    """What the first start keeps once the ggml step is compared with the forward: the verdict, the libraries, and
    for a later start without transformers' model the step's shape and whether the rope table agrees."""
    from ..native.ggml_native import libraries

    def keep(accepted: bool, step) -> None:
        write_whole(target / STEP_VERDICT, json.dumps({"libraries": libraries(), "accepted": accepted,
                                                     "shape": StepShape.of(step).to_dict(),
                                                     "rope": rope_agrees(step, config)}))
    return keep


def _cached_tokenizer(target: Path):
    """The tokenizer of a complete cache folder, for a later start without transformers' model; None where it cannot
    be read (the start then goes on as `_cached` does, which reads it again or converts the file again)."""
    try:
        return cached_tokenizer(target)
    except Exception:  # read again, or converted again, by `_cached`
        return None


def _cached(target: Path, progress: Progress, said: bool = False):
    """(config, tokenizer) from a complete cache folder, or None (absent, or damaged: removed). `said`: the stage was
    sent already (by `load_stored`, before it tried a start without transformers' model)."""
    from transformers import AutoConfig

    if not (target / ".complete").is_file():
        return None
    if not said:
        progress(LoadProgress(STAGE_CACHED, None))
    try:
        return AutoConfig.from_pretrained(target), cached_tokenizer(target)
    except Exception:  # a damaged cache: converted again
        shutil.rmtree(target, ignore_errors=True)
        return None


def load_stored(path: Path, progress: Progress = lambda _: None, reader=None) -> StoredLoad:
    """The GGUF at `path` with its matrices as stored (the module docstring); CPU only. `reader`: the file's
    checked GGUFReader when the caller has one (the routing in loader.py parsed it already). ggml's library must
    be bound first (ggml_linear.load); a bad file is one line (ModelLoadError). A later start whose cache folder
    holds what core/model/load/gguf_direct.py needs builds no transformers' model (`StoredLoad.direct`)."""
    from ..native.ggml_native import trust, when_compared

    reader = reader if reader is not None else checked_reader(path)  # checked against its own tensor table
    target = cached_folder(path)
    later = (target / ".complete").is_file() and (target / FACTS).is_file()
    if later:  # the tokenizer read on a thread while the step's matrices are placed (ggml's copies free the GIL)
        progress(LoadProgress(STAGE_CACHED, None))
        with reading(path), ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokentui-tokenizer") as pool:
            tokenizer = pool.submit(_cached_tokenizer, target)
            direct = _direct(target, reader, progress)
            tokenizer = tokenizer.result()
        if tokenizer is not None and direct is not None:
            return StoredLoad(None, tokenizer, from_cache=True, direct=direct[0], facts=direct[1])
    found = _cached(target, progress, said=later)
    with reading(path):
        if found is None:
            from transformers import AutoTokenizer

            progress(LoadProgress(STAGE_GGUF_TOKENIZER, None))
            folder, name = str(path.parent), path.name
            tokenizer = settled(AutoTokenizer.from_pretrained(folder, gguf_file=name))  # as later starts read it
            config = read_config(path, reader)
        else:
            config, tokenizer = found
        model = _skeleton(config)
        placement = Placement()
        dequantized = place_stored(reader, model, progress, placement)
    notice = None
    if found is None:
        # A file whose first scores are not numbers is refused before its config and tokenizer are cached; a later
        # start (the cache's key: the file's path, size and mtime) trusts it, as the packed path's cache does, rather
        # than pay at every start a forward over every weight that the run's own prefill then pays again. So too
        # the ggml step's comparison with the forward (ggml_native.close_to_forward), made when the decode plan
        # first asks for the step, its verdict then kept with the libraries it held for.
        check_first_pass(model, tokenizer, path)

        def write(tmp: Path) -> None:
            config.save_pretrained(tmp)
            save_tokenizer(tmp, tokenizer)  # with whether a later start may read it without transformers
            placement.save(tmp)

        notice = write_cache(target, write, path)
    if found is not None and _verdict(target) is not None:
        trust(model)
    else:  # a first start, a cache kept before verdicts were, or a verdict for other libraries: kept once compared
        when_compared(model, _keep_verdict(target, config))
    return StoredLoad(model, tokenizer, dequantized, notice=notice, from_cache=found is not None)


def keep_facts(path: Path, facts: ModelFacts) -> None:
    """The model facts of `path`'s first start (or of a start that loaded it as the first does), kept in its cache
    folder for a later start without transformers' model; nothing where the folder is not there (not cached)."""
    target = cached_folder(path)
    if (target / ".complete").is_file() and not (target / FACTS).is_file():
        save_facts(target, facts)


# ---------------------------------------------------------------------------------------------- the tensors
def _module_name(model: nn.Module, module: nn.Module | None) -> str | None:
    if module is None:
        return None
    return next((name for name, m in model.named_modules() if m is module), None)


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


@contextlib.contextmanager
def _name_map_once():
    """transformers' get_gguf_hf_weights_map calls itself on every submodule, and each call builds gguf-py's whole
    tensor-name map for the architecture again (seconds for a 28-layer model, every start): for its duration, the
    map is built once per (architecture, layers) and shared (it is only read)."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def place_stored(reader, skeleton: nn.Module, progress: Progress = lambda _: None,
                 placement: Placement | None = None) -> dict[str, tuple[str, int]]:
    """Fill `skeleton` (parameters on the meta device) from `reader`'s tensors, in place: the modules of the module
    docstring's table. -> the 2-D tensors de-quantized instead (HF name -> (block type, float32 bytes)).
    `placement`: filled with where each tensor went (core/model/load/gguf_direct.py: what a later start reads)."""
    from gguf import dequantize
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                          get_gguf_hf_weights_map, read_field)

    from ..quant.ggml_linear import GGMLEmbedding, GGMLLinear

    architecture = read_field(reader, "general.architecture")[0]
    # the processor reads the HF config's names (num_attention_heads...), as transformers' own parse gives them
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=skeleton.config.to_dict())
    # the names the file's architecture gives its tensors (a Mistral file is "llama" in llama.cpp's names)
    with _name_map_once():
        mapping = get_gguf_hf_weights_map(skeleton, processor, model_type=architecture)
    floats: dict[str, torch.Tensor] = {}
    parsed = {"config": skeleton.config.to_dict(), "tensors": floats}  # processors that split tensors write there
    embed = _module_name(skeleton, skeleton.get_input_embeddings())
    head = _module_name(skeleton, skeleton.get_output_embeddings())
    matrices, dequantized = {}, {}
    placement = placement if placement is not None else Placement()
    placement.family, placement.config = type(skeleton).__name__, full_config(skeleton.config)
    for tensor in with_progress(reader.tensors, STAGE_MAP.format(tensors=len(reader.tensors)), progress):
        hf = mapping.get(tensor.name, "")
        module = hf.removesuffix(".weight") if hf.endswith(".weight") else None
        stored = _as_stored(tensor, skeleton, module, embed, head, processor, mapping, parsed)
        if stored is not None:
            matrices[module], order = stored
            placement.matrices[module] = tensor.name
            if order is not None:
                placement.orders[tensor.name] = order
            continue
        weights = dequantize(tensor.data, tensor.tensor_type)
        result = processor.process(weights=weights, name=tensor.name, tensor_key_mapping=mapping,
                                   parsed_parameters=parsed)
        if result.name in mapping:
            target = mapping[result.name]
            floats[target] = torch.from_numpy(np.array(result.weights, dtype=np.float32))
            if floats[target].dim() >= 2:
                dequantized[target] = (tensor.tensor_type.name, floats[target].nbytes)
            if floats[target].dim() == 1 and result.name == tensor.name \
                    and np.array_equal(np.asarray(result.weights), np.asarray(weights)):
                placement.floats[target] = tensor.name  # as the file stores it: a later start reads it itself
            else:
                placement.changed.append(target)
    for name, matrix in matrices.items():
        if name == embed:
            _set(skeleton, name, GGMLEmbedding(matrix))
        else:
            _set(skeleton, name, GGMLLinear(matrix, bias=floats.pop(f"{name}.bias", None)))
    tied = head is not None and head not in matrices and f"{head}.weight" not in floats
    if tied and embed in matrices:  # no output.weight: the head multiplies by the embedding's own stored matrix
        _set(skeleton, head, GGMLLinear(matrices[embed], bias=floats.pop(f"{head}.bias", None)))
        placement.tied_head = True
    skeleton.load_state_dict(floats, strict=False, assign=True)
    out = skeleton.get_output_embeddings()
    if type(out) is nn.Linear and out.weight.is_meta:  # tied to a de-quantized embedding (a type ggml cannot run):
        skeleton.tie_weights()  # assign=True gave the embedding a new Parameter; transformers ties the head to it
    still_meta = [n for n, p in skeleton.named_parameters() if p.is_meta]
    if still_meta:
        raise ModelLoadError(f"the GGUF file has no tensor for {still_meta[0]} (and {len(still_meta) - 1} more): "
                             "it does not match its own architecture; pass --dtype float32 to load it as "
                             "transformers does")
    skeleton.eval()
    return dequantized


def _as_stored(tensor, skeleton: nn.Module, module: str | None, embed: str | None, head: str | None, processor,
               mapping, parsed):
    """(`tensor` as a GGMLMatrix over the file's bytes for `module`, its row order where the processor permutes
    its rows, else None), or None when it must be de-quantized: not the weight of an nn.Linear / the embedding / the
    head, a shape the module does not have, a processor that changes more than its row order, or a block type ggml
    does not run (GGMLMatrix refuses it)."""
    from ..quant.gguf_quant import row_order
    from ..quant.ggml_linear import GGMLMatrix

    if module is None or len(tensor.shape) != 2:
        return None
    target = skeleton.get_submodule(module)
    if not (type(target) is nn.Linear or (module == embed and type(target) is nn.Embedding)):
        return None  # (a subclass may do more than the product: Gemma's scaled embedding)
    cols, rows = (int(n) for n in tensor.shape)  # gguf lists dimensions innermost first
    weight = target._parameters.get("weight")  # the meta Parameter (its shape), not a property
    if weight is None or tuple(weight.shape) != (rows, cols):
        return None
    order = row_order(processor, tensor.name, rows, tensor_key_mapping=mapping, parsed_parameters=parsed)
    if order is None:
        return None
    try:
        matrix = GGMLMatrix.from_gguf_tensor(tensor)
    except ValueError:  # a block type ggml's CPU kernels do not run: de-quantized, and counted in the facts
        return None
    if np.array_equal(order, np.arange(rows)):
        return matrix, None
    return matrix.take_rows(torch.from_numpy(order)), order  # llama's q/k rows: the one copy
