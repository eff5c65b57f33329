"""Reading what a loaded model is made of, for every decoder family transformers has: where its parts sit in the
module tree (the decoder blocks, the final norm, the LM head: `model_parts`, which the logit lens uses), what it does
to the head's output (`logits_ops`) and what each layer of its KV cache holds (`kv_groups`, and whether `--compile`
fits it: `compile_problem`). The kinds of its blocks (`anatomy`) are read in core/model/model_anatomy.py, on top of
this module. The types are torch-free (core/runs/architecture.py) and travel in ModelFacts.

Why read the module tree and the cache's own layer classes rather than a table per architecture: the names differ
(`model.norm`, `transformer.ln_f`, `backbone.norm_f`, `model.decoder.final_layer_norm`, LFM2's `embedding_norm`),
and what a layer caches is decided by the cache class transformers gives it (full, sliding, linear-attention...).
Where the module tree cannot say (how many K/V heads a layer caches, a recurrent state's shape), the config says,
with the few family rules transformers' own code implies, each named below; tests/unit/test_architecture_matrix.py
checks every figure against the cache's tensors and every shape against forward hooks, per architecture.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn

from ..runs.architecture import KVGroup

__all__ = ["Parts", "compile_problem", "decoder_config", "kv_groups", "logits_ops", "model_parts"]

# Where families keep the final norm: a child of the module that holds the decoder blocks, in this order.
FINAL_NORMS = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "norm_f", "embedding_norm", "final_norm")
MIXERS = ("self_attn", "self_attention", "attn", "attention", "linear_attn", "conv", "mixer")
MLPS = ("mlp", "feed_forward", "block_sparse_moe", "ffn")


def decoder_config(model):
    config = model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


@dataclass
class Parts:
    """The modules a pass goes through, found in `model`'s tree, and their paths (named_modules() names)."""

    layers: nn.ModuleList
    layers_path: str
    norm: nn.Module | None  # the final norm (None: the model has none)
    norm_path: str
    project: nn.Module | None  # a projection after the final norm (OPT's project_out)
    project_path: str
    head: nn.Module
    head_path: str
    embedding: nn.Module
    embedding_path: str
    parent: nn.Module  # the module holding the blocks (the decoder proper)
    parent_path: str


_PARTS: "weakref.WeakKeyDictionary[nn.Module, Parts | str]" = weakref.WeakKeyDictionary()


def model_parts(model) -> Parts | str:
    """The model's blocks, final norm and LM head (cached per model), or why they cannot be found, in one line."""
    found = _PARTS.get(model)
    if found is None:
        found = _find_parts(model)
        _PARTS[model] = found
    return found


def _find_parts(model) -> Parts | str:
    cfg = decoder_config(model)
    name = (getattr(model.config, "architectures", None) or [type(model).__name__])[0]
    count = _num_layers(cfg)
    head = model.get_output_embeddings()
    embedding = model.get_input_embeddings()
    # (a ggml head's `matrix` first: its `weight` is a float32 copy made on demand, core/model/quant/ggml_linear.py)
    if head is None or (getattr(head, "matrix", None) is None and getattr(head, "weight", None) is None):
        return f"{name} has no output embeddings (LM head) tokentui can call"
    paths = {id(m): p for p, m in model.named_modules()}
    layers_path = next((p for p, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == count
                        and count), None)
    if layers_path is None:
        return f"{name}: no list of {count} decoder blocks in its module tree"
    parent_path = layers_path.rpartition(".")[0]
    parent = model.get_submodule(parent_path) if parent_path else model
    norm_name = next((n for n in FINAL_NORMS if isinstance(getattr(parent, n, None), nn.Module)), None)
    norm = getattr(parent, norm_name) if norm_name else None
    project = getattr(parent, "project_out", None)
    project = project if isinstance(project, nn.Module) else None

    def path(module, child):
        return f"{parent_path}.{child}" if parent_path else child

    return Parts(layers=model.get_submodule(layers_path), layers_path=layers_path, norm=norm,
                 norm_path=path(parent, norm_name) if norm is not None else "", project=project,
                 project_path=path(parent, "project_out") if project is not None else "", head=head,
                 head_path=paths.get(id(head), ""), embedding=embedding, embedding_path=paths.get(id(embedding), ""),
                 parent=parent, parent_path=parent_path)


def _num_layers(cfg) -> int:
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(cfg, key, None)
        if isinstance(value, int):
            return value
    return 0


def _child(module, names) -> tuple[str, nn.Module | None]:
    """The first of `names` that is a child module of `module`: (its name, it), or ("", None)."""
    for name in names:
        child = getattr(module, name, None)
        if isinstance(child, nn.Module):
            return name, child
    return "", None


