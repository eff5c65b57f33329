"""How the engine will decode a model, chosen once while it loads (`choose_plan`), into a DecodePlan the engine owns.

First the weights are prepared in place (q/k/v and gate/up fused, core/model/quant/fused_linear.py; wide float32
matrices transposed on CPU, core/model/quant/weight_layout.py). Then one decode step (core/model/decode/steps.py)
is chosen from the architecture, the weights' formats, the device and the flags, in this order:

    --compile, a model with sliding / recurrent layers   not compiled (a Notice says why): as without --compile
    --compile, a 4-bit model the native step serves      the native step (faster than a compiled one: BENCHMARKS.md;
                                                         nothing is compiled, a Notice says so)
    --compile, a 4-bit Llama-family model                the lean step compiled whole (warmed up here: minutes)
    --compile, any other model                           the whole step (forward + selection) compiled on a static
                                                         cache; runs too long for it decode as without --compile
    --compile, a model whose matrices are ggml rows      not compiled (ggml's products are C++ calls; a Notice says
                                                         so): as without --compile
    bucketed KV shapes (--kv-shapes; auto: on CUDA)      transformers' forward (the 4-bit steps need exact lengths)
    ggml rows (a GGUF as stored, an HF folder viewed     the native ggml step (one C++ call a token, each matrix in
    as them) of a family the ggml step serves            its own format, ggml's kernels)
    ggml rows, any other family                          transformers' forward (the modules call ggml's kernels);
                                                         the description says why not the native ggml step
    a 4-bit model the native step serves (CPU)           the native step (one C++ call a token)
    a 4-bit Llama-family model                           the lean torch step (the forward's scores bit for bit)
    any other model                                      transformers' forward

A GGUF's later start without transformers' model (core/model/load/gguf_direct.py) takes `direct_plan`: the native
ggml step its first start's plan chose, made from the file, with the same description; with --compile or bucketed KV
shapes the model is built and `choose_plan` chooses as above.

The plan's `description` says which step runs and why, in one line (the model panel shows it: ModelFacts
.decode_plan). A compiled step that stops (`failure`) is dropped for the step it falls back to (`drop_failed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...runs.events import LoadProgress
from ..native.ggml_native import ggml_step, why_not as ggml_why_not
from ..native.native_step import native_step
from ..native.q4_native import NativeQ4, NativeQ4I16
from ..quant.fused_linear import FuseReport, fuse_siblings, wanted as fusion_wanted
from ..quant.ggml_linear import GGMLLinear
from ..quant.qlinear import quantized_modules
from ..quant.weight_layout import LayoutReport, plan_wide_weights, transpose_wide_weights
from ..speed import SpeedOptions, cpu_cores, use_threads
from .lean_step import LeanDecoder, lean_decoder
from .run_cache import RunCache
from .static_cache import bucketing_problem, describe, kv_shapes_for
from .steps import CompiledLean, CompiledWhole, DecodeStep, LeanTorch, NativeCpp, NativeGGML, TorchForward

__all__ = ["DecodePlan", "NATIVE_INSTEAD", "choose_plan", "direct_plan"]

NATIVE_INSTEAD = ("--compile: this 4-bit model's native decode step (one C++ call a token) is faster than a compiled "
                  "one, so nothing is compiled: decoding natively")
GGML_NOT_COMPILED = ("--compile: this model's matrices are multiplied by ggml's kernels (C++ calls torch.compile does "
                     "not trace), so nothing is compiled: decoding eagerly")


@dataclass
class DecodePlan:
    """The decode step an engine runs (`step`), why (`description`, one line), and what preparing the weights did.
    `kv_cache`: the model facts' line on the eager cache (core/model/decode/static_cache.py's `describe`)."""

    step: DecodeStep
    description: str
    kv_cache: str
    layout: LayoutReport = field(default_factory=LayoutReport)  # the wide matrices transposed (none: untouched)
    fusion: FuseReport = field(default_factory=FuseReport)  # the sibling projections fused (none: untouched)
    notice: str | None = None  # why --compile does not compile, said first in every run; None: nothing to say
    fallback: DecodeStep | None = None  # what serves once a compiled `step` stops (None: nothing compiled)

    def new_cache(self, tokens: int, max_new_tokens: int) -> tuple[RunCache, str | None]:
        """A run's cache for `tokens` ids and up to `max_new_tokens` more, with the step that fills it, and a
        Notice text (None: nothing to say)."""
        return self.step.new_cache(tokens, max_new_tokens)

    @property
    def compiled(self):
        """--compile's whole decode step (core/model/decode/compiled.py's CompiledDecoder) where it serves; else None."""
        return self.step.decoder if isinstance(self.step, CompiledWhole) else None

    def drop_failed(self) -> None:
        """A compiled step that stopped (its `failure`) is dropped for its fallback (the eager step, for a 4-bit
        model the eager lean one), and the notice says why."""
        if self.fallback is not None and self.step.failure is not None:
            self.notice = self.step.failure
            self.step, self.fallback = self.fallback, None


def direct_plan(direct, speed: SpeedOptions, max_context: int | None, quant) -> DecodePlan | None:
    """The plan for a GGUF's later start without transformers' model (core/model/load/gguf_direct.py's DirectModel):
    the native ggml step, as `choose_plan` chooses it for the same file's model (whose matrices are all ggml's:
    nothing to fuse or transpose). None where the flags ask for what needs the model (--compile, bucketed KV
    shapes): the caller builds it and calls `choose_plan`."""
    device = torch.device("cpu")
    if speed.compile or kv_shapes_for(speed.kv_shapes, device) or quant is None:
        return None
    if speed.weight_layout == "auto":
        use_threads(device, speed.threads or cpu_cores())  # as choose_plan's preparation sets them
    step = NativeGGML.over(direct, max_context)
    return DecodePlan(step=step, description=f"native ggml step: {_weights(quant, None)}; lens via torch",
                      kv_cache=describe(False, None, speed.kv_shapes))


def _ggml_rows(model) -> bool:
    """Whether the model's matrices are ggml rows (GGMLLinear: a GGUF as stored, an HF folder viewed as them)."""
    return any(isinstance(module, GGMLLinear) for module in model.modules())


