"""One pass, taken apart: the stages of one step of a decoder, in order, each with where it runs, the tensor it
produces and its shape, and which part of the step's timing (core/runs/events.py's StepTiming) its time is counted in.

The pipeline is seed 004's: the token id on the host; the id to the device; the embedding row copy (with what a
family adds there: learned positions, a scale, a norm); the decoder blocks over the residual stream, one pair of
stages per kind of block (core/runs/architecture.py's BlockGroup: what the block does, then what its mixer reads —
the KV cache of full, sliding or chunked attention, MLA's latent, or a recurrent layer's fixed-size state — and, for
a mixture-of-experts block, its router); the final norm; the LM head (tied to the embedding table or not) and what
the model does to its output; temperature, top-k / top-p, softmax and the draw; the chosen id and the reported
numbers back to the host; detokenizing. Shapes come from ModelFacts (read off the loaded model's config and module
tree: `facts.anatomy`, `facts.kv_groups`) and the KV length; with a step, its figures fill the notes (bytes each way,
the distribution's shape at each sampler stage, the choice). tests/unit/test_architecture_matrix.py checks every
shape against the model's own tensors (forward hooks on `Stage.module`, the cache's tensors for `Stage.layers`).

`where`: "host" is Python on the CPU; "device" is the model's device (`facts.device`: a GPU, or the CPU itself
when the model runs there). `part`: the StepTiming part the stage's time is in ("forward", "select", "copy",
"detok"; None where no part holds its time: the token id, and a prefill's prompt ids, copied before its timer
starts). A decode step's id going in is written by a fill kernel, inside the forward's span (core/model/observe/timing.py), so
its stage's part is "forward".

Model facts without `anatomy` (a record from before it, a served model) are taken apart only for the Llama, Qwen2
and Qwen3 families, whose blocks the older facts describe; anything else gets one line saying what is not shown.

No torch here: the dashboard process imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...runs.architecture import BlockGroup, KVGroup, ModelAnatomy, kv_bytes_at, layer_span
from ...runs.events import StepEvent
from ...runs.facts import ModelFacts
from ...runs.scoring import percent
from ...samplers import backend_gaps, cut_stage_names, stage_summary

__all__ = ["LEGACY", "Stage", "one_pass"]

# families whose blocks model facts without `anatomy` describe (records from before it)
LEGACY = {"LlamaForCausalLM": "Llama", "Qwen2ForCausalLM": "Qwen2", "Qwen3ForCausalLM": "Qwen3"}
ID_BYTES = 8  # an int64 token id


@dataclass(frozen=True)
class Stage:
    name: str
    where: str  # "host" or "device"
    tensor: str  # what it produces, e.g. "hidden [1, 1, 896]"
    shape: tuple[int, ...] | None  # that tensor's shape (None: not a tensor, or its size is not known)
    part: str | None  # the StepTiming part its time is in: "forward", "select", "copy", "detok"; None: in none
    note: str = ""
    also: tuple[int, ...] | None = None  # a second tensor's shape (V where it differs from K, a second state)
    module: str = ""  # the module whose output `shape` is, as named_modules() names it ("": none, or not one)
    layers: tuple[int, ...] = ()  # the decoder layers (0-based) a block's stages stand for


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


def _bytes(n: int) -> str:
    if n < 10_000:
        return f"{n} bytes"
    return f"{n / 2**10:.1f} KiB" if n < 10 * 2**20 else f"{n / 2**20:.1f} MiB"


def _legacy(facts: ModelFacts) -> tuple[ModelAnatomy, list[KVGroup]] | None:
    """The anatomy older model facts imply for a Llama / Qwen2 / Qwen3 model (RMSNorm blocks, rotary positions, full
    attention, a dense MLP; Qwen3's norm on each query and key head)."""
    family = LEGACY.get(facts.architecture)
    if family is None or not (facts.layers and facts.kv_heads and facts.head_dim and facts.attention_heads):
        return None
    layers = list(range(facts.layers))
    block = BlockGroup(layers=layers, mixer="attention", heads=facts.attention_heads, kv_heads=facts.kv_heads,
                       head_dim=facts.head_dim, positions="rotary", qk_norm=family == "Qwen3")
    kv = KVGroup("full", layers, k=[facts.kv_heads, facts.head_dim], v=[facts.kv_heads, facts.head_dim])
    return ModelAnatomy(blocks=[block], final_norm="RMSNorm"), [kv]


def one_pass(facts: ModelFacts, kv_tokens: int, step: StepEvent | None = None, settings=None) -> list[Stage] | str:
    """The stages of one step (module docstring) for a model of `facts`, whose attention reads `kv_tokens` cached
    positions (the step's `kv_tokens`: the cache after its forward, the new position included).

    `step`: the step shown, for its figures; its forward read `timing.h2d_bytes / 8` ids (a prefill's prompt for a
    run's first step), else one. `settings`: the sampler's (default: the step's own). Returns one line instead of
    stages for a model it cannot describe, saying what it cannot show.
    """
    if facts.anatomy is not None and facts.kv_groups is not None:
        anatomy, groups = facts.anatomy, facts.kv_groups
    else:
        legacy = _legacy(facts)
        if legacy is None:
            return (f"one pass taken apart needs the model's blocks, which these model facts do not carry "
                    f"({facts.architecture}): its stages and tensor shapes are not shown (the step's timing split "
                    "still is)")
        anatomy, groups = legacy
    H, V, L = facts.hidden_size or 0, facts.vocab_rows or 0, facts.layers or 0
    if min(H, V, L) <= 0 or not anatomy.blocks:
        return f"one pass taken apart needs the model's shapes, and these facts lack some ({facts.name})"
    timing = step.timing if step is not None else None
    rows = max(1, timing.h2d_bytes // ID_BYTES) if timing is not None else 1  # ids the forward read
    settings = settings if settings is not None else (step.settings if step is not None else None)
    greedy = step.greedy if step is not None else (settings.is_greedy if settings is not None else False)
    h2d = timing.h2d_bytes if timing is not None else rows * ID_BYTES
    on_cpu = facts.device.startswith("cpu")  # no bus to cross: "copies" are the host's own writes and reads
    ids_in = ("the prompt's int64 ids, copied before the prefill's timer starts" if rows > 1 else
              "one int64 id written into the model's input (on the CPU: no bus), timed with the forward" if on_cpu
              else "one int64 id, a fill kernel's argument (no copy), timed with the forward")
    hidden = (1, rows, H)
    embed = f"a row copy from the [{V}, {H}] table, not a product"
    if anatomy.embed_scale is not None:
        embed += f"; then × {anatomy.embed_scale:g}"
    stages = [
        Stage("token id", "host", "id", None, None,
              "the prompt's ids (a prefill)" if rows > 1 else "the token chosen at the previous step"),
        Stage("id to the device", "device", f"input_ids {_dims((1, rows))}", (1, rows), None if rows > 1 else "forward",
              f"{_bytes(h2d)} in: {ids_in}"),
        Stage("embedding", "device", f"hidden {_dims(hidden)}", hidden, "forward", embed,
              module=anatomy.embedding_module),
    ]
    if anatomy.positions_module:
        stages.append(Stage("learned positions", "device", f"positions {_dims(hidden)}", hidden, "forward",
                            "each position's row of a learned table, added to its token's embedding",
                            module=anatomy.positions_module))
    if anatomy.embed_norm_module:
        stages.append(Stage("embedding LayerNorm", "device", f"hidden {_dims(hidden)}", hidden, "forward",
                            "a norm on the embedding, before the first block", module=anatomy.embed_norm_module))
    total = _cached_bytes(facts, groups, kv_tokens)
    for block in anatomy.blocks:
        stages += _block_stages(facts, anatomy.blocks, block, groups, kv_tokens, rows, total)
    if anatomy.final_norm:
        stages.append(Stage(f"final {anatomy.final_norm}", "device", f"hidden {_dims(hidden)}", hidden, "forward",
                            "sets the scale of the logits, and so what temperature does to them",
                            module=anatomy.final_norm_module))
    stages.append(Stage("LM head", "device", f"logits {_dims((1, V))}", (1, V), "forward",
                        _head_note(facts, anatomy, rows), module=anatomy.head_module))
    stages += _sampler_stages(V, step, settings, greedy, on_cpu and facts.server is None)
    d2h = timing.d2h_bytes if timing is not None else None
    stages += [
        Stage("to the host", "host", "packed selection" + (f" [{d2h // 4}] float32" if d2h else ""),
              (d2h // 4,) if d2h else None, "copy",
              (f"{_bytes(d2h)} out: " if d2h else "") + "the id and the reported candidates' numbers, one copy"
              + (" (on the CPU: their .tolist())" if on_cpu else "")),
        Stage("detokenize", "host", "text", None, "detok", _detok_note(step)),
    ]
    return stages


def _cached_bytes(facts: ModelFacts, groups: list[KVGroup], kv_tokens: int) -> int | None:
    """The whole cache's bytes at `kv_tokens` positions (None: not known). Older facts lack the bytes per value:
    for their full-attention layers, the per-token figure times the positions is the same thing."""
    if facts.kv_bytes_per_value:
        return kv_bytes_at(groups, kv_tokens, facts.kv_bytes_per_value)
    if facts.kv_bytes_per_token and all(g.kind == "full" for g in groups):
        return facts.kv_bytes_per_token * kv_tokens
    return None


# ---- the blocks ------------------------------------------------------------------------------------------------

_MIXER_WORDS = {"attention": "attention", "latent attention": "latent attention", "linear attention":
                "linear attention", "short conv": "short conv", "SSM": "SSM mixer"}


def _block_label(block: BlockGroup, blocks: list[BlockGroup]) -> str:
    """What sets this kind of block apart from the model's others, in a word or three ("decoder" when there is
    one kind): the mixer (a window kind among attention blocks), the MLP, NoPE."""
    if len(blocks) == 1:
        return "decoder"
    words = []
    windows = {b.window_kind for b in blocks if b.mixer == "attention"}
    if len({b.mixer for b in blocks}) > 1:
        words.append(block.mixer.replace(" ", "-"))
    if block.mixer == "attention" and len(windows) > 1:
        words[-1:] = [block.window_kind or "full"]
    if len({b.mlp for b in blocks}) > 1:
        words.append(block.mlp if block.mlp != "none" else "no-MLP")
    if block.mixer == "attention" and len({b.positions for b in blocks if b.mixer == "attention"}) > 1 and (
            block.positions == "none" or not words):
        words.append("NoPE" if block.positions == "none" else block.positions)
    return " · ".join(words) or "decoder"


def _block_note(block: BlockGroup, blocks: list[BlockGroup]) -> str:
    mixer = _MIXER_WORDS.get(block.mixer, block.mixer)
    mlp = {"dense": "MLP", "MoE": "MoE MLP"}.get(block.mlp, "")
    n = block.norm or "a norm"
    if not mlp:
        text = f"each: {n}, {mixer}, add (no MLP)"
    elif block.order == "parallel":
        text = f"each: {mixer} and {mlp} side by side, each reading the block's input through a {n}, both added"
    elif block.order == "post-norm":
        text = f"each: {mixer}, {n}, add; {mlp}, {n}, add (the norms after the sublayers)"
    elif block.order == "sandwich":
        text = f"each: {n}, {mixer}, {n}, add; {n}, {mlp}, {n}, add (a norm either side)"
    else:
        text = f"each: {n}, {mixer}, add; {n}, {mlp}, add (each sublayer adds to the stream)"
    if block.note:
        text += f"; {block.note}"
    return text if len(blocks) == 1 else f"{layer_span(block.layers)}; {text}"


def _block_stages(facts, blocks: list[BlockGroup], block: BlockGroup, groups: list[KVGroup], kv_tokens: int,
                  rows: int, total: int | None) -> list[Stage]:
    H, n = facts.hidden_size, len(block.layers)
    label = _block_label(block, blocks)
    name = f"{n} {label} block{'s' if n != 1 else ''}"
    layers = tuple(block.layers)
    out = [Stage(name, "device", f"residual stream {_dims((1, rows, H))}", (1, rows, H), "forward",
                 _block_note(block, blocks), module=block.module, layers=layers)]
    kv = next((g for g in groups if block.layers[0] in g.layers and (g.kind == "state") == (
        block.mixer in ("linear attention", "short conv", "SSM"))), None)
    if kv is not None:
        out.append(_mixer_stage(facts, block, kv, kv_tokens, total, layers))
    if block.mlp == "MoE" and block.experts:
        shared = (f", plus {block.shared_experts} shared expert{'s' if block.shared_experts != 1 else ''} every "
                  "token goes through") if block.shared_experts else ""
        out.append(Stage(f"router: top-{block.top_k} of {block.experts}", "device",
                         f"router scores {_dims((rows, block.experts))}", (rows, block.experts), "forward",
                         f"each token's MLP is {block.top_k} of {block.experts} expert MLPs, weighted by the "
                         f"router{shared}", module=f"{block.module}.{block.router_module}", layers=layers))
    return out


def _mixer_stage(facts, block: BlockGroup, kv: KVGroup, kv_tokens: int, total: int | None,
                 layers: tuple[int, ...]) -> Stage:
    cached = f"; {_bytes(total)} cached in all" if total else ""
    if kv.kind == "state":
        shapes = [(1, *s) for s in (kv.state or [])]
        names = kv.state_names or ["state"] * len(shapes)
        text = (" + ".join(f"{w} {_dims(s)}" for w, s in zip(names, shapes)) + " per layer" if shapes else
                "its state (size not known before a forward)")
        per = (kv.state_bytes(facts.kv_bytes_per_value) or 0) if facts.kv_bytes_per_value else 0
        note = (f"{block.mixer_name or block.mixer}: a fixed-size state instead of a KV cache"
                + (f", {_bytes(per)} per layer, the same at every step" if per else "") + cached)
        return Stage(f"{_MIXER_WORDS.get(block.mixer, block.mixer)} reads its state", "device", text,
                     shapes[0] if shapes else None, "forward", note,
                     also=shapes[1] if len(shapes) > 1 else None, layers=layers)
    held = kv.held(kv_tokens)
    if kv.kind == "latent":
        k, v = (1, kv.k[0], held, kv.k[1]), (1, kv.v[0], held, kv.v[1])
        note = (f"{held} positions; {block.heads} query heads read one compressed latent of {kv.k[1]} and a "
                f"rotary key of {kv.v[1]} per position, expanded to keys and values on the fly{cached}")
        return Stage("latent attention reads the KV cache", "device",
                     f"latent {_dims(k)} + rotary key {_dims(v)} per layer", k, "forward",
                     _with_positions(note, block), also=v, layers=layers)
    k = (1, kv.k[0], held, kv.k[1])
    v = (1, kv.v[0], held, kv.v[1])
    return Stage("attention reads the KV cache", "device", f"K, V {_dims(k)} per layer", k, "forward",
                 _attention_note(block, kv, kv_tokens, held, cached), also=v if v != k else None, layers=layers)


def _attention_note(block: BlockGroup, kv: KVGroup, kv_tokens: int, held: int, cached: str) -> str:
    heads, kvh = block.heads, block.kv_heads
    if heads and kvh == 1 and heads > 1:
        share = f"{heads} query heads share one K/V head (multi-query attention)"
    elif heads and kvh and heads != kvh and heads % kvh == 0:
        share = f"{heads} query heads share {kvh} K/V heads, {heads // kvh} each (grouped-query attention)"
    else:
        share = f"{heads} query heads, one K/V head each"
    if kv.kind == "sliding":
        where = f"{held} of {kv_tokens} positions (a sliding window of {kv.window}: the layer keeps {kv.cap})"
    elif kv.kind == "chunked":
        where = f"{held} of {kv_tokens} positions (chunks of {kv.window}: a token sees its own chunk's)"
    else:
        where = f"{kv_tokens} positions"
    qk = "; RMSNorm on each query and key head" if block.qk_norm else ""
    extra = f"; {kv.note}" if kv.note else ""
    return _with_positions(f"{where}; {share}{qk}{extra}{cached}", block)


def _with_positions(note: str, block: BlockGroup) -> str:
    if block.positions == "ALiBi":
        return note + "; ALiBi: a per-head bias by distance, no position vectors"
    if block.positions == "none":
        return note + "; no position encoding in this layer (NoPE)"
    if block.positions == "learned":
        return note + "; positions are learned vectors added at the embedding"
    if block.positions == "rotary" and (block.rope_type or (block.rotary_dims and block.head_dim and
                                                            block.rotary_dims < block.head_dim)):
        partial = (f" on {block.rotary_dims} of {block.head_dim} dims" if block.rotary_dims and block.head_dim and
                   block.rotary_dims < block.head_dim else "")
        scaling = f" ({block.rope_type} scaling)" if block.rope_type else ""
        return note + f"; rotary positions{partial}{scaling}"
    return note


def _head_note(facts: ModelFacts, anatomy: ModelAnatomy, rows: int) -> str:
    H, V = facts.hidden_size, facts.vocab_rows
    tied = {True: "tied: the embedding table itself, transposed", False: "untied: a matrix of its own",
            None: "tied or not: not known"}[facts.tied_lm_head]
    last = f"the last of {rows} rows only, " if rows > 1 else ""
    bias = " plus a bias" if anatomy.head_bias else ""
    then = "; then " + ", then ".join(anatomy.logits_ops) if anatomy.logits_ops else ""
    return f"{last}{H} → {V}: [1, {H}] × [{H}, {V}]{bias}; {tied}{then}"


def _sampler_stages(V: int, step: StepEvent | None, settings, greedy: bool, local_cpu: bool = False) -> list[Stage]:
    """Step 4's stages. `local_cpu`: a model run here on the CPU, whose selection is one native call unless the
    settings use a stage that call lacks (core/samplers.py `backend_gaps`): then the line says the torch one ran."""
    scores, probs = f"scores {_dims((1, V))}", f"probs {_dims((1, V))}"
    if greedy:
        temperature = "greedy: none (argmax of the logits)"
        cuts = "greedy: nothing cut"
    elif settings is None:
        temperature, cuts = "logits ÷ T", "keep the best k, then the smallest set past p"
    else:
        t = settings.temperature
        temperature = "T = 1: unchanged" if t == 1.0 else f"÷ {t:g}"
        if step is not None and step.temp_entropy_bits is not None:
            temperature += f": entropy {step.entropy_bits:.2f} → {step.temp_entropy_bits:.2f} bits"
        cuts = "; ".join(stage_summary(settings, step, exact=True, kept=": {} kept"))
        gaps = backend_gaps(settings, "native") if local_cpu else []
        if gaps:
            cuts += f" (torch selection: the native one has no {', '.join(gaps)})"
    soft = ""
    if step is not None:
        soft = (f"{step.kept_count} kept, {percent(step.kept_mass, 1)} of the raw mass; entropy "
                f"{abs(step.sampled_entropy_bits):.2f} bits")  # abs: a one-token distribution's -0.0 reads 0.00
    if greedy:
        draw = "argmax: the highest score, no randomness"
    else:
        draw = "a draw from the kept entries" + (f" (seed {settings.seed})" if settings is not None else "")
    if step is not None:
        draw += f"; id {step.id} {step.piece}, p {percent(step.chosen_prob, 1)}, rank {step.chosen_rank + 1}"
    return [Stage("temperature", "device", scores, (1, V), "select", temperature),
            Stage(cut_stage_names(settings), "device", scores, (1, V), "select", cuts),
            Stage("softmax", "device", probs, (1, V), "select", soft),
            Stage("draw", "device", "id [1]", (1,), "select", draw)]


def _detok_note(step: StepEvent | None) -> str:
    if step is None:
        return "id → bytes → text; a character split over tokens waits for its last byte"
    if step.special:
        return f"{step.piece}: a special token, no text"
    if step.pending_hex:
        return f"{step.piece}: bytes {step.pending_hex} wait for {step.pending_needed} more"
    return f"{step.piece} → {step.text!r}"
