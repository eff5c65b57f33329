"""What a model is made of, torch-free: the kinds of its KV cache's layers (what the KV panel and every KV figure
count) and the kinds of its decoder blocks (what the one-pass panel draws). core/model/architecture.py reads both off
a loaded model, its config and its module tree, into ModelFacts (`kv_groups`, `anatomy`); this module holds the
types and the arithmetic on them, so the engine's figures, the dashboard, the records and the architecture table
(docs/models.md) use one formula.

What one layer of the cache holds, per kind (`KVGroup.kind`), for `tokens` positions and `b` bytes per value:

    full      K [heads, dim] + V [heads, dim] per position: (K + V) × tokens × b; multi-query (Falcon, GPT-BigCode):
              heads = 1; Falcon's new decoder caches K and V broadcast to every query head (transformers' code)
    sliding   the same, for at most `cap` positions: (K + V) × min(tokens, cap) × b. transformers' dynamic sliding
    chunked   layer keeps window − 1 positions (the new one makes the window); chunked attention (Llama 4) keeps
              chunk − 1 the same way
    latent    multi-head latent attention (DeepSeek-V3): the compressed latent [1, rank] and the rotary key
              [1, rotary dims] per position, not heads × head_dim: (rank + rotary) × tokens × b
    state     a recurrent mixer (Mamba's SSM, Gated DeltaNet, a short conv): fixed-size tensors whatever the length,
              `state` (e.g. conv [128, 4] + SSM [128, 8]; the SSM / recurrent one in float32 whatever the model's
              dtype, as transformers keeps it); None when this version cannot tell their size beforehand
    none      a layer that caches nothing of its own (it reads another layer's cache)

The tests (tests/unit/test_architecture_matrix.py) check these against the cache tensors' real growth, per
architecture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

__all__ = ["BlockGroup", "KVGroup", "KV_KINDS", "ModelAnatomy", "formula_terms", "kv_bytes_at", "kv_bytes_per_token",
           "layer_span", "state_bytes"]

KV_KINDS = ("full", "sliding", "chunked", "latent", "state", "none")


@dataclass(frozen=True, slots=True)
class KVGroup:
    """Decoder layers whose caches hold the same kind of thing (module docstring), and what one of them holds."""

    kind: str
    layers: list[int]  # 0-based decoder layer indices
    k: list[int] = field(default_factory=list)  # per position and layer: [heads, dim] of the keys (latent: [1, rank])
    v: list[int] = field(default_factory=list)  # ... of the values (latent: [1, rotary dims], the rotary key)
    window: int | None = None  # sliding / chunked: the attention window (chunk size)
    cap: int | None = None  # positions the layer keeps at most (None: every one)
    # fixed-size tensors per layer, without the batch dimension (kind "state"); None: not known before a forward
    state: list[list[int]] | None = field(default_factory=list)
    state_names: list[str] = field(default_factory=list)  # what each state tensor is: "conv", "SSM", "recurrent"
    # bytes per value of each state tensor; 0 (or missing): the cache's own (the model's dtype). transformers keeps
    # the SSM / recurrent states in float32 (4) whatever the model's dtype
    state_value_bytes: list[int] = field(default_factory=list)
    note: str = ""  # e.g. "multi-query: one K/V head for 8 query heads"

    def __post_init__(self) -> None:
        if self.kind not in KV_KINDS:
            raise ValueError(f"KVGroup.kind must be one of {', '.join(KV_KINDS)}, got {self.kind!r}")
        if not self.layers:
            raise ValueError("a KVGroup needs at least one layer")
        for name in ("k", "v"):
            shape = getattr(self, name)
            if shape and (len(shape) != 2 or min(shape) < 1):
                raise ValueError(f"KVGroup.{name} must be [heads, dim] of positive sizes, got {shape}")
        if self.cap is not None and self.cap < 1:
            raise ValueError(f"KVGroup.cap must be >= 1, got {self.cap}")

    @property
    def per_position(self) -> int:
        """Values one layer of this group adds for one more cached position (below its cap)."""
        return (prod(self.k) if self.k else 0) + (prod(self.v) if self.v else 0)

    @property
    def state_values(self) -> int | None:
        """Values of one layer's fixed-size state (0 without one; None: not known)."""
        if self.state is None:
            return None
        return sum(prod(shape) for shape in self.state)

    def state_bytes(self, bytes_per_value: int) -> int | None:
        """Bytes of one layer's fixed-size state, each tensor at its own element size (None: not known)."""
        if self.state is None:
            return None
        sizes = list(self.state_value_bytes) + [0] * (len(self.state) - len(self.state_value_bytes))
        return sum(prod(shape) * (size or bytes_per_value) for shape, size in zip(self.state, sizes))

    def held(self, tokens: int) -> int:
        """Positions one layer holds after `tokens` have gone through the model."""
        return min(tokens, self.cap) if self.cap is not None else tokens

    def bytes_at(self, tokens: int, bytes_per_value: int) -> int | None:
        """Bytes this group's layers hold after `tokens` positions (None: a state of unknown size)."""
        state = self.state_bytes(bytes_per_value)
        if state is None:
            return None
        return len(self.layers) * (self.per_position * self.held(tokens) * bytes_per_value + state)


