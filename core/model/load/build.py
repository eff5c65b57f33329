"""Building an engine from an EngineSpec (core/link/protocol.py): headless mode in this process, and the model
process for the dashboard (core/model/process_main.py)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Callable

from ...link.protocol import EngineSpec
from ...runs.events import LoadProgress
from .ahead import start_ahead
from .gguf_route import Route

Progress = Callable[[LoadProgress], None]


def load_engine(spec: EngineSpec, progress: Progress = lambda p: None):
    """Load the model and build an Engine in this process (headless mode, and the model process of the dashboard).

    `progress` gets the load stages in order, each in one stretch, and "ready" (fraction 1.0) once, last.

    The cyclic garbage collector is off while the ~2,500 modules of torch and transformers are imported and the
    model is built (it found nothing to free there and cost ~0.7 s of a 4-s start); the objects that survive are
    then frozen out of later collections, so the dashboard's and the decode loop's collections stay short. Before
    those imports, a later start of a GGUF that runs as stored has its matrices copied into huge-page memory on a
    thread (core/model/load/ahead.py: `start_ahead`), and the huge-page memory of the rest reserved (`reserve_ahead`);
    the load closes the one and trims the other once the matrices are placed."""
    was_enabled = gc.isenabled()
    gc.disable()
    reserved, route, copying = 0, None, None
    try:
        copying = start_ahead(spec)  # first: its copies run beside every import below
        reserved, route = reserve_ahead(spec, copying.planned_bytes if copying else 0)
        from ..engine import Engine
        from .loader import STAGE_READY, load_model
        from ..speed import SpeedOptions

        loaded = load_model(spec.model, device=spec.device, dtype=spec.dtype, device_map=spec.device_map,
                            trust_remote_code=spec.trust_remote_code, allow_pickle=spec.allow_pickle,
                            quantize=spec.quantize, progress=progress, ready=False, route=route)
        reserved = _trim(reserved)  # every matrix placed: what was not used goes back
        engine = Engine(loaded, spec.sampler, spec.options, speed=SpeedOptions(compile=spec.compile,
                                                                                threads=spec.threads,
                                                                                weight_layout=spec.weight_layout,
                                                                                kv_shapes=spec.kv_shapes),
                        progress=progress)
        progress(LoadProgress(STAGE_READY, 1.0))  # the last load event: after the weight layout and any compile
        return engine
    finally:
        _trim(reserved)
        if copying is not None:
            copying.close()  # every matrix placed: a copy not taken goes back
        if was_enabled:
            gc.freeze()
            gc.enable()


def reserve_ahead(spec: EngineSpec, copied_ahead: int = 0) -> tuple[int, Route | None]:
    """Where `spec` names a GGUF file on disk that will run as stored on ggml's kernels (already built: nothing is
    built here), start the huge-page memory its matrices are copied into being faulted in, on a thread, before the
    load imports transformers (core/model/quant/ggml_linear.py's reserve_huge_pages: the kernel's search for huge
    pages then overlaps the imports instead of following them). -> (the bytes reserved, 0 for none; the file's
    route where it runs as stored, for the load to take rather than parse the file again, else None).
    `copied_ahead`: the bytes core/model/load/ahead.py is copying into huge pages of its own already, not reserved
    again."""
    path = Path(spec.model).expanduser() if spec.model else None
    if path is None or path.suffix.lower() != ".gguf" or not path.is_file() or spec.quantize != "none":
        return 0, None
    try:
        from .gguf_route import gguf_route
        from .loader import resolve_device

        route = gguf_route(spec.dtype, resolve_device(spec.device), spec.device_map, path, lambda _: None,
                           build=False)
        if route.kind != "stored":  # (another route may be built or refused by the load itself)
            return 0, None
        from ..quant.ggml_linear import reserve_huge_pages
        from .gguf_stored import huge_page_bytes

        return reserve_huge_pages(huge_page_bytes(route.reader) - copied_ahead), route
    except Exception:  # a guess ahead of the load only: the load itself says what is wrong, in its own order
        return 0, None


def _trim(reserved: int) -> int:
    """Close the reservation `reserve_ahead` made (nothing where it made none); -> 0, nothing left open."""
    if reserved:
        from ..quant.ggml_linear import trim_reserved

        trim_reserved()
    return 0