def _weights(quant, model) -> str:
    """The weights' format, in a few words, from the model facts' QuantFacts (None: float weights, unless the model
    holds 4-bit modules the facts do not describe)."""
    if quant is None:
        return "4-bit weights" if quantized_modules(model) else "float weights"
    return f"{quant.blocks} weights (--quantize)" if quant.quantized_here else f"{quant.blocks} weights as stored"


def _why_not_native(decoder: LeanDecoder) -> str:
    if decoder.device.type != "cpu":
        return "not on CPU (the native step's)"
    kernels = {module.kernel.name for layer in decoder.layers for module in (layer.qkv, layer.down)}
    if not kernels <= {NativeQ4.name, NativeQ4I16.name}:
        return "torch's int4 kernel (not the native one)"
    return "the native step does not serve it"


def choose_plan(model, device, speed: SpeedOptions, top_candidates: int, max_new_tokens: int,
                max_context: int | None, quant=None, progress=None) -> DecodePlan:
    """Prepare `model` (in place: same values, faster decode; weight_layout="stock" leaves it untouched) and choose
    its decode step (the module docstring). `quant`: the model facts' QuantFacts (None: float weights), named in
    the description."""
    layout, fusion = LayoutReport(), FuseReport()
    if fusion_wanted(device.type, speed.weight_layout, speed.compile):
        fusion = fuse_siblings(model)  # q/k/v and gate/up as one product each: fewer launches
    if speed.weight_layout == "auto" and device.type == "cpu":
        # a one-time copy while loading, on every core (faster than one) unless --threads sets fewer
        use_threads(device, speed.threads or cpu_cores())
        wide = plan_wide_weights(model)
        if progress is not None and wide.matrices:  # said before the work, which it names
            progress(LoadProgress(wide.describe_work(), None))
        layout = transpose_wide_weights(model)  # in place: see core/model/quant/weight_layout.py
    problem = bucketing_problem(model) if speed.kv_shapes != "dynamic" else None
    bucketed = kv_shapes_for(speed.kv_shapes, device) and problem is None
    kv_line = describe(bucketed, problem, speed.kv_shapes)
    eager, why = _eager_choice(model, bucketed, max_context, quant, kv_line, problem)
    plan = DecodePlan(step=eager, description=why, kv_cache=kv_line, layout=layout, fusion=fusion)
    if speed.compile:
        _choose_compiled(plan, model, device, speed, top_candidates, max_new_tokens, max_context, quant, bucketed,
                         problem, progress)
    lens = "lens via torch" if plan.step.lens else "no lens"
    plan.description = f"{plan.description}; {lens}"
    return plan


