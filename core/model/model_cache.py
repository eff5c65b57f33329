"""What every way of loading a model shares: the names of the load stages the user sees, the progress callback's
type, and the atomic writer of a converted model's cache folder (core/model/loader.py's float32 conversion and
core/model/gguf_load.py's packed 4-bit weights)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from ..errors import ModelLoadError
from ..runs.events import LoadProgress

STAGE_FIND = "finding the model"
STAGE_GGUF_TOKENIZER = "reading the GGUF tokenizer (first start only)"
STAGE_GGUF_READ = "reading the GGUF file (first start only)"
STAGE_GGUF_DEQUANT = "de-quantizing GGUF tensors (first start only)"
STAGE_GGUF_SAVE = "saving the converted weights (first start only)"
STAGE_WEIGHTS = "reading weights"
STAGE_QUANTIZE = "quantizing the weights to 4 bits (--quantize int4)"
STAGE_READY = "ready"

Progress = Callable[[LoadProgress], None]


def write_cache(target: Path, write: Callable[[Path], None], source: Path) -> None:
    """Fill the cache folder `target` atomically: `write(tmp)` fills a fresh folder beside it, marked complete and
    then renamed into place, so a killed process never leaves a half-written cache in use."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _remove_abandoned(target)
    try:
        tmp.mkdir()
        write(tmp)
        (tmp / ".complete").write_text(json.dumps({"source": str(source), "time": time.time()}))
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelLoadError(f"cannot write the model cache in {target.parent} ({err.strerror}); "
                             "set TOKENTUI_CACHE_DIR to a writable folder") from err


def _remove_abandoned(target: Path) -> None:
    """Delete half-written copies of `target` left by a process that was killed while saving (their pid is in
    the name): each can be as large as the model."""
    for leftover in target.parent.glob(f".{target.name}.*.tmp"):
        try:
            pid = int(leftover.name.rsplit(".", 2)[-2])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(leftover, ignore_errors=True)
        except (ValueError, OSError):
            pass  # not ours to judge (another user's process, or an odd name): leave it