# ---------------------------------------------------------------------------------------------- the logits
def logits_ops(model) -> list[tuple[str, object]]:
    """What the model does to its LM head's output before returning the logits, in order: (words, function on a
    float32 tensor). transformers' causal-LM classes: Cohere's `logit_scale` (×, kept on the model), Granite's
    `logits_scaling` (÷; HyperCLOVA X multiplies by it), Falcon-H1's `lm_head_multiplier` (×), Gemma 2 / 3's final
    logit soft-cap (cap · tanh(z / cap); RecurrentGemma's `logits_soft_cap`). The logit lens applies the same."""
    cfg = decoder_config(model)
    kind = getattr(cfg, "model_type", "")
    ops: list[tuple[str, object]] = []
    scale = getattr(model, "logit_scale", None)
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        ops.append((f"× {scale:g} (logit_scale)", lambda z, s=float(scale): z * s))
    scaling = getattr(cfg, "logits_scaling", None)
    if isinstance(scaling, (int, float)) and scaling:
        if kind == "hyperclovax":
            ops.append((f"× {scaling:g} (logits_scaling)", lambda z, s=float(scaling): z * s))
        else:
            ops.append((f"÷ {scaling:g} (logits_scaling)", lambda z, s=float(scaling): z / s))
    inner = getattr(model, "model", None)
    multiplier = getattr(inner, "lm_head_multiplier", None)
    if isinstance(multiplier, (int, float)) and not isinstance(multiplier, bool):
        ops.append((f"× {multiplier:g} (lm_head_multiplier)", lambda z, s=float(multiplier): z * s))
    cap = getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logits_soft_cap", None)
    if isinstance(cap, (int, float)) and cap:
        ops.append((f"soft-cap {cap:g}: {cap:g}·tanh(z / {cap:g})", lambda z, c=float(cap): torch.tanh(z / c) * c))
    return ops


# ---------------------------------------------------------------------------------------------- the KV cache
def _cache_layers(model) -> list:
    """The layer objects of the cache transformers builds for this model (what `generate` and the engine use),
    before any forward: their classes say what each layer holds."""
    from transformers import DynamicCache

    return list(DynamicCache(config=model.config).layers)


