"""Finding and loading a model: the embedded SmolLM2 GGUF, any `.gguf` file, a local folder, or a hub id
from the user's cache. Every failure becomes one actionable line (`ModelLoadError`).

On CPU a GGUF runs as stored by default (core/model/load/gguf_route.py chooses): a file whose matrices are all
Q4_0 / Q4_1 / Q4_K by tokentui's own 4-bit kernels (core/model/load/gguf_load.py: converted once into packed 4-bit
tensors, cached), any other by ggml's kernels over the file's memory-mapped bytes (core/model/load/gguf_stored.py).
Otherwise, and with --dtype float32 (the exact de-quantized reference), GGUF files are de-quantized by transformers
on every load (~25 s on 2 CPU cores for 135M parameters), so the first load converts once and caches plain
safetensors + tokenizer under the user cache dir; later starts take seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from ...errors import ModelLoadError, SettingsError, error_line
from ...runs.events import LoadProgress
from ...runs.facts import ModelFacts
from ...paths import cache_dir
from .config_check import check_model_folder, load_report_line
from .gguf_check import check_gguf, fast_transformers_parse
from .gguf_route import Route, gguf_route
from .tokenizer_cache import cached_tokenizer, save_tokenizer, settled
from .model_facts import model_facts
from .model_cache import (STAGE_FIND, STAGE_GGUF_DEQUANT, STAGE_GGUF_READ, STAGE_GGUF_SAVE, STAGE_GGUF_TOKENIZER,
                          STAGE_QUANTIZE, STAGE_READY, STAGE_WEIGHTS, Progress, check_first_pass, write_cache)
from .precheck import (EMBEDDED, EMBEDDED_NAME, embedded_gguf, hub_offline, no_cuda_message, parse_device,
                       resolve_model, too_few_cuda_message)

__all__ = ["EMBEDDED", "EMBEDDED_NAME", "LoadedModel", "embedded_gguf", "load_model", "model_facts",
           "resolve_device", "resolve_dtype", "converted_gguf_dir"]

DTYPES = ("auto", "float32", "bfloat16", "float16")
# Stage names, in the order they come; each reads after the dashboard's "loading " prefix.


class LoadedModel:
    """A loaded model: transformers' model, its tokenizer and facts, and `notice`, said in the first run (why a model
    converted here was not cached; why a GGUF on CPU does not run as stored). A later start of a GGUF kept as stored
    has `direct` (core/model/load/gguf_direct.py's DirectModel: the ggml step made from the file) and no
    transformers' model until something reads `model`, which builds it then, once."""

    def __init__(self, model, tokenizer, facts: ModelFacts, notice: str | None = None, direct=None):
        if (model is None) == (direct is None):
            raise ValueError("a loaded model has transformers' model or a direct step, one of the two")
        self._model = model
        self.tokenizer = tokenizer
        self.facts = facts
        self.notice = notice
        self.direct = direct

    @property
    def model(self):
        """transformers' model (for a GGUF's later start, built now if it was not: gguf_direct.py)."""
        return self._model if self._model is not None else self.direct.model()


def _noop(_: LoadProgress) -> None:
    pass


# ---------------------------------------------------------------------------------------------- device/dtype
def resolve_device(device: str):
    """The torch device for `--device` (format and messages shared with core/model/load/precheck.py)."""
    import torch

    text, kind, index = parse_device(device)
    if kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SettingsError(no_cuda_message(text))
    if index is not None and index >= torch.cuda.device_count():
        raise SettingsError(too_few_cuda_message(text, torch.cuda.device_count()))
    return torch.device(text)


def resolve_dtype(dtype: str, device):
    import torch

    dtype = (dtype or "auto").strip().lower()
    if dtype not in DTYPES:
        raise SettingsError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "auto":
        # bf16 halves the bytes each decode step reads on a GPU; on CPU fp32 prefill is several times faster.
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float16 if device.type == "cuda" else torch.float32
    value = getattr(torch, dtype)
    if value is torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise SettingsError("--dtype bfloat16: this GPU cannot compute in bfloat16; use --dtype float16")
    return value


# ---------------------------------------------------------------------------------------------- GGUF cache
@contextlib.contextmanager
def _gguf_progress(progress: Progress, block_types: set[str] | None = None):
    """Route transformers' GGUF de-quantization progress bar to our callback instead of the terminal.

    transformers prints it with tqdm straight to stderr, which would scribble over the dashboard; its module
    imports `tqdm` by name, so we swap that name for the duration of the load.
    """
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - layout changed: just no fine-grained progress
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)

    def reporting_tqdm(iterable, desc=None, **_):
        """The fraction is of the file's tensor bytes de-quantized (the work is per byte, and one embedding
        table can outweigh dozens of norms), sent when it moves by a percent or more."""
        items = list(iterable)
        sizes = [max(int(getattr(item, "n_bytes", 1) or 1), 1) for item in items]
        total = max(sum(sizes), 1)
        done = 0
        sent = -1.0
        if block_types is not None:  # what the file stores, read off the tensors transformers de-quantizes
            block_types.update(t.name for t in (getattr(item, "tensor_type", None) for item in items) if t)
        for item, size in zip(items, sizes):
            fraction = done / total
            if fraction - sent >= 0.01:
                progress(LoadProgress(STAGE_GGUF_DEQUANT, fraction))
                sent = fraction
            yield item  # transformers de-quantizes it now, in its loop body
            done += size
        progress(LoadProgress(STAGE_GGUF_DEQUANT, 1.0))

    gguf_utils.tqdm = reporting_tqdm
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _gguf_cache_key(path: Path) -> str:
    import transformers

    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{int(st.st_mtime)}|{transformers.__version__}"
    return f"{path.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def converted_gguf_dir(path: Path, progress: Progress = _noop
                       ) -> tuple[Path, object | None, object | None, str | None]:
    """Return (folder of safetensors + tokenizer converted from `path`, model, tokenizer, notice).

    On first use the GGUF is checked (core/model/load/gguf_check.py), de-quantized, its first pass checked, saved, and the
    just-converted model and tokenizer are returned too (no second load); later calls return (folder, None, None,
    None). `notice`: why the conversion was not saved (a cache folder that cannot be written; the folder is then
    absent and the model in memory is all there is).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import torch

    _quiet_transformers()  # imported now: its progress bars off too
    target = cache_dir() / "converted" / _gguf_cache_key(path)
    if (target / "config.json").is_file() and (target / ".complete").is_file():
        return target, None, None, None
    folder, name = str(path.parent), path.name
    check_gguf(path)  # its metadata against its tensors, before transformers builds anything from them
    try:
        # No fraction for these two: transformers gives no progress for them (the GGUF's vocabulary and merges
        # become a tokenizer; the file's metadata becomes a config and an empty model).
        progress(LoadProgress(STAGE_GGUF_TOKENIZER, None))
        with fast_transformers_parse():
            tokenizer = settled(AutoTokenizer.from_pretrained(folder, gguf_file=name))  # as later starts read it
        progress(LoadProgress(STAGE_GGUF_READ, None))
        block_types: set[str] = set()
        with _gguf_progress(progress, block_types), fast_transformers_parse():
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except ModelLoadError:
        raise
    except Exception as err:
        raise ModelLoadError(f"{path}: corrupt, truncated or unsupported GGUF file ({_first_line(err)}); "
                             "download it again or pass another --model") from err
    # transformers refuses save_pretrained on a GGUF-loaded model ("quantized with gguf and is not
    # serializable") although the de-quantized weights are plain tensors: drop the quantizer marks first.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    check_first_pass(model, tokenizer, path)  # cached only once its first scores are numbers
    progress(LoadProgress(STAGE_GGUF_SAVE, None))

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        save_tokenizer(tmp, tokenizer)  # with whether a later start may read it without transformers
        (tmp / BLOCKS_FILE).write_text(json.dumps(sorted(block_types)))

    notice = write_cache(target, write, source=path)
    return target, model, tokenizer, notice


BLOCKS_FILE = "gguf_block_types.json"  # in a converted folder: the GGUF block types its weights were stored as
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


def dequantized_from(folder: Path, gguf_file: Path) -> str | None:
    """The quantized block types of the GGUF a converted `folder` was de-quantized from (ModelFacts.dequantized_from),
    e.g. "Q4_1+Q8_0"; None when the file holds only float tensors or cannot be read. Written at conversion; a folder
    converted before that gets it from the file's tensor table once (gguf-py: a few seconds, no tensor data read)."""
    saved = folder / BLOCKS_FILE
    try:
        types = json.loads(saved.read_text())
    except (OSError, ValueError):
        try:
            from gguf import GGUFReader

            types = sorted({t.tensor_type.name for t in GGUFReader(str(gguf_file)).tensors})
        except Exception:  # an unreadable file: not known, shown as nothing
            return None
        with contextlib.suppress(OSError):  # a read-only cache (or none: not cached): read again next time
            tmp = saved.with_name(f".{saved.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(types))
            os.replace(tmp, saved)
    quantized = sorted(str(t) for t in types if t not in FLOAT_TYPES) if isinstance(types, list) else []
    return "+".join(quantized) or None


def _quiet_transformers() -> None:
    """transformers' own progress bars and warnings write to the terminal, which would scribble over the
    dashboard; progress reaches the user through our LoadProgress events instead. Where transformers is not imported
    yet (a GGUF's later start may never import it: core/model/load/gguf_direct.py), its level and huggingface_hub's
    are set where the two read them when imported, the environment, and nothing is imported here; the load paths
    that import transformers call this again (its progress bars are switched off only once it is imported, before
    any weights are loaded)."""
    if "transformers" not in sys.modules:
        os.environ["TRANSFORMERS_VERBOSITY"] = os.environ["HF_HUB_VERBOSITY"] = "error"
        return
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    hub_logging.set_verbosity_error()  # e.g. "Retrying in 8s" lines while a download waits for the network


# ---------------------------------------------------------------------------------------------- resolution
def _first_line(err: BaseException) -> str:
    return error_line(err)  # a first line that ends with ":" takes the detail after it


def load_model(
    spec: str | None = None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    device_map: str | None = None,
    progress: Progress = _noop,
    ready: bool = True,
    quantize: str = "none",
    route: Route | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer; `spec` is None/"embedded", a .gguf file, a folder, or a hub id.

    `progress` gets the stages in order, each once (a stage with a measurable fraction sends it repeatedly); the
    last is "ready" unless `ready=False` (load_engine has more to do and says "ready" itself). `route`: the way
    `spec`'s GGUF runs, where the caller has found it already for these flags (load_engine's reserve_ahead: the
    file is then not parsed twice)."""
    started = time.perf_counter()
    _quiet_transformers()
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    _check_quantize(quantize, dtype, dev, device_map)
    progress(LoadProgress(STAGE_FIND, None))
    where = resolve_model(spec, allow_pickle=allow_pickle)  # one line for a bad path, an unreachable hub...
    source, name = where.source, where.name
    folder: Path | str = where.folder if where.folder is not None else where.name  # a hub id to download
    model = tokenizer = None
    # a GGUF: packed 4-bit, as stored by ggml's kernels, or de-quantized (core/model/load/gguf_route.py)
    if where.gguf_file is not None and route is None:
        route = gguf_route(dtype, dev, device_map, where.gguf_file, progress)
    if route is not None and route.kind != "float":
        if quantize != "none":
            raise SettingsError(f"--quantize {quantize}: {name}'s weights are quantized already and run as stored; "
                                "drop --quantize (or pass --dtype float32 to quantize its de-quantized copy again)")
        if route.kind == "packed":
            from .gguf_load import load_quantized, quant_facts

            loaded = load_quantized(where.gguf_file, progress)  # 4-bit matrices packed (core/model/load/gguf_load.py)
            quantization = quant_facts(loaded.model, loaded.manifest)
        else:
            from .gguf_stored import keep_facts, load_stored
            from .gguf_stored_facts import stored_facts

            loaded = load_stored(where.gguf_file, progress, route.reader)  # the file's bytes, ggml's kernels
            if loaded.direct is not None:  # a later start: the first start's facts, no transformers' model
                facts = replace(loaded.facts, name=name, source=source, load_seconds=time.perf_counter() - started)
                if ready:
                    progress(LoadProgress(STAGE_READY, 1.0))
                return LoadedModel(model=None, tokenizer=loaded.tokenizer, facts=facts,
                                   notice=route.notice, direct=loaded.direct)
            quantization = stored_facts(loaded.model, loaded.dequantized)
        facts = replace(model_facts(loaded.model, loaded.tokenizer, name=name, source=source,
                                    load_seconds=time.perf_counter() - started), quantization=quantization)
        if route.kind == "stored":
            keep_facts(where.gguf_file, facts)  # for a later start without transformers' model (gguf_direct.py)
        if ready:
            progress(LoadProgress(STAGE_READY, 1.0))
        notice = "; ".join(n for n in (route.notice, loaded.notice) if n) or None
        return LoadedModel(model=loaded.model, tokenizer=loaded.tokenizer, facts=facts, notice=notice)
    notice = route.notice if route is not None else None  # why a CPU run is not as stored (ggml cannot be had)
    if where.gguf_file is not None:
        folder, model, tokenizer, converted = converted_gguf_dir(where.gguf_file, progress)
        notice = "; ".join(n for n in (notice, converted) if n) or None
        if device_map and converted:
            raise ModelLoadError(f"--device-map places the weights from the converted model's files, and {converted}")
        if device_map:  # let accelerate place the weights from the cached files
            model = None
    elif isinstance(folder, Path):  # config.json against the weights' headers, before transformers builds anything
        check_model_folder(folder, name, trust_remote_code=trust_remote_code)

    from transformers import AutoModelForCausalLM, AutoTokenizer
    import torch

    _quiet_transformers()  # imported now: its progress bars off too
    kwargs = dict(dtype=torch_dtype, trust_remote_code=trust_remote_code)
    # an HF folder on CPU loads in the dtype it is stored in (core/model/quant/hf_stored.py): no float32 copy
    as_stored = where.gguf_file is None and _as_stored(dtype, dev, device_map)
    if as_stored:
        kwargs["dtype"] = "auto"  # transformers': config.json's dtype, else the weights' own
    if source == "hub" and not isinstance(folder, Path):
        kwargs["local_files_only"] = hub_offline()
    if not allow_pickle:
        kwargs["use_safetensors"] = True
    if model is None:  # (just converted from GGUF: the weights are already in memory)
        progress(LoadProgress(STAGE_WEIGHTS, None))
    try:
        if model is not None:  # just converted from GGUF (fp32, CPU): only move it
            model = model.to(device=dev, dtype=torch_dtype)
        elif device_map:
            model = AutoModelForCausalLM.from_pretrained(folder, device_map=device_map, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(folder, **kwargs).to(dev)
        if tokenizer is None and where.gguf_file is not None:  # tokentui's converted folder (tokenizer_cache.py)
            tokenizer = cached_tokenizer(Path(folder))
        elif tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code,
                                                      **({"local_files_only": True} if hub_offline() else {}))
    except ModelLoadError:
        raise
    except torch.cuda.OutOfMemoryError as err:
        raise ModelLoadError(f"{name} does not fit in GPU memory ({_first_line(err)}); "
                             "try --dtype bfloat16, a smaller model or --device cpu") from err
    except Exception as err:
        raise ModelLoadError(load_report_line(name, err) or _explain_load_error(name, err)) from err
    model.eval()
    quantized = None
    if quantize == "int4":  # core/model/quant/quantize.py: weight-only, group 32, the 4-bit GGUF path's layout
        from ..quant.quantize import quantize_model, quantized_facts

        progress(LoadProgress(STAGE_QUANTIZE, None))
        kept = quantize_model(model)
        quantized = quantized_facts(model, kept)
    elif quantize == "int8":  # core/model/quant/hf_stored.py: Q8_0 blocks, ggml's kernels, one matrix at a time
        from ..quant.hf_stored import quantize_int8

        progress(LoadProgress(STAGE_QUANTIZE, None))
        quantized = quantize_int8(model, progress)
    elif as_stored:  # its matrices viewed as ggml's rows where the native step serves it, else torch in its dtype
        from ..quant.hf_stored import run_as_stored

        stored = run_as_stored(model, progress)
        quantized, notice = stored.facts, stored.notice or notice
    try:
        facts = model_facts(model, tokenizer, name=name, source=source, trust_remote_code=trust_remote_code,
                            load_seconds=time.perf_counter() - started)
        if quantized is not None:
            facts = replace(facts, quantization=quantized)
        if quantized is not None and quantized.kernel.startswith("ggml") and facts.kv_bytes_per_value:
            # around ggml's rows the model computes in float32 (core/model/quant/hf_stored.py): so does its KV cache,
            # whatever dtype its embedding table (the first parameter) is stored in
            facts = replace(facts, kv_bytes_per_value=4, kv_bytes_per_token=None if facts.kv_bytes_per_token is None
                            else facts.kv_bytes_per_token * 4 // facts.kv_bytes_per_value)
    except Exception as err:  # a config without the shapes every causal LM has: one line, not a traceback
        raise ModelLoadError(f"{name}: tokentui cannot read this model's shapes ({_first_line(err)})") from err
    if where.gguf_file is not None:  # the model event says the weights are a de-quantized copy of the file's
        facts = replace(facts, dequantized_from=dequantized_from(Path(folder), where.gguf_file))
    if model.device.type == "cpu":  # step 4 on CPU is one call into tokentui's native library: built now, not in a step
        from ..native import q4_native

        q4_native.load(progress)  # where it does not build, selection runs torch operations (core/steps/select.py)
    if ready:
        progress(LoadProgress(STAGE_READY, 1.0))
    return LoadedModel(model=model, tokenizer=tokenizer, facts=facts, notice=notice)


def _check_quantize(quantize: str, dtype: str, device, device_map: str | None) -> None:
    """--quantize's one-line refusals, before anything loads."""
    from ..quant.quantize import QUANTIZE

    if quantize not in QUANTIZE:
        raise SettingsError(f"--quantize must be one of {', '.join(QUANTIZE)}, got {quantize!r}")
    if quantize == "none":
        return
    if device.type != "cpu" or device_map:
        raise SettingsError(f"--quantize {quantize} runs on CPU only (no CUDA path is built for it); pass "
                            "--device cpu or drop --quantize")
    if (dtype or "auto").strip().lower() not in ("auto", "float32"):
        raise SettingsError(f"--quantize {quantize} computes around its quantized products in float32; drop --dtype "
                            "or pass --dtype float32")


def _as_stored(dtype: str, device, device_map: str | None) -> bool:
    """Whether an HF folder loads in its stored dtype (bf16 / fp16 / fp32: core/model/quant/hf_stored.py): the default
    (--dtype auto) on CPU without a device map. Elsewhere --dtype's own choice (resolve_dtype)."""
    return (dtype or "auto").strip().lower() == "auto" and device.type == "cpu" and not device_map


def _explain_load_error(name: str, err: BaseException) -> str:
    text = _first_line(err)
    low = text.lower()
    if "does not recognize this architecture" in low or "unrecognized configuration class" in low:
        return f"{name}: transformers does not know this architecture ({text}); upgrade transformers or " \
               "pass --trust-remote-code if the model ships its own code and you trust it"
    if "trust_remote_code" in low:
        return f"{name} needs its own Python code to load; pass --trust-remote-code only if you trust its source"
    if "deserializ" in low or "header too" in low or "incomplete metadata" in low or "invalid json in header" in low:
        return f"{name}: corrupt or truncated safetensors file ({text}); download the weights again"
    if "use_safetensors" in low or "no file named model.safetensors" in low:
        return f"{name}: no safetensors weights; convert them or pass --allow-pickle if you trust the source"
    return f"{name}: could not load the model ({text})"
