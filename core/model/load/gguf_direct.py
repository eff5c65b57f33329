"""A later start of a GGUF kept as stored, without transformers' model (issue 37's cold start): the native ggml step
made from the file's tensors directly (`DirectModel`), and transformers' model built from the same modules only when
something asks for its forward (the logit lens, the attention and sublayer views, a fan-out, a score, a preview).

What the first start leaves in the file's cache folder (core/model/load/gguf_stored.py's `cached_folder`):

    placement.json, row_orders.npz   where core/model/load/gguf_stored.py's place_stored put each tensor, by
                                     transformers' own name map and tensor processor (`Placement`): the module each
                                     matrix became, its row order where the processor permuted the rows (llama's q / k),
                                     the float tensors it kept as the file stores them, and the family
    ggml_step.json                   the ggml step's verdict against the forward, with the step's shapes and scalars
                                     and whether this module's rope table gives the rotary module's cos / sin
    facts.json                       the model facts (ModelFacts.to_dict, read back by the record reader's checked
                                     parser)

A later start takes this path only where all of them are there, the verdict accepted the step with the libraries
bound now, and the placement covers every matrix and vector the step reads (`DirectModel`); anywhere else it loads
as the first start does. The step's parts are then those the model path's `parts_of` would read from transformers'
model built over the same tensors: the same GGMLMatrix rows (the same row order), the same norm and bias values, the
same scalars. tests/unit/test_gguf_direct.py holds the two to the same bits.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...errors import ModelLoadError
from ...runs.facts import ModelFacts
from .model_cache import write_whole
from .stored_config import StoredConfig

PLACEMENT = "placement.json"
ROW_ORDERS = "row_orders.npz"
FACTS = "facts.json"
_EMBED, _NORM, _HEAD = "model.embed_tokens", "model.norm.weight", "lm_head"
_LAYER = "model.layers.{i}."
_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")
_QK_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")


@dataclass
class Placement:
    """Where the first start put a GGUF's tensors in transformers' model (filled by gguf_stored.place_stored)."""

    family: str = ""  # the model's class name, e.g. "Qwen3ForCausalLM"
    config: dict = field(default_factory=dict)  # its config, every value (`step_config` reads it back)
    matrices: dict[str, str] = field(default_factory=dict)  # HF module -> GGUF tensor, kept as stored
    orders: dict[str, np.ndarray] = field(default_factory=dict)  # GGUF tensor -> its row order (not the identity)
    floats: dict[str, str] = field(default_factory=dict)  # HF parameter -> GGUF tensor, its values as the file stores
    changed: list[str] = field(default_factory=list)  # HF parameters transformers changed, or de-quantized from 2-D
    tied_head: bool = False  # the head multiplies by the embedding's matrix

    def save(self, folder: Path) -> None:
        """Into `folder` (a cache folder being written: gguf_stored's write_cache)."""
        data = {"family": self.family, "config": self.config, "matrices": self.matrices, "floats": self.floats,
                "changed": self.changed, "tied_head": self.tied_head}
        (folder / PLACEMENT).write_text(json.dumps(data))
        with open(folder / ROW_ORDERS, "wb") as fh:
            np.savez(fh, **{name: order.astype(np.int64) for name, order in self.orders.items()})

    @classmethod
    def read(cls, folder: Path) -> "Placement | None":
        """The placement kept in `folder`; None where it is absent or not as written (the start then loads as the
        first one did)."""
        try:
            data = json.loads((folder / PLACEMENT).read_text())
            with np.load(folder / ROW_ORDERS, allow_pickle=False) as npz:
                orders = {name: np.asarray(npz[name]) for name in npz.files}
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("family"), str) \
                or not isinstance(data.get("config"), dict) \
                or not _str_map(data.get("matrices")) or not _str_map(data.get("floats")) \
                or not isinstance(data.get("changed"), list) or not isinstance(data.get("tied_head"), bool):
            return None
        if any(order.ndim != 1 or order.dtype != np.int64 for order in orders.values()):
            return None
        return cls(data["family"], data["config"], dict(data["matrices"]), orders, dict(data["floats"]),
                   [str(n) for n in data["changed"]], data["tied_head"])