def _attention_dims(model, cfg, layer, mixer) -> tuple[int, int, int]:
    """(query heads, K/V heads cached per position, dims per head) of one attention layer."""
    heads = next((v for k in ("num_attention_heads", "n_head", "num_heads") if isinstance(v := getattr(cfg, k, None),
                                                                                           int)), 0)
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    kind = getattr(cfg, "model_type", "")
    if kind == "falcon":
        # transformers' Falcon, new decoder: up to 5.24 it broadcasts K and V to every query head before caching
        # them; since 5.25 it caches its K/V heads and repeats them after (its attention has num_key_value_groups)
        broadcast = not isinstance(getattr(mixer, "num_key_value_groups", None), int)
        kv = (heads if broadcast else cfg.num_kv_heads) if cfg.new_decoder_architecture else (
            1 if cfg.multi_query else (cfg.num_kv_heads or heads))
    elif getattr(cfg, "multi_query", False):  # GPT-BigCode
        kv = 1
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", 0)
    dim = getattr(mixer, "head_dim", None) or getattr(cfg, "head_dim", None) or (hidden // heads if heads else 0)
    return heads, int(kv), int(dim)


def _is_latent(cfg, mixer) -> bool:
    """Multi-head latent attention (DeepSeek-V2 / V3 and kin): transformers caches the compressed latent and the
    rotary key, not K and V per head."""
    return getattr(cfg, "kv_lora_rank", None) is not None and hasattr(mixer, "kv_a_proj_with_mqa")


def _state(cfg, mixer) -> tuple[list[list[int]] | None, list[str], str]:
    """(shapes of one layer's fixed-size state without the batch, their names, the mixer's name) for a recurrent
    layer. The conv state is read off the mixer's Conv1d ([channels, kernel]); the recurrent one from the config, by
    family (transformers' code): Mamba [inner, state], Mamba-2 [heads, head dim, state], Gated DeltaNet [value
    heads, key dim, value dim]; None where this version does not know the family."""
    conv = next((m for m in mixer.children() if isinstance(m, nn.Conv1d)), None) if mixer is not None else None
    shapes = [[conv.in_channels, conv.kernel_size[0]]] if conv is not None else []
    names = ["conv"] if conv is not None else []
    cls = type(mixer).__name__ if mixer is not None else ""
    if "ShortConv" in cls:
        return shapes, names, "short conv"
    if "GatedDeltaNet" in cls:
        return shapes + [[cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim]], \
            names + ["recurrent"], "linear attention"
    if "Mamba2" in cls:
        return shapes + [[cfg.num_heads, cfg.head_dim, cfg.state_size]], names + ["SSM"], "SSM"
    if "Mamba" in cls and isinstance(getattr(mixer, "A_log", None), torch.Tensor):
        return shapes + [list(mixer.A_log.shape)], names + ["SSM"], "SSM"
    return None, names, "linear attention"


def kv_groups(model) -> list[KVGroup]:
    """What each layer of the model's KV cache holds, grouped by kind (core/runs/architecture.py)."""
    cfg = decoder_config(model)
    parts = model_parts(model)
    blocks = parts.layers if isinstance(parts, Parts) else None
    types = list(getattr(cfg, "layer_types", None) or [])
    groups: dict[tuple, list[int]] = {}
    for i, layer in enumerate(_cache_layers(model)):
        block = blocks[i] if blocks is not None and i < len(blocks) else None
        mixer = _child(block, MIXERS)[1] if block is not None else None
        cls = type(layer).__name__
        linear = "LinearAttention" in cls
        windowed = getattr(layer, "sliding_window", None)
        has_kv = not linear or "AndFullAttention" in cls or "AndSlidingWindow" in cls
        if cls == "DummyLayer":
            groups.setdefault(("none",), []).append(i)
            continue
        if linear:
            shapes, names, _ = _state(cfg, mixer)
            key = ("state", None if shapes is None else tuple(map(tuple, shapes)), tuple(names))
            # transformers keeps SSM / recurrent states in float32 whatever the model's dtype; conv states in it
            groups.setdefault(key, []).append(i)
        if not has_kv:
            continue
        if _is_latent(cfg, mixer):
            key = ("latent", (1, int(cfg.kv_lora_rank)), (1, int(cfg.qk_rope_head_dim)), None, "")
        else:
            heads, kv, dim = _attention_dims(model, cfg, block, mixer)
            note = ""
            if getattr(cfg, "model_type", "") == "falcon" and cfg.new_decoder_architecture and kv != getattr(
                    cfg, "num_kv_heads", kv):
                note = (f"{cfg.num_kv_heads} K/V heads computed, cached broadcast to all {heads} query heads "
                        "(transformers' Falcon)")
            elif kv == 1 and heads > 1:
                note = f"multi-query: one K/V head for {heads} query heads"
            kind = "full"
            if windowed is not None:
                kind = "chunked" if i < len(types) and types[i] == "chunked_attention" else "sliding"
            key = (kind, (kv, dim), (kv, dim), windowed, note)
        groups.setdefault(key, []).append(i)
    out = []
    for key, layers in groups.items():
        if key[0] == "none":
            out.append(KVGroup("none", layers, note="reads another layer's cache"))
        elif key[0] == "state":
            shapes, names = key[1], list(key[2])
            out.append(KVGroup("state", layers, state=None if shapes is None else [list(s) for s in shapes],
                               state_names=names, state_value_bytes=[0 if n == "conv" else 4 for n in names]))
        else:
            kind, k, v, window, note = key
            # transformers' dynamic sliding layer keeps window - 1 positions: the new one makes the window
            cap = window - 1 if window is not None else None
            out.append(KVGroup(kind, layers, k=list(k), v=list(v), window=window, cap=cap, note=note))
    return sorted(out, key=lambda g: g.layers[0])


def compile_problem(model) -> str | None:
    """Why `--compile`'s static cache and fixed-shape decode step do not fit this model (None: they do).
    transformers' static sliding-window (and chunked) layer keeps its length as a Python int, which a fixed-shape
    graph bakes in: every step would compile again. The Mamba family keeps only a recurrent state and has no
    static cache. Full attention, MLA and the linear-attention / conv layers of hybrids
    (Qwen3-Next, LFM2), whose states have fixed shapes, compile."""
    from .decode.adapter import state_only

    if state_only(model):
        return "--compile covers models with a KV cache; this one keeps only a recurrent state (the Mamba family)"
    kinds = {g.kind for g in kv_groups(model)} - {"full", "latent", "state"}
    if not kinds:
        return None
    words = {"sliding": "sliding-window attention layers", "chunked": "chunked attention layers",
             "none": "layers that share another's cache"}
    said = " and ".join(words[k] for k in sorted(kinds))
    return (f"--compile does not cover {said} (transformers' static cache counts their positions in a Python "
            "number, so the decode step would compile again at every step)")