def kv_bytes_per_token(groups: list[KVGroup], bytes_per_value: int) -> int:
    """Bytes one more position adds to the cache while no window is full: every layer that caches per position
    counts (a fixed-size state adds nothing; a sliding layer stops adding once it holds `cap` positions)."""
    return sum(len(g.layers) * g.per_position for g in groups) * bytes_per_value


def kv_bytes_at(groups: list[KVGroup], tokens: int, bytes_per_value: int) -> int | None:
    """The cache's bytes after `tokens` positions: the formula the KV panel shows; None when a state's size is not
    known. Equals the nbytes of the cache's tensors (the tests' oracle)."""
    sizes = [g.bytes_at(tokens, bytes_per_value) for g in groups]
    return None if any(n is None for n in sizes) else sum(sizes)


def state_bytes(groups: list[KVGroup], bytes_per_value: int) -> int | None:
    """Bytes of the fixed-size recurrent state in all (0 without one; None: not known)."""
    sizes = [g.state_bytes(bytes_per_value) for g in groups]
    if any(n is None for n in sizes):
        return None
    return sum(len(g.layers) * n for g, n in zip(groups, sizes))


def layer_span(layers: list[int]) -> str:
    """0-based indices as the dashboard numbers layers, from 1: "layer 4", "layers 1–3", "layers 1, 3, 5"."""
    shown = [i + 1 for i in layers]
    if len(shown) == 1:
        return f"layer {shown[0]}"
    if shown == list(range(shown[0], shown[-1] + 1)):
        return f"layers {shown[0]}–{shown[-1]}"
    if len(shown) > 4:
        return f"layers {', '.join(map(str, shown[:3]))}, … {shown[-1]}"
    return "layers " + ", ".join(map(str, shown))


@dataclass(frozen=True, slots=True)
class BlockGroup:
    """Decoder blocks of one kind (the one-pass panel draws each kind once). Module paths are where the model keeps
    each part (`module`: the group's first layer; the others relative to it), as `named_modules()` names them."""

    layers: list[int]  # 0-based
    mixer: str  # "attention", "latent attention", "linear attention", "short conv", "SSM"
    mixer_name: str = ""  # the mixer module's class, e.g. "Qwen3NextGatedDeltaNet"
    heads: int = 0  # attention: query heads, K/V heads cached, dims per head
    kv_heads: int = 0
    head_dim: int = 0
    window: int | None = None  # sliding / chunked attention: the window (chunk size)
    window_kind: str = ""  # "sliding" | "chunked" | ""
    positions: str = ""  # "rotary", "ALiBi", "learned" (absolute, added to the embedding), "none"
    rotary_dims: int = 0  # rotary: dims of each head it rotates (fewer than head_dim: partial)
    rope_type: str = ""  # rotary scaling, e.g. "llama3", "yarn" ("" for plain rotary)
    qk_norm: bool = False  # a norm on each query and key head (Qwen3, OLMo 2, Gemma 3)
    mlp: str = "dense"  # "dense", "MoE", "none"
    experts: int = 0  # MoE: routed experts, how many each token uses, shared experts every token uses
    top_k: int = 0
    shared_experts: int = 0
    order: str = "sequential"  # "sequential", "parallel" (attention and MLP on one input), "post-norm", "sandwich"
    norm: str = "RMSNorm"  # the blocks' norms: "RMSNorm", "LayerNorm"
    module: str = ""
    mixer_module: str = ""
    mlp_module: str = ""
    router_module: str = ""  # MoE: its output's first tensor is the router's scores [tokens, experts]
    note: str = ""  # what else the block does, e.g. "attention sinks"


