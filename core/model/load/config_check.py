"""Checking a Hugging Face model folder's config.json against its safetensors weights before anything is built.

transformers builds a model's skeleton from config.json first and reads the weights after, so a config that does
not belong to its weights goes wrong before any weight is read: 10^9 layers (num_hidden_layers) grow memory
without limit, a hidden size of 2^40 or a tensor stored with the wrong shape ends in "For details look at the
above report!" with no report shown, a context of -5 is accepted. Here, in order, each step bounding what the next
may cost:

1. config.json, read as JSON (transformers' config classes themselves build per-layer lists from the layer count):
   its sizes are whole numbers (or lists of them, one per layer) from 1 to 2^31 - 1 (expert counts from 0);
2. the safetensors headers (names and shapes; no tensor is read) and the index of a sharded model: the layer and
   expert counts config.json gives are not more than the weights hold, and no hidden_size / vocab_size is larger
   than every dimension of every tensor;
3. only then the skeleton, built on the `meta` device (no memory): each tensor transformers loads as stored (its
   own renaming; tensors that a conversion reshapes are left to it) has the shape the skeleton gives it, and the
   skeleton has no more than twice the values the files hold.

Each refusal is one line (ModelLoadError) naming what disagrees. What this cannot read (a config that is not
JSON, a damaged header, an architecture transformers does not know) is left to the loader, which says so in its
own words. `load_report_line` turns transformers' own size-mismatch error, whose report went to a muted logger,
into one line carrying that report's content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ...errors import ModelLoadError

__all__ = ["Weights", "check_model_folder", "load_report_line", "read_weights"]

MAX_SIZE = 2 ** 31 - 1  # any size config.json gives
MAX_UNSEEN = 10_000  # layers or experts, when the weights' names cannot show how many they hold (no model comes near)
MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit on a header
PARAMETER_SLACK = 2  # the skeleton may have up to this many times the values the files hold
FIX = "fix config.json or download the model again"

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
DIM_KEYS = ("hidden_size", "n_embd", "d_model", "vocab_size")  # each is a dimension of some tensor
OTHER_KEYS = ("intermediate_size", "n_inner", "ffn_dim", "num_attention_heads", "n_head", "num_heads",
              "num_key_value_heads", "num_kv_heads", "head_dim", "max_position_embeddings", "n_positions", "n_ctx")
_FIRST_INDEX = re.compile(r"^(.*?)\.(\d+)\.")  # "model.layers.3.mlp...": the blocks' list and the block's index
_EXPERT_INDEX = re.compile(r"^(.*\bexperts)\.(\d+)\.")


@dataclass(frozen=True)
class Weights:
    """What a folder's safetensors files hold, read off their headers (and the index of a sharded model)."""

    label: str  # how a message names the files: "model.safetensors" or "model.safetensors.index.json"
    verb: str  # "holds" / "lists"
    names: tuple[str, ...]  # every tensor's name
    shapes: dict[str, tuple[int, ...]] | None  # every tensor's shape; None when a file could not be read
    files: dict[str, str]  # tensor name -> the file holding it

    def layers(self) -> int | None:
        """How many blocks the weights hold: the most distinct indices under one name prefix (`model.layers.N.`,
        `transformer.h.N.`...); None when no name has an index."""
        return _most_indices(_FIRST_INDEX, self.names)

    def experts(self) -> int | None:
        """How many experts a layer holds: `experts.N.` names, or the first dimension of a fused 3-d experts
        tensor; None when the weights show no experts."""
        held = _most_indices(_EXPERT_INDEX, self.names)
        if held is None and self.shapes is not None:
            fused = [s[0] for n, s in self.shapes.items() if ".experts." in n and len(s) == 3]
            held = max(fused) if fused else None
        return held

    def largest_dimension(self) -> int | None:
        return max((d for shape in self.shapes.values() for d in shape), default=0) if self.shapes else None


def _most_indices(pattern: re.Pattern, names) -> int | None:
    seen: dict[str, set[str]] = {}
    for name in names:
        match = pattern.match(name)
        if match:
            seen.setdefault(match.group(1), set()).add(match.group(2))
    return max(len(indices) for indices in seen.values()) if seen else None


