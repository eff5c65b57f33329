"""The native decode step: a 4-bit Llama-family model's whole decode step as one C++ call
(core/model/native/decode_step.cpp, built into the library of core/model/native/q4_native.py), the default where it builds.

Why: in the eager lean step (core/model/decode/lean_step.py) the host operations between the 121 kernel calls are about
half of a step; `--compile` removes most of them but first compiles for minutes. This step has none of them: one
call from the token's embedding row to the final norm, the norms, rotation, cache writes, attention and SiLU done
in C++ loops between the same kernels (tokentui's, core/model/native/q4_native.py: a model packed for torch's int4 kernel
decodes with the eager lean step). The rotation's cos / sin come from the model's own rotary module (so every RoPE
variant transformers knows), and the head stays the model's own module (a QLMHead), called once.

Its scores are not the model's forward's bit for bit: its sums run in another order. So `decode_step_for(model)`
accepts it only where, on three tokens after a four-token prompt (scratch caches), its final hidden states are
within `TOLERANCES` of the eager lean step's, which equals the model's forward bit for bit;
tests/unit/test_native_step.py holds it to the float32 reference (teacher-forced, closer than llama-server), to `generate`'s greedy ids on tiny
Llama / Qwen2 / Qwen3 models, and to the eager step's cache rows. Where it is refused, cannot be built, or the cache
is not growable (bucketed `--kv-shapes`), the eager lean step decodes.

For the attention and sublayer views (issue 39), inside `queries_into(catch)` the step also writes each layer's rotated
query heads (and, where asked, its residual stream) into `catch` (a QueryCatch), from which core/model/observe/
attention_native.py computes the new token's weights over the cached keys (sublayers_native.py the sublayer norms):
the views stay on the native step, and a step outside it passes no buffer.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from ..decode.buffers import growable_layers
from ..decode.lean_step import LeanDecoder, lean_decoder, stacked_weights
from .q4_native import NativeQ4, NativeQ4I16

# max |difference| of the final norm's output from the eager lean step's, relative to its largest |value|, for the
# step to be accepted, by what the kernel rounds the activations to (Int4Kernel.activations). float32: sums in
# another order differ by ~1e-6 of that. int16: a sum one rounding away moves an activation by a step of its group's
# int16 scale, and 30 layers amplify it: measured up to 7e-4 over 128 steps of the embedded model and 7e-3 on its
# --quantize int4 copy (docs/design-record.md, "The native decode step"). A wrong weight, rotation or cache row differs by far more than either.
TOLERANCES = {"float32": 1e-4, "int16": 3e-2}
_QUERIES = threading.local()  # .catch: this thread's QueryCatch while `queries_into` is active (absent: none)
_STEPS: "weakref.WeakKeyDictionary[object, NativeStep | None]" = weakref.WeakKeyDictionary()
_LOCK = threading.RLock()


def _kernels(decoder: LeanDecoder) -> set[str]:
    """The names of the 4-bit kernels the decoder's layers are packed for."""
    return {module.kernel.name for layer in decoder.layers
            for module in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)}


def _activation_is_silu(act: nn.Module) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLU", "SiLUActivation")


class NativeStep:
    """One model's native decode step: `step(token_id, cache) -> logits [V]`, as LeanDecoder's (core/model/decode/
    steps.py's NativeCpp decodes a run with it). Get one with `native_step`."""

    def __init__(self, decoder: LeanDecoder):
        layers = decoder.layers
        if not all(_activation_is_silu(layer.act) for layer in layers):
            raise ValueError("an MLP activation other than SiLU")
        epsilons = {n.variance_epsilon for layer in layers
                    for n in (layer.norm1, layer.norm2, layer.q_norm, layer.k_norm) if n is not None}
        epsilons.add(decoder.norm.variance_epsilon)
        scales = {layer.attn.scaling for layer in layers}
        if len(epsilons) != 1 or len(scales) != 1:
            raise ValueError("layers differ in their norm epsilon or attention scale")
        if len({tuple(layer.gate_up.widths) for layer in layers}) != 1 or layers[0].gate_up.widths[0] * 2 != sum(
                layers[0].gate_up.widths):
            raise ValueError("gate and up of unequal widths")
        kernels = _kernels(decoder)
        if len(kernels) != 1 or not kernels <= {NativeQ4.name, NativeQ4I16.name}:
            raise ValueError("matrices packed for another kernel than one of tokentui's")
        self._int16 = kernels == {NativeQ4I16.name}
        self.activations = layers[0].qkv.kernel.activations  # what the kernel rounds them to: TOLERANCES' key
        self.decoder = decoder
        self._eps = float(epsilons.pop())
        self.scale = float(scales.pop())  # attention's (the layers' `scaling`)
        self._stacked = stacked_weights(decoder)
        if any(t is not None and t.dtype not in (torch.float32, torch.uint8) for t in self._stacked):
            raise ValueError("weights of another dtype than float32")

    @torch.inference_mode()
    def step(self, token_id: int, cache) -> torch.Tensor:
        """One token through the model, extending `cache` (after a prefill: its layers hold buffers) -> logits
        [V]; the eager lean step where the cache is of another kind."""
        return self.decoder.head(self.hidden(token_id, cache))[0]

    @torch.inference_mode()
    def hidden(self, token_id: int, cache) -> torch.Tensor:
        """`step` up to the head: the final norm's output [1, H] (the eager lean step's where the cache is not
        growable).

        Shapes: x [1, H]; cos / sin [D] for this position; the buffers [1, KV, capacity, D], row `position`
        written by the C++ step, which the layers then count."""
        layers = growable_layers(cache)
        decoder = self.decoder
        if layers is None:
            return decoder.hidden(token_id, cache)
        position = cache.get_seq_length()
        ids = torch.full((1,), token_id, dtype=torch.long, device=decoder.device)  # [1]
        x = F.embedding(ids, decoder.embed.weight)  # [1, H]
        cos, sin = decoder.rotary(x, torch.full((1, 1), position, dtype=torch.long, device=decoder.device))
        buffers = [layer.room_for_one() for layer in layers]
        catch = getattr(_QUERIES, "catch", None)  # the attention view's (queries_into); None while it is off
        hidden = torch.ops.tokentui_q4.decode_step(
            x, position, cos.reshape(-1).float().contiguous(), sin.reshape(-1).float().contiguous(),
            [k for k, _ in buffers], [v for _, v in buffers], self._stacked, decoder.norm.weight, decoder.heads,
            decoder.kv_heads, self._eps, self.scale, self._int16,
            None if catch is None else catch.queries,
            None if catch is None else catch.residuals)  # [1, H]; queries [L, heads, D]; residuals [L, 4, H]
        for layer in layers:
            layer.count_one()
        if catch is not None:
            catch.position, catch.layers = position, layers
        return hidden