@dataclass(frozen=True, slots=True)
class ModelAnatomy:
    """The parts of one pass around the decoder blocks, read off the module tree (core/model/architecture.py)."""

    blocks: list[BlockGroup]
    layers_module: str = ""  # the decoder blocks' list, e.g. "model.layers"
    embedding_module: str = ""
    positions_module: str = ""  # learned absolute positions added to the embedding (GPT-2's wpe, OPT's)
    embed_scale: float | None = None  # the embedding multiplied by this (Gemma: √hidden; Granite: its multiplier)
    embed_norm_module: str = ""  # a norm right after the embedding (Bloom)
    final_norm: str = ""  # "RMSNorm", "LayerNorm"; "" when the model has none
    final_norm_module: str = ""
    project_module: str = ""  # a projection after the final norm (OPT's project_out)
    head_module: str = ""
    head_bias: bool = False
    logits_ops: list[str] = field(default_factory=list)  # what the model does to the head's output, in order


def formula_terms(groups: list[KVGroup], bytes_per_value: int) -> list[tuple[str, str, str, bool]]:
    """The KV formula per kind of layer, as (long, short, shortest text, grows per position) for the KV panel:
    `2×2 layers×2 heads×16×4 B` for full attention, with `≤15` where a window caps the positions, `2 layers×(16
    latent + 8 rotary)×4 B` for MLA, `2 layers×(conv 128×4 + SSM 128×8)×4 B fixed` for a recurrent state (the
    shortest form gives its values only). `?` where the bytes per value are not known. Per-position kinds first."""
    b = f"{bytes_per_value}" if bytes_per_value else "?"
    out = []
    for g in sorted(groups, key=lambda g: g.kind == "state"):  # what grows per position first, the fixed state last
        n = len(g.layers)
        if g.kind == "none":
            continue
        if g.kind == "state":
            if g.state is None:
                out.append((f"{n} layers × a state of unknown size", f"{n}L×? fixed", f"{n}L×? fixed", False))
                continue
            names = g.state_names or ["state"] * len(g.state)
            short_names = [{"recurrent": "rec"}.get(name, name) for name in names]
            sizes = list(g.state_value_bytes) + [0] * (len(g.state) - len(g.state_value_bytes))
            shapes = ["×".join(map(str, shape)) for shape in g.state]
            if all(not size or size == bytes_per_value for size in sizes):
                long = " + ".join(f"{name} {shape}" for name, shape in zip(names, shapes))
                short = "+".join(f"{name} {shape}" for name, shape in zip(short_names, shapes))
                out.append((f"{n} layers×({long})×{b} B fixed", f"{n}L×({short})×{b} B",
                            f"{n}L×{g.state_values:,}×{b} B fixed", False))
            else:  # a state kept in another dtype than the cache's (float32 SSM states in a 16-bit model)
                long = " + ".join(f"{name} {shape}×{size or b} B" for name, shape, size in zip(names, shapes, sizes))
                short = "+".join(f"{name} {shape}×{size or b}" for name, shape, size in zip(short_names, shapes,
                                                                                          sizes))
                out.append((f"{n} layers×({long}) fixed", f"{n}L×({short}) B",
                            f"{n}L×{g.state_bytes(bytes_per_value):,} B fixed", False))
            continue
        if g.kind == "latent":
            short = f"{n}L×({g.k[1]}+{g.v[1]})×{b} B"
            out.append((f"{n} layers×({g.k[1]} latent + {g.v[1]} rotary)×{b} B", short, short, True))
            continue
        if g.k == g.v:
            long = f"2×{n} layers×{g.k[0]} head{'s' if g.k[0] != 1 else ''}×{g.k[1]}×{b} B"
            short = f"2×{n}L×{g.k[0]}h×{g.k[1]}×{b} B"
        else:
            long = f"{n} layers×({g.k[0]}×{g.k[1]} + {g.v[0]}×{g.v[1]})×{b} B"
            short = f"{n}L×({g.k[0]}×{g.k[1]}+{g.v[0]}×{g.v[1]})×{b} B"
        if g.cap is not None:
            long += f", ≤{g.cap} tokens ({g.kind} {g.window})"
            short += f" ≤{g.cap}"
        out.append((long, short, short, True))
    return out