# ---------------------------------------------------------------------------------------------- reading
def _header(path: Path) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape from a safetensors file's header (8 bytes of length, then JSON); None if unreadable."""
    try:
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if not 2 <= length <= min(MAX_HEADER, path.stat().st_size - 8):
                return None
            meta = json.loads(handle.read(length))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    shapes = {}
    for name, entry in meta.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            return None
        shapes[name] = tuple(shape)
    return shapes


def read_weights(folder: Path) -> Weights | None:
    """The names and shapes of the weights transformers would load from `folder` (the index's files when there is
    one, else model.safetensors); None when there are none to read (pickle weights) or the index is not readable."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            return None
        shapes: dict | None = {}
        for file in sorted(set(weight_map.values())):
            held = _header(folder / file)
            if held is None:
                shapes = None
                break
            shapes.update(held)
        return Weights("model.safetensors.index.json", "lists", tuple(weight_map), shapes, dict(weight_map))
    single = folder / "model.safetensors"
    if not single.is_file():
        return None
    held = _header(single)
    names = tuple(held or ())
    return Weights("model.safetensors", "holds", names, held, dict.fromkeys(names, single.name))


def _configs(config: dict, path: str = ""):
    """config.json and the configs nested in it (text_config, vision_config...): (where, dict)."""
    yield path, config
    for key, value in config.items():
        if isinstance(value, dict) and key.endswith("_config") and key != "quantization_config":
            yield from _configs(value, f"{path}{key}.")


# ---------------------------------------------------------------------------------------------- the check
def check_model_folder(folder: Path, name: str, *, trust_remote_code: bool = False) -> None:
    """Refuse (ModelLoadError, one line) a folder whose config.json cannot belong to its safetensors weights, before
    transformers builds anything from it. Returns quietly when all agrees, or when something here cannot be read
    (the loader then reports it)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return
    if not isinstance(config, dict):
        return
    _check_sizes(config, name)
    weights = read_weights(folder)
    _check_counts(config, name, weights)
    if weights is not None and weights.shapes is not None and "quantization_config" not in config:
        _check_skeleton(folder, name, weights, trust_remote_code)  # packed quantized shapes are not the skeleton's


def _check_sizes(config: dict, name: str) -> None:
    for where, part in _configs(config):
        for key in (*LAYER_KEYS, *DIM_KEYS, *OTHER_KEYS, *EXPERT_KEYS):
            value = part.get(key)
            if value is None:
                continue
            least = 0 if key in EXPERT_KEYS else 1
            values = value if isinstance(value, list) and value else [value]  # per-layer sizes (Gemma 3n's)
            if any(type(v) is not int or not least <= v <= MAX_SIZE for v in values):
                raise ModelLoadError(f"{name}: config.json gives {where}{key} = {json.dumps(value)}; it must be a "
                                     f"whole number from {least} to {MAX_SIZE} ({FIX})")


def _check_counts(config: dict, name: str, weights: Weights | None) -> None:
    layers = weights.layers() if weights is not None else None
    experts = weights.experts() if weights is not None else None
    largest = weights.largest_dimension() if weights is not None else None
    for where, part in _configs(config):
        for key in LAYER_KEYS:
            said = _most(part.get(key))
            if said is None:
                continue
            if layers is not None and said > layers:
                raise ModelLoadError(f"{name}: config.json says {said} layers ({where}{key}) but {weights.label} "
                                     f"{weights.verb} weights for {layers}; {FIX}")
            if layers is None and said > MAX_UNSEEN:
                raise ModelLoadError(f"{name}: config.json says {said} layers ({where}{key}), more than tokentui "
                                     f"accepts ({MAX_UNSEEN}) when the weights' names do not show them; {FIX}")
        for key in EXPERT_KEYS:
            said = _most(part.get(key))
            if said and experts is not None and said > experts:
                raise ModelLoadError(f"{name}: config.json says {said} experts ({where}{key}) but {weights.label} "
                                     f"{weights.verb} weights for {experts}; {FIX}")
            if said and experts is None and said > MAX_UNSEEN:
                raise ModelLoadError(f"{name}: config.json says {said} experts ({where}{key}), more than tokentui "
                                     f"accepts ({MAX_UNSEEN}) when the weights' names do not show them; {FIX}")
        for key in DIM_KEYS:
            said = _most(part.get(key))
            if said is not None and largest is not None and said > largest:
                raise ModelLoadError(f"{name}: config.json says {where}{key} {said} but no tensor in "
                                     f"{weights.label} has a dimension that large (the largest is {largest}); {FIX}")


