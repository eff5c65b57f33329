"""Building an engine from an EngineSpec (core/link/protocol.py): headless mode in this process, and the model
process for the dashboard (core/model/process_main.py)."""

from __future__ import annotations

import gc
from typing import Callable

from ...link.protocol import EngineSpec
from ...runs.events import LoadProgress

Progress = Callable[[LoadProgress], None]


def load_engine(spec: EngineSpec, progress: Progress = lambda p: None):
    """Load the model and build an Engine in this process (headless mode, and the model process of the dashboard).

    `progress` gets the load stages in order, each in one stretch, and "ready" (fraction 1.0) once, last.

    The cyclic garbage collector is off while the ~2,500 modules of torch and transformers are imported and the
    model is built (it found nothing to free there and cost ~0.7 s of a 4-s start); the objects that survive are
    then frozen out of later collections, so the dashboard's and the decode loop's collections stay short."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        from ..engine import Engine
        from .loader import STAGE_READY, load_model
        from ..speed import SpeedOptions

        loaded = load_model(spec.model, device=spec.device, dtype=spec.dtype, device_map=spec.device_map,
                            trust_remote_code=spec.trust_remote_code, allow_pickle=spec.allow_pickle,
                            quantize=spec.quantize, progress=progress, ready=False)
        engine = Engine(loaded, spec.sampler, spec.options, speed=SpeedOptions(compile=spec.compile,
                                                                                threads=spec.threads,
                                                                                weight_layout=spec.weight_layout,
                                                                                kv_shapes=spec.kv_shapes),
                        progress=progress)
        progress(LoadProgress(STAGE_READY, 1.0))  # the last load event: after the weight layout and any compile
        return engine
    finally:
        if was_enabled:
            gc.freeze()
            gc.enable()
