"""The kinds of a loaded model's decoder blocks and the parts around them (`anatomy`: core/runs/architecture.py's
ModelAnatomy, which travels in ModelFacts): per block its mixer (attention, latent attention, a recurrent or conv
layer), heads, window, positions (rotary, ALiBi, learned), MLP or mixture of experts, norms and the order its
sublayers meet the residual stream, grouped by kind; and around the blocks the embedding, its scale and norm, the
final norm and the LM head.

Built on core/model/architecture.py, which finds the parts in the module tree (`model_parts`), reads what each
cache layer holds (`kv_groups`) and the logits' final operations (`logits_ops`); as there, the module tree says
what it can and the config, with the family rules transformers' own code implies, the rest.
"""

from __future__ import annotations

import torch
from torch import nn

from ..runs.architecture import BlockGroup, KVGroup, ModelAnatomy
from .architecture import (MIXERS, MLPS, Parts, _attention_dims, _child, _is_latent, _state, decoder_config,
                           kv_groups, logits_ops, model_parts)

__all__ = ["anatomy"]

LEARNED_POSITIONS = ("wpe", "embed_positions", "position_embeddings")
EMBED_NORMS = ("word_embeddings_layernorm", "embed_layer_norm", "emb_ln")
ROUTERS = ("gate", "router")


def _norm_kind(module) -> str:
    name = type(module).__name__ if module is not None else ""
    if "RMSNorm" in name or "RmsNorm" in name:
        return "RMSNorm"
    if "LayerNorm" in name or isinstance(module, nn.LayerNorm):
        return "LayerNorm"
    return name


def _norms(layer) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in layer.named_children() if "norm" in type(m).__name__.lower() or "ln" in n.split("_")]


def _order(cfg, layer, has_mlp: bool) -> str:
    """How a block's sublayers meet the residual stream: "sequential" (norm, attention, add; norm, MLP, add),
    "parallel" (attention and MLP both read the block's input: GPT-J, Phi, Cohere, Falcon, GPT-NeoX),
    "post-norm" (the norm after each sublayer: OLMo 2), "sandwich" (a norm before and after each: Gemma 2 / 3)."""
    if not has_mlp:
        return "sequential"
    if getattr(cfg, "use_parallel_residual", False) or getattr(cfg, "parallel_attn", False) and \
            getattr(cfg, "model_type", "") == "falcon":
        return "parallel"
    names = [n for n, _ in _norms(layer)]
    if len(names) == 1:
        return "parallel"  # one norm feeding both sublayers
    pre = [n for n in names if not n.startswith("post")]
    post = [n for n in names if n.startswith("post")]
    if post and not pre:
        return "post-norm"
    if len(names) >= 4 and len(post) >= 2:
        return "sandwich"
    return "sequential"


def _router(mlp) -> tuple[str, nn.Module | None]:
    name, router = _child(mlp, ROUTERS)
    if router is None:
        return "", None
    if isinstance(router, nn.Linear) and router.out_features == 1:
        return "", None
    return name, router


def _experts(cfg) -> tuple[int, int, int]:
    experts = next((v for k in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
                    if isinstance(v := getattr(cfg, k, None), int) and v > 0), 0)
    top_k = next((v for k in ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts")
                  if isinstance(v := getattr(cfg, k, None), int) and v > 0), 0)
    shared = getattr(cfg, "n_shared_experts", None)
    return experts, top_k, int(shared) if isinstance(shared, int) else 0


def _positions(cfg, parts: Parts, mixer, layer_type: str) -> tuple[str, int, str]:
    """(how the layer knows where a token is, rotary dims per head, rotary scaling)."""
    kind = getattr(cfg, "model_type", "")
    if mixer is None:
        return "none", 0, ""
    if kind == "bloom" or getattr(cfg, "alibi", False):
        return "ALiBi", 0, ""
    if any(isinstance(getattr(parts.parent, n, None), nn.Embedding) for n in LEARNED_POSITIONS):
        return "learned", 0, ""
    if getattr(mixer, "use_rope", True) is False or getattr(mixer, "use_rope", 1) == 0:
        return "none", 0, ""
    rotary = getattr(parts.parent, "rotary_emb", None) or getattr(mixer, "rotary_emb", None)
    params = getattr(cfg, "rope_parameters", None) or {}
    if isinstance(params, dict) and isinstance(params.get(layer_type), dict):  # per layer type (Gemma 3)
        params = params[layer_type]
    rope_type = params.get("rope_type", "") if isinstance(params, dict) else ""
    rope_type = "" if rope_type in ("default", None) else rope_type
    inv = getattr(rotary, "inv_freq", None)
    if inv is None and rotary is not None:  # one set of frequencies per layer type (Gemma 3: *_inv_freq)
        inv = getattr(rotary, f"{layer_type}_inv_freq", None)
    if isinstance(inv, torch.Tensor):
        return "rotary", 2 * int(inv.shape[-1]), rope_type
    if isinstance(getattr(cfg, "rotary_dim", None), int):  # GPT-J: rotary inside the attention
        return "rotary", int(cfg.rotary_dim), rope_type
    return "", 0, ""


def _mixer_kind(cfg, mixer, linear_kind: str | None) -> str:
    if linear_kind is not None:
        return linear_kind
    return "latent attention" if _is_latent(cfg, mixer) else "attention"