def _most(value):
    return max(value) if isinstance(value, list) else value


def _skeleton(folder: Path, trust_remote_code: bool):
    """The model transformers would build from `folder`'s config, on the meta device; None when it cannot be built
    (the loader then fails with transformers' own reason)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except Exception:  # an unknown architecture, a config transformers rejects: the loader's line says which
        return None


def _loaded_as_stored(model, names):
    """(file name, skeleton name) for each tensor transformers loads without converting it, by transformers' own
    renaming rules; None when those rules cannot be read (another transformers version)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        mapping = get_model_conversion_mapping(model)
        renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in mapping if isinstance(m, WeightConverter)]
        meta = model.state_dict()
        prefix = model.base_model_prefix
        pairs = []
        for key in names:
            renamed, converted = rename_source_key(key, renamings, converters, prefix, meta)
            if renamed not in meta and key in meta:  # transformers' own second try (loading a base model's names)
                renamed, converted = rename_source_key(key, [], [], prefix, meta)
            if renamed in meta and converted is None:
                pairs.append((key, renamed))
        return pairs, meta
    except Exception:
        return None


def _check_skeleton(folder: Path, name: str, weights: Weights, trust_remote_code: bool) -> None:
    model = _skeleton(folder, trust_remote_code)
    if model is None:
        return
    found = _loaded_as_stored(model, [n for n in weights.names if n in weights.shapes])  # (an index may list more)
    if found is not None:
        pairs, meta = found
        first = _embedding_names(model)
        wrong = [(key, target) for key, target in pairs if weights.shapes[key] != tuple(meta[target].shape)]
        wrong.sort(key=lambda pair: pair[1] not in first)  # the embedding table first, then the files' order
        if wrong:
            key, target = wrong[0]
            more = f" (and {len(wrong) - 1} more tensors)" if len(wrong) > 1 else ""
            raise ModelLoadError(f"{name}: {key} is {_shape(weights.shapes[key])} in "
                                 f"{weights.files.get(key, weights.label)} but config.json implies "
                                 f"{_shape(meta[target].shape)}{more}; {FIX}")
    parameters = sum(p.numel() for p in model.parameters())
    values = sum(_count(shape) for shape in weights.shapes.values())
    if parameters > PARAMETER_SLACK * values:
        raise ModelLoadError(f"{name}: config.json implies a model of {parameters:,} parameters but {weights.label} "
                             f"{weights.verb} {values:,} values; {FIX}")


def _embedding_names(model) -> set[str]:
    """The names the skeleton gives its input embedding table (none when the model does not say which it is)."""
    try:
        embedding = getattr(model.get_input_embeddings(), "weight", None)
    except Exception:  # remote code without get_input_embeddings: no table is put first
        return set()
    return {k for k, p in model.named_parameters(remove_duplicate=False) if p is embedding}


def _count(shape) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


def _shape(shape) -> str:
    return f"[{', '.join(str(int(d)) for d in shape)}]"


# ---------------------------------------------------------------------------------------------- the safety net
def load_report_line(name: str, err: BaseException) -> str | None:
    """transformers raises "... For details look at the above report!" after logging its loading report (which a
    muted logger drops); this is that report's content in one line, read off the `loading_info` its reporting
    function was given. None for any other error."""
    if "above report" not in str(err):
        return None
    info, tb = None, err.__traceback__
    while tb is not None:
        info = tb.tb_frame.f_locals.get("loading_info", info)
        tb = tb.tb_next
    mismatched = sorted(getattr(info, "mismatched_keys", None) or ())
    if mismatched:
        key, stored, expected = mismatched[0]
        more = f" (and {len(mismatched) - 1} more tensors)" if len(mismatched) > 1 else ""
        return (f"{name}: {key} is {_shape(stored)} in the weights but config.json implies {_shape(expected)}{more}; "
                f"{FIX}")
    conversion = getattr(info, "conversion_errors", None) or {}
    if conversion:
        key, why = next(iter(conversion.items()))
        text = " ".join(str(why).split())[:200]
        return f"{name}: transformers could not convert the weights for {key} ({text}); {FIX}"
    return f"{name}: the weights do not match config.json (transformers' report was not available); {FIX}"
