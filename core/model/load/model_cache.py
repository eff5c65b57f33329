"""What every way of loading a model shares: the names of the load stages the user sees, the progress callback's
type, and what a converted model goes through before it is cached (core/model/load/loader.py's float32 conversion and
core/model/load/gguf_load.py's packed 4-bit weights): its first pass must give finite scores (`check_first_pass`), and
its cache folder is written atomically (`write_cache`), or not at all, with a notice, where it cannot be written."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from ...errors import ModelLoadError, error_line
from ...runs.events import LoadProgress

STAGE_FIND = "finding the model"
STAGE_GGUF_TOKENIZER = "reading the GGUF tokenizer (first start only)"
STAGE_GGUF_READ = "reading the GGUF file (first start only)"
STAGE_GGUF_DEQUANT = "de-quantizing GGUF tensors (first start only)"
STAGE_GGUF_SAVE = "saving the converted weights (first start only)"
STAGE_WEIGHTS = "reading weights"
STAGE_QUANTIZE = "quantizing the weights to 4 bits (--quantize int4)"
STAGE_READY = "ready"

Progress = Callable[[LoadProgress], None]


def write_cache(target: Path, write: Callable[[Path], None], source: Path) -> str | None:
    """Fill the cache folder `target` atomically: `write(tmp)` fills a fresh folder beside it, marked complete and
    then renamed into place, so a killed process never leaves a half-written cache in use.

    None once written. Where it cannot be (a read-only or full disk, a cache path through a file) nothing is left
    behind and the notice to show comes back instead: the model just converted runs from memory, and the next start
    converts it again."""
    from safetensors import SafetensorError  # what safetensors' writer raises for a failed write (a full disk)

    tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_abandoned(target)
        tmp.mkdir()
        write(tmp)
        (tmp / ".complete").write_text(json.dumps({"source": str(source), "time": time.time()}))
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    except (OSError, SafetensorError) as err:
        shutil.rmtree(tmp, ignore_errors=True)
        why = err.strerror if isinstance(err, OSError) and err.strerror else error_line(err)
        return (f"the model cache is off: {target.parent} cannot be written ({why}), so this model was converted "
                "in memory and will be again at every start; set TOKENTUI_CACHE_DIR to a writable folder")
    return None


def write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all (a file beside it renamed into place); where the cache cannot be
    written, nothing: the next start does the work again."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def check_first_pass(model, tokenizer, source: Path) -> None:
    """Refuse (ModelLoadError) a model just converted from `source` whose scores for a few tokens are not all
    finite: its weights are broken (such a model would stop every run at its first step with NaN scores), and it
    must not be cached as a good model. One forward pass, before the cache is written."""
    import torch

    try:
        ids = tokenizer.encode("The first pass of a model", add_special_tokens=True)
    except Exception:  # a tokenizer that cannot encode this: the first token ids will do
        ids = []
    ids = torch.tensor([ids[:8] or [0]])
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False).logits
    if not bool(torch.isfinite(logits).all()):
        raise ModelLoadError(f"{source}: corrupt model weights: its scores for the first tokens are NaN or "
                             "infinite, before any setting could cause it; download it again or pass another "
                             "--model")


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
