"""One pass, taken apart: the stages of one step of a Llama / Qwen2 / Qwen3 model, in order, each with where it
runs, the tensor it produces and its shape, and which part of the step's timing (core/runs/events.py's StepTiming) its
time is counted in.

The pipeline is seed 004's: the token id on the host; the id to the device; the embedding row copy; the decoder
blocks over the residual stream, their attention reading the KV cache; the final RMSNorm; the LM head (tied to the
embedding table or not); temperature, top-k / top-p, softmax and the draw; the chosen id and the reported numbers
back to the host; detokenizing. Shapes come from ModelFacts (read off the loaded model) and the KV length; with a
step, its figures fill the notes (bytes each way, the distribution's shape at each sampler stage, the choice).

`where`: "host" is Python on the CPU; "device" is the model's device (`facts.device`: a GPU, or the CPU itself
when the model runs there). `part`: the StepTiming part the stage's time is in ("forward", "select", "copy",
"detok"; None where no part holds its time: the token id, and a prefill's prompt ids, copied before its timer
starts). A decode step's id going in is written by a fill kernel, inside the forward's span (core/model/timing.py), so
its stage's part is "forward".

No torch here: the dashboard process imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runs.events import ModelFacts, StepEvent

__all__ = ["SUPPORTED", "Stage", "one_pass"]

SUPPORTED = {"LlamaForCausalLM": "Llama", "Qwen2ForCausalLM": "Qwen2", "Qwen3ForCausalLM": "Qwen3"}
ID_BYTES = 8  # an int64 token id


@dataclass(frozen=True)
class Stage:
    name: str
    where: str  # "host" or "device"
    tensor: str  # what it produces, e.g. "hidden [1, 1, 896]"
    shape: tuple[int, ...] | None  # that tensor's shape (None: not a tensor, or its size is not known)
    part: str | None  # the StepTiming part its time is in: "forward", "select", "copy", "detok"; None: in none
    note: str = ""


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


def _bytes(n: int) -> str:
    if n < 10_000:
        return f"{n} bytes"
    return f"{n / 2**10:.1f} KiB" if n < 10 * 2**20 else f"{n / 2**20:.1f} MiB"


def one_pass(facts: ModelFacts, kv_tokens: int, step: StepEvent | None = None, settings=None) -> list[Stage] | str:
    """The stages of one step (module docstring) for a model of `facts`, whose attention reads `kv_tokens` cached
    positions (the step's `kv_tokens`: the cache after its forward, the new position included).

    `step`: the step shown, for its figures; its forward read `timing.h2d_bytes / 8` ids (a prefill's prompt for a
    run's first step), else one. `settings`: the sampler's (default: the step's own). Returns one line instead of
    stages for an architecture it cannot describe, saying what it cannot show.
    """
    family = SUPPORTED.get(facts.architecture)
    if family is None:
        return (f"one pass taken apart covers Llama, Qwen2 and Qwen3 decoders, not {facts.architecture}: its "
                "stages and tensor shapes are not shown (the step's timing split still is)")
    H, V, L = facts.hidden_size, facts.vocab_rows, facts.layers
    heads, kv, d = facts.attention_heads, facts.kv_heads, facts.head_dim
    if min(H, V, L, heads, kv, d) <= 0:
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
    stages = [
        Stage("token id", "host", "id", None, None,
              "the prompt's ids (a prefill)" if rows > 1 else "the token chosen at the previous step"),
        Stage("id to the device", "device", f"input_ids {_dims((1, rows))}", (1, rows), None if rows > 1 else "forward",
              f"{_bytes(h2d)} in: {ids_in}"),
        Stage("embedding", "device", f"hidden {_dims((1, rows, H))}", (1, rows, H), "forward",
              f"a row copy from the [{V}, {H}] table, not a product"),
        Stage(f"{L} decoder blocks", "device", f"residual stream {_dims((1, rows, H))}", (1, rows, H), "forward",
              "each: RMSNorm, attention, add; RMSNorm, MLP, add (each sublayer adds to the stream)"),
        Stage("attention reads the KV cache", "device", f"K, V {_dims((1, kv, kv_tokens, d))} per layer",
              (1, kv, kv_tokens, d), "forward", _attention_note(facts, family, kv_tokens)),
        Stage("final RMSNorm", "device", f"hidden {_dims((1, rows, H))}", (1, rows, H), "forward",
              "sets the scale of the logits, and so what temperature does to them"),
        Stage("LM head", "device", f"logits {_dims((1, V))}", (1, V), "forward", _head_note(facts, rows)),
    ]
    stages += _sampler_stages(V, step, settings, greedy)
    d2h = timing.d2h_bytes if timing is not None else None
    stages += [
        Stage("to the host", "host", "packed selection" + (f" [{d2h // 4}] float32" if d2h else ""),
              (d2h // 4,) if d2h else None, "copy",
              (f"{_bytes(d2h)} out: " if d2h else "") + "the id and the reported candidates' numbers, one copy"
              + (" (on the CPU: their .tolist())" if on_cpu else "")),
        Stage("detokenize", "host", "text", None, "detok", _detok_note(step)),
    ]
    return stages


def _attention_note(facts: ModelFacts, family: str, kv_tokens: int) -> str:
    heads, kv = facts.attention_heads, facts.kv_heads
    if heads != kv and heads % kv == 0:
        share = f"{heads} query heads share {kv} K/V heads, {heads // kv} each (grouped-query attention)"
    else:
        share = f"{heads} query heads, one K/V head each"
    qk = "; RMSNorm on each query and key head" if family == "Qwen3" else ""
    cache = f"; {_bytes(facts.kv_bytes_per_token * kv_tokens)} cached in all" if facts.kv_bytes_per_token else ""
    return f"{kv_tokens} positions; {share}{qk}{cache}"


def _head_note(facts: ModelFacts, rows: int) -> str:
    H, V = facts.hidden_size, facts.vocab_rows
    tied = {True: "tied: the embedding table itself, transposed", False: "untied: a matrix of its own",
            None: "tied or not: not known"}[facts.tied_lm_head]
    last = f"the last of {rows} rows only, " if rows > 1 else ""
    return f"{last}{H} → {V}: [1, {H}] × [{H}, {V}]; {tied}"


def _sampler_stages(V: int, step: StepEvent | None, settings, greedy: bool) -> list[Stage]:
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
        cuts = "; ".join([_cut("top-k", settings.top_k if settings.top_k > 0 else None, step, "top_k_kept"),
                          _cut("top-p", settings.top_p if settings.top_p < 1.0 else None, step, "top_p_kept")])
    soft = ""
    if step is not None:
        soft = (f"{step.kept_count} kept, {step.kept_mass:.1%} of the raw mass; entropy "
                f"{abs(step.sampled_entropy_bits):.2f} bits")  # abs: a one-token distribution's -0.0 reads 0.00
    if greedy:
        draw = "argmax: the highest score, no randomness"
    else:
        draw = "a draw from the kept entries" + (f" (seed {settings.seed})" if settings is not None else "")
    if step is not None:
        draw += f"; id {step.id} {step.piece}, p {step.chosen_prob:.1%}, rank {step.chosen_rank + 1}"
    return [Stage("temperature", "device", scores, (1, V), "select", temperature),
            Stage("top-k / top-p", "device", scores, (1, V), "select", cuts),
            Stage("softmax", "device", probs, (1, V), "select", soft),
            Stage("draw", "device", "id [1]", (1,), "select", draw)]


def _cut(name: str, value, step: StepEvent | None, field: str) -> str:
    if value is None:
        return f"{name} off"
    kept = getattr(step, field, None) if step is not None else None
    return f"{name} {value:g}" + (f": {kept} kept" if kept is not None else "")


def _detok_note(step: StepEvent | None) -> str:
    if step is None:
        return "id → bytes → text; a character split over tokens waits for its last byte"
    if step.special:
        return f"{step.piece}: a special token, no text"
    if step.pending_hex:
        return f"{step.piece}: bytes {step.pending_hex} wait for {step.pending_needed} more"
    return f"{step.piece} → {step.text!r}"