def anatomy(model) -> ModelAnatomy | None:
    """The blocks by kind and the parts around them (core/runs/architecture.py's ModelAnatomy); None when the
    module tree does not show them (`model_parts` says why)."""
    parts = model_parts(model)
    if not isinstance(parts, Parts):
        return None
    cfg = decoder_config(model)
    groups = {g.layers[0]: g for g in kv_groups(model)}
    by_layer: dict[int, KVGroup] = {}
    for g in groups.values():
        for i in g.layers:
            if g.kind != "state" or i not in by_layer:
                by_layer[i] = g
    experts, top_k, shared = _experts(cfg)
    types = list(getattr(cfg, "layer_types", None) or [])
    kinds: dict[tuple, list[int]] = {}
    info: dict[tuple, dict] = {}
    for i, layer in enumerate(parts.layers):
        mixer_name, mixer = _child(layer, MIXERS)
        mlp_name, mlp = _child(layer, MLPS)
        if mlp is None and isinstance(getattr(layer, "fc2", None), nn.Module):  # OPT: fc1, fc2 in the block itself
            mlp_name, mlp = "fc2", layer.fc2
        kv = by_layer.get(i)
        linear = None
        if kv is not None and kv.kind == "state":
            linear = _state(cfg, mixer)[2]
        mixer_kind = _mixer_kind(cfg, mixer, linear)
        router_name, router = _router(mlp) if mlp is not None else ("", None)
        moe = router is not None
        shared_here = shared or (1 if mlp is not None and _child(mlp, ("shared_expert", "shared_experts"))[1]
                                 is not None and moe else 0)
        layer_type = types[i] if i < len(types) else "full_attention"
        positions, rotary_dims, rope_type = _positions(cfg, parts, mixer, layer_type) if linear is None else (
            "none", 0, "")
        heads = kvh = dim = 0
        if linear is None and mixer is not None and mixer_kind == "attention":
            heads, kvh, dim = _attention_dims(model, cfg, layer, mixer)
            if getattr(cfg, "model_type", "") == "falcon" and cfg.new_decoder_architecture:
                kvh = cfg.num_kv_heads or heads  # computed; the cache holds them broadcast (kv_groups' note)
        elif mixer_kind == "latent attention":
            heads = _attention_dims(model, cfg, layer, mixer)[0]
        window = kv.window if kv is not None else None
        window_kind = kv.kind if kv is not None and kv.kind in ("sliding", "chunked") else ""
        qk_norm = any(isinstance(getattr(mixer, n, None), nn.Module) for n in ("q_norm", "k_norm", "q_layernorm"))
        norm = _norm_kind(_norms(layer)[0][1]) if _norms(layer) else ""
        order = _order(cfg, layer, mlp is not None)
        sinks = isinstance(getattr(mixer, "sinks", None), torch.Tensor)
        key = (mixer_kind, type(mixer).__name__ if mixer is not None else "", heads, kvh, dim, window, window_kind,
               positions, rotary_dims, moe, order, norm, qk_norm)
        kinds.setdefault(key, []).append(i)
        info.setdefault(key, dict(
            mixer=mixer_kind, mixer_name=type(mixer).__name__ if mixer is not None else "", heads=heads,
            kv_heads=kvh, head_dim=dim, window=window, window_kind=window_kind, positions=positions,
            rotary_dims=rotary_dims, rope_type=rope_type, qk_norm=qk_norm,
            mlp="MoE" if moe else ("dense" if mlp is not None else "none"),
            experts=experts if moe else 0, top_k=top_k if moe else 0, shared_experts=shared_here if moe else 0,
            order=order, norm=norm, module=f"{parts.layers_path}.{i}", mixer_module=mixer_name,
            mlp_module=mlp_name, router_module=f"{mlp_name}.{router_name}" if moe else "",
            note="attention sinks: a learned logit per head that takes part of every softmax" if sinks else ""))
    blocks = [BlockGroup(layers=layers, **info[key]) for key, layers in kinds.items()]
    positions_name = next((n for n in LEARNED_POSITIONS if isinstance(getattr(parts.parent, n, None),
                                                                      nn.Embedding)), "")
    norm_name = next((n for n in EMBED_NORMS if isinstance(getattr(parts.parent, n, None), nn.Module)), "")
    prefix = f"{parts.parent_path}." if parts.parent_path else ""
    scale = getattr(parts.embedding, "scalar_embed_scale", None)
    multiplier = getattr(cfg, "embedding_multiplier", None)
    embed_scale = float(scale) if isinstance(scale, (int, float)) and scale != 1 else (
        float(multiplier) if isinstance(multiplier, (int, float)) and multiplier != 1 else None)
    return ModelAnatomy(
        blocks=blocks, layers_module=parts.layers_path, embedding_module=parts.embedding_path,
        positions_module=prefix + positions_name if positions_name else "", embed_scale=embed_scale,
        embed_norm_module=prefix + norm_name if norm_name else "",
        final_norm=_norm_kind(parts.norm) if parts.norm is not None else "", final_norm_module=parts.norm_path,
        project_module=parts.project_path, head_module=parts.head_path,
        head_bias=getattr(parts.head, "bias", None) is not None, logits_ops=[words for words, _ in logits_ops(model)])