def _eager_choice(model, bucketed: bool, max_context, quant, kv_line: str, kv_problem: str | None
                  ) -> tuple[DecodeStep, str]:
    """The step without --compile, and the description's line for it."""
    weights = _weights(quant, model)
    ggml = _ggml_rows(model)
    if not bucketed and ggml:
        found = ggml_step(model)
        if found is not None:
            return NativeGGML(model, found, max_context), f"native ggml step: {weights}"
    if not bucketed:
        native = native_step(model)
        if native is not None:
            return NativeCpp(model, native, max_context), f"native step: {weights}"
        decoder = lean_decoder(model)
        if decoder is not None:
            return (LeanTorch(model, decoder, max_context),
                    f"lean torch step: {weights}; {_why_not_native(decoder)}")
    reasons = [weights]
    if ggml:
        reasons.append("the native ggml step needs exact lengths, not buckets" if bucketed
                       else f"no native ggml step ({ggml_why_not(model)})")
    if quantized_modules(model):
        reasons.append("the 4-bit steps need exact lengths, not buckets" if bucketed and LeanDecoder.supports(model)
                       else "no lean 4-bit step for this architecture")
    reasons.append(kv_line.split(":")[0] + " cache" + (f" (not bucketed: {kv_problem})" if kv_problem else ""))
    return TorchForward(model, max_context, bucketed), f"transformers' forward: {'; '.join(reasons)}"


def _choose_compiled(plan: DecodePlan, model, device, speed: SpeedOptions, top_candidates: int,
                     max_new_tokens: int, max_context, quant, bucketed: bool, kv_problem, progress) -> None:
    from ..architecture import compile_problem
    from .compiled import CompiledDecoder, bucket_for
    from .compiled_lean import CompiledLeanStep

    problem = compile_problem(model)  # sliding / recurrent layers: not compiled at all
    if problem is not None:
        plan.notice = f"{problem}: decoding eagerly"
        plan.description += f"; not compiled ({problem})"
        return
    if isinstance(plan.step, NativeCpp):
        plan.notice = NATIVE_INSTEAD
        plan.description += "; --compile keeps it (faster)"
        return
    if _ggml_rows(model):
        plan.notice = GGML_NOT_COMPILED
        plan.description += "; not compiled (ggml's kernels)"
        return
    if (lean := CompiledLeanStep.for_model(model, speed.decode_threads())) is not None:
        # a 4-bit Llama-family model: its lean step compiled whole (faster there, core/model/decode/compiled_lean.py)
        use_threads(device, speed.decode_threads())
        lean.warm_up(model, progress)
        plan.step, plan.fallback = CompiledLean(model, lean, max_context), LeanTorch(model, lean.decoder, max_context)
        plan.description = f"compiled lean step: --compile; {_weights(quant, model)}"
    else:
        # the whole step (forward + selection, core/model/decode/fused_step.py) as one compiled call
        decoder = CompiledDecoder.for_model(model, speed.decode_threads(), top_candidates)
        bucket = bucket_for(64 + max_new_tokens, max_context)  # a chat prompt
        if bucket is not None:
            use_threads(device, speed.decode_threads())
            decoder.warm_up(bucket, progress)
        fallback = plan.step
        plan.step, plan.fallback = CompiledWhole(decoder, fallback, max_context), fallback
        plan.kv_cache = describe(bucketed, kv_problem, speed.kv_shapes, compiled=True)
        plan.description = f"compiled whole step: --compile, static cache; longer runs: {fallback.name}"
    plan.drop_failed()
