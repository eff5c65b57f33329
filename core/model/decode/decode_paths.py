"""How the engine will decode a model, chosen once while it loads: the weights prepared in place (q/k/v and
gate/up fused, core/model/quant/fused_linear.py; wide float32 matrices transposed on CPU, core/model/quant/weight_layout.py)
and, with --compile, which compiled step serves the decode (core/model/decode/compiled_lean.py for a 4-bit Llama-family
model, else core/model/decode/compiled.py's whole step), warmed up here (minutes on a small CPU, reported through
`progress`). A 4-bit model the native step serves (core/model/native/native_step.py) is not compiled: that step, one C++
call, measured faster than the compiled lean step (BENCHMARKS.md), and the notice says so. The engine
(core/model/engine.py) owns the result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...runs.events import LoadProgress
from ..quant.fused_linear import FuseReport, fuse_siblings, wanted as fusion_wanted
from ..native.native_step import native_step
from ..speed import SpeedOptions, cpu_cores, use_threads
from ..quant.weight_layout import LayoutReport, plan_wide_weights, transpose_wide_weights

if TYPE_CHECKING:  # annotations only: the compile modules are imported only with --compile
    from .compiled import CompiledDecoder
    from .compiled_lean import CompiledLeanStep

__all__ = ["DecodePaths", "prepare_decode", "NATIVE_INSTEAD"]

NATIVE_INSTEAD = ("--compile: this 4-bit model's native decode step (one C++ call a token) is faster than a compiled "
                  "one, so nothing is compiled: decoding natively")


@dataclass
class DecodePaths:
    """What `prepare_decode` did and chose."""

    layout: LayoutReport = field(default_factory=LayoutReport)  # the wide matrices transposed (none: untouched)
    fusion: FuseReport = field(default_factory=FuseReport)  # the sibling projections fused (none: untouched)
    compiled: CompiledDecoder | None = None  # --compile's whole step; None when not chosen
    compiled_lean: CompiledLeanStep | None = None  # --compile on a 4-bit model: its lean step compiled
    notice: str | None = None  # why --compile does not compile, said first in every run; None: nothing to say

    def drop_failed(self) -> None:
        """A compiled step that stopped (its `failure`) is dropped: runs decode eagerly (the 4-bit model through
        its eager lean step), and the notice says why."""
        for name in ("compiled", "compiled_lean"):
            step = getattr(self, name)
            if step is not None and step.failure is not None:
                self.notice = step.failure
                setattr(self, name, None)


def prepare_decode(model, device, speed: SpeedOptions, top_candidates: int, max_new_tokens: int,
                   max_context: int | None, progress=None) -> DecodePaths:
    """Prepare `model` (in place: same values, faster decode; weight_layout="stock" leaves it untouched) and choose
    its decode path. Eager on a GPU the sibling projections are fused; on CPU the wide float32 projections are
    stored transposed."""
    paths = DecodePaths()
    if fusion_wanted(device.type, speed.weight_layout, speed.compile):
        paths.fusion = fuse_siblings(model)  # q/k/v and gate/up as one product each: fewer launches
    if speed.weight_layout == "auto" and device.type == "cpu":
        # a one-time copy while loading, on every core (faster than one) unless --threads sets fewer
        use_threads(device, speed.threads or cpu_cores())
        plan = plan_wide_weights(model)
        if progress is not None and plan.matrices:  # said before the work, which it names
            progress(LoadProgress(plan.describe_work(), None))
        paths.layout = transpose_wide_weights(model)  # in place: see core/model/quant/weight_layout.py
    if speed.compile:
        _choose_compiled(paths, model, device, speed, top_candidates, max_new_tokens, max_context, progress)
    return paths


def _choose_compiled(paths: DecodePaths, model, device, speed: SpeedOptions, top_candidates: int,
                     max_new_tokens: int, max_context: int | None, progress) -> None:
    from ..architecture import compile_problem
    from .compiled import CompiledDecoder, bucket_for
    from .compiled_lean import CompiledLeanStep

    problem = compile_problem(model)  # sliding / recurrent layers: not compiled at all
    if problem is not None:
        paths.notice = f"{problem}: decoding eagerly"
    elif native_step(model) is not None:
        paths.notice = NATIVE_INSTEAD
    elif (lean := CompiledLeanStep.for_model(model, speed.decode_threads())) is not None:
        # a 4-bit Llama-family model: its lean step compiled whole (faster there, core/model/decode/compiled_lean.py)
        use_threads(device, speed.decode_threads())
        lean.warm_up(model, progress)
        paths.compiled_lean = lean
    else:
        # the whole step (forward + selection, core/model/decode/fused_step.py) as one compiled call
        paths.compiled = CompiledDecoder.for_model(model, speed.decode_threads(), top_candidates)
        bucket = bucket_for(64 + max_new_tokens, max_context)  # a chat prompt
        if bucket is not None:
            use_threads(device, speed.decode_threads())
            paths.compiled.warm_up(bucket, progress)
    paths.drop_failed()