class QueryCatch:
    """Where this thread's native steps put each layer's query while `queries_into(catch)` is active: `queries` [L,
    heads, D] float32, the query heads after the rotation (Qwen3: after their norm), as the step's attention used
    them; made with `residuals=True`, also `residuals` [L, 4, H]: each layer's stream entering it, attention's and
    the MLP's contributions, the stream leaving it (else None). After a step, `position` (its query's) and `layers`
    (the cache's layers, whose `keys` then end at that position), None until a step wrote them. The attention and
    sublayer views read them (core/model/observe/attention_native.py, sublayers_native.py)."""

    def __init__(self, step: "NativeStep", residuals: bool = False):
        decoder = step.decoder
        self.queries = torch.empty(len(decoder.layers), decoder.heads, decoder.head_dim)
        self.residuals = torch.empty(len(decoder.layers), 4, decoder.embed.weight.shape[1]) if residuals else None
        self.scale = step.scale
        self.kv_heads = decoder.kv_heads
        self.position: int | None = None
        self.layers: list | None = None

    def clear(self) -> None:
        self.position = self.layers = None


@contextlib.contextmanager
def queries_into(catch: QueryCatch):
    """While active, the native steps this thread runs write their queries into `catch` (a step on a cache that is
    not growable decodes with the eager lean step and writes none: `catch.position` stays None)."""
    saved = getattr(_QUERIES, "catch", None)
    _QUERIES.catch = catch
    try:
        yield catch
    finally:
        _QUERIES.catch = saved


def close_enough(ours: torch.Tensor, lean: torch.Tensor, activations: str) -> bool:
    """`ours` within the tolerance for a kernel with these `activations` (TOLERANCES) of `lean`, relative to its
    largest |value|; every value finite."""
    bound = TOLERANCES[activations] * max(1.0, float(lean.abs().max()))
    return bool(torch.isfinite(ours).all()) and float((ours - lean).abs().max()) <= bound


def _close_to_lean(model, native: NativeStep) -> bool:
    """Three tokens after a four-token prompt, through `native` and the eager lean step on scratch caches: the
    final norm's outputs `close_enough`. (Not the scores: a head that recomputes its best scores in float32, a
    QLMHead of --quantize, may pick another set at the boundary for a hidden state one rounding away, and both are
    the same module anyway.)"""
    from ..decode.adapter import forward_last_logits, new_cache

    decoder = native.decoder
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a few small steps: on a busy 2-core machine two threads only wait on each other
    try:
        prompt = torch.tensor([[1, 2, 3, 4]], device=decoder.device)
        ours, theirs = new_cache(model, 8), new_cache(model, 8)
        forward_last_logits(model, prompt, ours)
        forward_last_logits(model, prompt, theirs)
        return all(close_enough(native.hidden(token, ours), decoder.hidden(token, theirs), native.activations)
                   for token in (5, 6, 7))
    finally:
        torch.set_num_threads(threads)


def native_step(model) -> NativeStep | None:
    """The native step for `model` (made and checked once per model), or None where it does not serve it."""
    with _LOCK:
        if model not in _STEPS:
            _STEPS[model] = found = None
            decoder = lean_decoder(model)
            # packed for tokentui's kernels, the library is loaded already (a model on torch's builds nothing here)
            if decoder is not None and decoder.device.type == "cpu" and _kernels(decoder) <= {NativeQ4.name,
                                                                                           NativeQ4I16.name}:
                try:
                    candidate = NativeStep(decoder)
                    found = candidate if _close_to_lean(model, candidate) else None
                except (ValueError, RuntimeError):  # a shape or a weight the C++ step does not take
                    found = None
            _STEPS[model] = found
        return _STEPS[model]


def decode_step_for(model) -> NativeStep | LeanDecoder | None:
    """The step a 4-bit model's eager runs decode with (core/model/decode/plan.py chooses by the same order): the
    native step where it serves the model, else the eager lean step, else None (the model's own forward)."""
    return native_step(model) or lean_decoder(model)


@contextlib.contextmanager
def disabled(model):
    """Engines made for `model` meanwhile decode with the eager lean step instead of the native one (their decode
    plan is chosen as they are made; for measuring one against the other: benchmarks/bench_quant.py)."""
    saved = native_step(model)
    with _LOCK:
        _STEPS[model] = None
    try:
        yield
    finally:
        with _LOCK:
            _STEPS[model] = saved