def full_config(config) -> dict:
    """Every value of transformers' `config` (not only those its class's defaults lack), as JSON reads it back."""
    return json.loads(config.to_json_string(use_diff=False))


def step_config(values: dict) -> StoredConfig:
    """`values` (`full_config`'s) as the config the step, the KV cache and the end ids read (shapes, layer types, rope
    parameters, end ids): core/model/load/stored_config.py's StoredConfig, without transformers, whose import a later
    start would pay for (BENCHMARKS.md: "A later start without transformers"). The first start checks the rope table
    against it (`rope_agrees`); the family's class is built from the same values with the model (`DirectModel`)."""
    return StoredConfig(values)


def _str_map(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


# ---------------------------------------------------------------------------------------------- the facts
def save_facts(folder: Path, facts: ModelFacts) -> None:
    """The model facts the first start found, for later starts (`read_facts`); written whole or not at all."""
    write_whole(folder / FACTS, json.dumps(facts.to_dict()))


def read_facts(folder: Path) -> ModelFacts | None:
    """The model facts a first start kept in `folder`, parsed into checked types (None: absent or not valid)."""
    from ...runs.record_reader import event_from_dict

    try:
        facts = event_from_dict(json.loads((folder / FACTS).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return facts if isinstance(facts, ModelFacts) else None


# ---------------------------------------------------------------------------------------------- the step's parts
@dataclass(frozen=True)
class StepShape:
    """The ggml step's shapes and scalars as the first start's step had them (kept in its verdict)."""

    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    scale: float

    @classmethod
    def of(cls, step) -> "StepShape":
        return cls(step.heads, step.kv_heads, step.head_dim, step.eps, step.scale)

    def to_dict(self) -> dict:
        return {"heads": self.heads, "kv_heads": self.kv_heads, "head_dim": self.head_dim, "eps": self.eps,
                "scale": self.scale}

    @classmethod
    def from_dict(cls, data) -> "StepShape | None":
        if not isinstance(data, dict):
            return None
        ints = [data.get(k) for k in ("heads", "kv_heads", "head_dim")]
        floats = [data.get(k) for k in ("eps", "scale")]
        if not all(type(v) is int and v > 0 for v in ints) or not all(type(v) is float and v > 0 for v in floats):
            return None
        return cls(*ints, *floats)


def rope_agrees(step, config) -> bool:
    """Whether core/model/native/rope.py's table from `config`'s values (as a later start reads them: `step_config`)
    gives `step`'s rotary module's cos / sin, bit for bit, at positions 0 to 4,095 (the first start checks it, so
    that a later start may use the table)."""
    from ..native.rope import RopeTable

    try:
        table = RopeTable(step_config(full_config(config)))
    except ValueError:
        return False
    x = torch.zeros(1, 1, dtype=torch.float32)
    positions = torch.arange(4096, dtype=torch.long).unsqueeze(0)
    ours, theirs = table(x, positions), step.rotary(x, positions)
    return all(torch.equal(a, b) for a, b in zip(ours, theirs))


class DirectModel:
    """A GGUF kept as stored, on a later start: the ggml step made from the file's tensors (`step`), and
    transformers' model built from the same modules when first asked for (`model()`). ValueError (one line) where
    the placement does not cover what the step reads."""

    def __init__(self, reader, placement: Placement, shape: StepShape, folder: Path):
        self.config = step_config(placement.config)
        self._reader, self._placement, self._folder = reader, placement, folder
        self._modules: dict[str, nn.Module] = {}  # HF module name -> the GGMLLinear / GGMLEmbedding made here
        self._vectors: dict[str, torch.Tensor] = {}  # HF parameter -> its float32 values
        self._model: nn.Module | None = None
        self._lock = threading.Lock()
        self.step = self._make_step(shape)

    def _make_step(self, shape: StepShape):
        from ..native.ggml_native import LAYER_MATRICES, GGMLStep, LayerParts, StepParts, check_config
        from ..native.rope import RopeTable
        from ..quant.ggml_linear import GGMLEmbedding, GGMLLinear, GGMLMatrix

        placement = self._placement
        check_config(self.config, placement.family)
        if placement.changed:
            raise ValueError(f"transformers changed or de-quantized {placement.changed[0]} at the first start")
        by_name = {t.name: t for t in self._reader.tensors}

        def matrix(module: str) -> GGMLMatrix:
            name = placement.matrices.get(module)
            if name is None or name not in by_name:
                raise ValueError(f"{module} was not kept as stored at the first start")
            found = GGMLMatrix.from_gguf_tensor(by_name[name])
            order = placement.orders.get(name)
            return found if order is None else found.take_rows(torch.from_numpy(order))

        def vector(parameter: str, needed: bool = True) -> torch.Tensor | None:
            from gguf import dequantize

            name = placement.floats.get(parameter)
            if name is None or name not in by_name:
                if needed:
                    raise ValueError(f"{parameter} has no tensor kept as stored")
                return None
            tensor = by_name[name]
            values = torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32))
            self._vectors[parameter] = values
            return values

        def linear(module: str) -> GGMLLinear:
            made = GGMLLinear(matrix(module), bias=vector(f"{module}.bias", needed=False))
            self._modules[module] = made
            return made

        embed = self._modules[_EMBED] = GGMLEmbedding(matrix(_EMBED))
        if placement.tied_head:
            head = self._modules[_HEAD] = GGMLLinear(embed.matrix)
        else:
            head = linear(_HEAD)
        layers = []
        for i in range(int(self.config.num_hidden_layers)):
            prefix = _LAYER.format(i=i)
            mats = [linear(prefix + m) for m in LAYER_MATRICES]
            if any(m.bias is not None for m in mats[3:]):
                raise ValueError("its layers have biases outside q/k/v")
            norms = [vector(prefix + n) for n in _NORMS]
            qk = [vector(prefix + n, needed=False) for n in _QK_NORMS]
            layers.append(LayerParts(*mats, *norms, *qk))
        parts = StepParts(embed=embed, layers=tuple(layers), norm_weight=vector(_NORM), head=head,
                          rotary=RopeTable(self.config), heads=shape.heads, kv_heads=shape.kv_heads,
                          head_dim=shape.head_dim, eps=shape.eps, scale=shape.scale)
        return GGMLStep.from_parts(parts, self.model)

    @property
    def built(self) -> bool:
        """Whether transformers' model has been built (`model()`)."""
        return self._model is not None

    def model(self) -> nn.Module:
        """transformers' model of the file, built once when first asked for: the skeleton on the meta device given
        the step's own modules and vectors (nothing copied), ready for the forward."""
        with self._lock:
            if self._model is None:
                self._model = self._build()
            return self._model

    def _build(self) -> nn.Module:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        from ..native.ggml_native import trust
        from .gguf_plan import _skeleton

        values = dict(self._placement.config)
        model = _skeleton(CONFIG_MAPPING[values.pop("model_type")].from_dict(values))
        if type(model).__name__ != self._placement.family:
            raise ModelLoadError(f"{self._folder}: the cached config builds {type(model).__name__}, not the "
                                 f"{self._placement.family} the file's first start placed; delete that folder and "
                                 "start again")
        for name, module in self._modules.items():
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module)
        own = {n: v for n, v in self._vectors.items() if not n.endswith(".bias")}  # biases are the GGMLLinear's
        model.load_state_dict(own, strict=False, assign=True)
        still_meta = [n for n, p in model.named_parameters() if p.is_meta]
        if still_meta:
            raise ModelLoadError(f"{self._folder}: the cached placement has no tensor for {still_meta[0]} (and "
                                 f"{len(still_meta) - 1} more); delete that folder and start again")
        model.eval()
        trust(model)  # its ggml step is this one's: the file's verdict holds for it
        return model
