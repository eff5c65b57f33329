"""`--compile` for a 4-bit Llama-family model: the lean decode step (core/model/decode/lean_step.py) compiled whole.

Why (measured: docs/design-record.md, "Where a 4-bit step's time goes"): in the eager lean step the 121 int4 kernel calls are
about half of a step. The rest is some 1,000 small host operations between them, each slower than alone, since a
kernel has just streamed megabytes through the caches. Here the whole step is one graph: all layers unrolled, the
4-bit kernel called as the eager step calls it (either kernel of core/model/quant/int4_kernel.py), and everything between the kernel calls (norms, the rotation, the
cache writes, residuals, SiLU, the casts) fused by inductor into a few generated loops per layer. Attention is
written out (two batched products and a softmax): for one query, torch's flash-attention kernel cost more than
that. The general `--compile` path (core/model/decode/compiled.py: transformers' forward on a static cache) measured
slower than the eager lean step on 4-bit models, so a model the lean step serves compiles this instead; and a model
the native step serves (core/model/native/native_step.py, one C++ call a token, faster still) compiles nothing
(core/model/decode/plan.py).

* Only two sizes are dynamic: the position and the length of the cache's buffers are symbols. One graph serves
  every position and every buffer size, so it compiles once per process. Every other size (the weights' and the
  activations', the buffers' other dims) is marked static and the body's float constants (the norm epsilon, the
  attention scale) specialized while it compiles (`_compiling`): left symbolic, dynamo traced the body twice and
  reasoned about every size as a symbol, several times slower to start (docs/design-record.md,
  "Two dynamic sizes"). After warm-up every call runs under `fail_on_recompile`: a call that would compile again raises instead,
  and the step falls back to the eager lean step for good (`failure` says why).
* The weights and the KV buffers are the graph's inputs, never constants: nothing is copied, and the graph reads
  whatever model and cache it is given (dynamo's guards check their shapes and dtypes; the model's sizes are
  closure constants, which the guards check too).
* It writes into the run's own cache (core/model/decode/buffers.py's GrowableBuffers): room for one more position,
  the graph writes that row of every layer, then the layers count it. Whatever else reads the cache (KV bytes,
  branching's crop, the logit lens's forward) sees what the eager step would leave, up to rounding.
* Scores are not bit-identical to the eager step's: the generated loops sum in another order, and with torch's
  int4 kernel a float32 value on the other side of a bfloat16 rounding moves a kernel score by one bfloat16 step
  (the EXACT_SCORES highest are recomputed in float32 by the head, which stays eager, as in the eager step). tests/unit/test_compiled_lean.py
  holds it to the eager 4-bit path's oracle (teacher-forced against the float32 reference, closer than
  llama-server) and to the eager step's scores and cache rows within bfloat16 rounding.
* Inductor bakes the thread count into the generated loops; the engine compiles at its decode thread count.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from typing import Callable

import torch
import torch.nn.functional as F

from ...runs.events import LoadProgress
from .buffers import GrowableBuffers, growable_layers
from .compiled import elapsed_reports
from ..quant.gguf_quant import GROUP
from .lean_step import LeanDecoder, lean_decoder, llama_layer, stacked_weights
from ..quant.int4_kernel import TorchInt4

_WARMUP_PROMPT = 6  # positions written before the compiling calls: ints 0 and 1 would be specialized by dynamo
_DECODERS: "weakref.WeakKeyDictionary[object, dict[int, CompiledLeanStep]]" = weakref.WeakKeyDictionary()
_LOCK = threading.RLock()


def _same(values, what: str):
    """The one value every layer has for `what` (the compiled body holds it as a constant)."""
    found = set(values)
    if len(found) != 1:
        raise ValueError(f"layers differ in {what}")
    return found.pop()


def _make_body(decoder: LeanDecoder, act, eps: float, scale: float, width: int, dtype: torch.dtype):
    """The step from the embedding row to the final norm, as a function of tensors only (what is compiled).

    Shapes: x [1, H]; cos / sin [1, 1, 1, D]; kbufs / vbufs per layer [1, KV, capacity, D], row `pos` written;
    stacked: lean_step.stacked_weights' 13 kinds, each [L, ...] or None; returns the final norm's output [1, H]."""
    heads, kv_heads, dim = decoder.heads, decoder.kv_heads, decoder.head_dim
    q_width, group = heads * dim, heads // kv_heads
    kernel = decoder.layers[0].qkv.kernel  # one kernel for the whole model (core/model/quant/qlinear.py chose it)
    if len({id(module.kernel) for layer in decoder.layers for module in (layer.qkv, layer.o_proj, layer.gate_up,
                                                                         layer.down)}) != 1:
        raise ValueError("layers differ in their 4-bit kernel")

    if isinstance(kernel, TorchInt4):  # the aten op itself: what this step has always been measured with
        mm = torch.ops.aten._weight_int4pack_mm_for_cpu

        def product(h: torch.Tensor, packed: torch.Tensor, scale_zeros: torch.Tensor) -> torch.Tensor:
            return mm(h.to(kernel.activation_dtype), packed, GROUP, scale_zeros).to(dtype)
    else:  # an opaque op with a shape function: the compiled graph calls the same kernel the eager step does
        def product(h: torch.Tensor, packed: torch.Tensor, scale_zeros: torch.Tensor) -> torch.Tensor:
            return kernel.mm(h.to(kernel.activation_dtype).contiguous(), packed, scale_zeros).to(dtype)

    def norm(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(h, weight.shape, weight, eps)

    def body(x, pos: int, cos, sin, kbufs, vbufs, stacked, norm_weight):
        for index in range(len(kbufs)):
            kbuf, vbuf = kbufs[index], vbufs[index]

            def attend(q, k, v, kbuf=kbuf, vbuf=vbuf):
                kbuf[:, :, pos:pos + 1].copy_(k)
                vbuf[:, :, pos:pos + 1].copy_(v)
                # attention written out: one query per head, each kv head's `group` query heads as one batch row
                # (the grouping transformers' repeat_kv makes); two small products and a softmax
                scores = torch.bmm(q[0].view(kv_heads, group, dim), kbuf[0, :, :pos + 1].transpose(1, 2))
                out = torch.bmm(torch.softmax(scores * scale, dim=-1), vbuf[0, :, :pos + 1])  # [KV, group, D]
                return out.reshape(1, q_width)

            weights = tuple(None if kind is None else kind[index] for kind in stacked)
            x = llama_layer(x, cos, sin, weights, (heads, kv_heads, dim, width), norm, product, attend, act)
        return F.rms_norm(x, norm_weight.shape, norm_weight, eps)

    return body


@contextlib.contextmanager
def _compiling(x, cos, sin, buffers, stacked, norm_weight):
    """Around a call that may compile: every size static but the buffers' length (dim 2) and the position, the
    body's float constants specialized, and inductor's chatter kept off the terminal (the module docstring)."""
    for tensor in [x, cos, sin, norm_weight, *(t for t in stacked if t is not None)]:
        torch._dynamo.mark_static(tensor)
    for buffer in (b for pair in buffers for b in pair):  # [1, KV, capacity, D]: only the capacity varies
        for dim in (0, 1, 3):
            torch._dynamo.mark_static(buffer, dim)
    with warnings.catch_warnings(), torch._dynamo.config.patch(specialize_float=True):
        warnings.simplefilter("ignore")
        yield


class CompiledLeanStep:
    """The lean step of one model, compiled (the module docstring); `step(token_id, cache) -> logits [V]` as
    LeanDecoder's (core/model/decode/steps.py's CompiledLean decodes a run with it). Get one with `for_model`."""

    def __init__(self, decoder: LeanDecoder, threads: int):
        self.decoder, self.threads = decoder, int(threads)
        self.failure: str | None = None  # why it stopped; the eager lean step serves every later call
        self._warm = False
        layers = decoder.layers
        eps = _same([layer.norm1.variance_epsilon for layer in layers]
                    + [layer.norm2.variance_epsilon for layer in layers] + [decoder.norm.variance_epsilon]
                    + [n.variance_epsilon for layer in layers for n in (layer.q_norm, layer.k_norm) if n is not None],
                    "norm epsilon")
        _same([type(layer.act) for layer in layers], "activation")
        body = _make_body(decoder, layers[0].act,
                          float(eps), float(_same([layer.attn.scaling for layer in layers], "attention scale")),
                          _same([layer.gate_up.widths[0] for layer in layers], "MLP width"),
                          decoder.embed.weight.dtype)
        self._stacked = stacked_weights(decoder)
        self._body = torch.compile(body, dynamic=True, fullgraph=True)

    @classmethod
    def for_model(cls, model, threads: int) -> "CompiledLeanStep | None":
        """One per model and thread count (None where the lean step does not serve `model`, or the model's layers
        differ in a size the body holds as one constant)."""
        decoder = lean_decoder(model)
        if decoder is None:
            return None
        with _LOCK:
            per_model = _DECODERS.setdefault(model, {})
            if threads not in per_model:
                try:
                    per_model[threads] = cls(decoder, threads)
                except ValueError:
                    return None
            return per_model[threads]

    # -------------------------------------------------------------------------------------------- the step
    def step(self, token_id: int, cache) -> torch.Tensor:
        """One token through the model, extending `cache` (after a prefill: its layers hold buffers) -> logits
        [V]; the eager lean step where this one cannot serve (`failure`, or a cache of another kind)."""
        layers = growable_layers(cache)
        if self.failure is not None or layers is None:
            return self.decoder.step(token_id, cache)
        stance = torch.compiler.set_stance("fail_on_recompile") if self._warm else contextlib.nullcontext()
        try:
            with stance:
                return self._compiled_step(token_id, cache, layers)
        except Exception as err:  # a recompile (the guard above) or a compile error: the eager step from here
            text = (str(err).strip().splitlines() or [""])[0][:120]
            why = ("the decode step would compile again" if "fail_on_recompile" in text
                   else f"the decode step could not be compiled: {type(err).__name__}: {text}")
            self.failure = f"--compile stopped ({why}): decoding eagerly"
            return self.decoder.step(token_id, cache)

    @torch.inference_mode()
    def _compiled_step(self, token_id: int, cache, layers: list[GrowableBuffers]) -> torch.Tensor:
        decoder = self.decoder
        position = cache.get_seq_length()
        ids = torch.full((1,), token_id, dtype=torch.long, device=decoder.device)  # [1]
        x = F.embedding(ids, decoder.embed.weight)  # [1, H]
        cos, sin = decoder.rotary(x, torch.full((1, 1), position, dtype=torch.long, device=decoder.device))
        buffers = [layer.room_for_one() for layer in layers]  # the graph writes row `position` of each
        # only a call that may compile needs `_compiling` (warm, a compile raises instead)
        with _compiling(x, cos, sin, buffers, self._stacked, decoder.norm.weight) if not self._warm \
                else contextlib.nullcontext():
            hidden = self._body(x, position, cos.unsqueeze(1), sin.unsqueeze(1), [k for k, _ in buffers],
                                [v for _, v in buffers], self._stacked, decoder.norm.weight)
        for layer in layers:
            layer.count_one()
        return decoder.head(hidden)[0]

    def warm_up(self, model, progress: Callable[[LoadProgress], None] | None = None) -> None:
        """Compile now (`model`: the one this step was made for), on a scratch cache: a short prefill, then the
        calls that compile."""
        if self._warm or self.failure is not None:
            return
        from .adapter import forward_last_logits, new_cache

        stage = "compiling the 4-bit decode step (once per process; minutes the first time on a small CPU)"
        with elapsed_reports(stage, progress), torch.inference_mode():
            cache = new_cache(model, _WARMUP_PROMPT + 4)
            forward_last_logits(model, torch.arange(_WARMUP_PROMPT, device=self.decoder.device)[None], cache)
            for token in (1, 2):
                self.step(token, cache)
        self._warm = self.failure is None
