"""GGUF files of every common format, made the way users' files are made (issue 37): a tiny random-weight model of
each family the native step covers, saved as a float32 Hugging Face folder, converted by llama.cpp's own
`convert_hf_to_gguf.py` and quantized by its `llama-quantize` (both from the pinned llama.cpp sdist, built once and
cached: core/model/native/ggml_build.py's `tools`).

    hf_folder(family, tied)           the float32 HF folder: the float32 reference of every file made from it
    tiny_gguf(family, fmt, tied=...)  that folder as a GGUF of format fmt (llama.cpp's names: FORMATS): F32 from the
                                      converter, every other format quantized from it by llama-quantize
    tiny_gguf_converted(family, fmt, tied=...)  F16 / BF16 / Q8_0 from the converter itself (--outtype)

The converter is run once a model: its F16, BF16 and Q8_0 tensors are llama-quantize's from its F32 file, byte for
byte (tests/server/test_gguf_fixtures.py checks it), and each converter run costs seconds where llama-quantize's
cost a fraction of one, which keeps the whole set within CI's budget.

Families: llama, qwen2 (q/k/v bias), qwen3 (q/k RMSNorm), mistral; every matrix's input width a multiple of 256, so
every K-quant applies to every matrix. The tokenizer is the embedded SmolLM2's (llama.cpp's converter knows its
pre-tokenizer), so the vocabulary is its 49,152 tokens.

Everything is cached under the tokentui cache folder of the user running the tests (``fixtures/<key>``; the key
holds the family, tied, the config and, for the GGUFs, the sdist's version and FORMAT), read when this module is
imported: the tests' own isolated cache folder (tests/conftest.py's isolated_dirs) is set later and would rebuild it
all every session.
The `gguf_tools` fixture skips in one line where cmake or a compiler is missing, and fails under
TOKENTUI_REQUIRE_LLAMA_SERVER=1 (test.sh), as tests/llama_server_fixture.py does for llama-server.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tiny_models import INIT

from tokentui.core.model.native import ggml_build
from tokentui.core.model.native.llama_sdist import VERSION
from tokentui.core.paths import cache_dir

FORMAT = 2  # bump when what is built changes in a way the key does not see (2: one converter run a model)
FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
# the converter's --outtype of each format it writes
CONVERTED = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}
FORMATS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K_M", "Q5_K_M", "Q6_K")
# every matrix's input width (hidden, heads x head_dim, intermediate) a multiple of 256, K-quants' block
CONFIG = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=512, rms_norm_eps=1e-6,
              initializer_range=INIT)
SEED = 0
HOME_CACHE = cache_dir()  # the user's, read at import: see the docstring
STEP_TIMEOUT_S = 600


@contextlib.contextmanager
def _home_cache():
    """cache_dir() is the user's while building (ggml_build caches the tools there, not in a test's tmp folder)."""
    saved = os.environ.get("TOKENTUI_CACHE_DIR")
    os.environ["TOKENTUI_CACHE_DIR"] = str(HOME_CACHE)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TOKENTUI_CACHE_DIR", None)
        else:
            os.environ["TOKENTUI_CACHE_DIR"] = saved


def tools() -> ggml_build.Tools:
    """llama.cpp's converter and quantizer, built into the user's cache the first time (GGMLUnavailable if not)."""
    with _home_cache():
        return ggml_build.tools()


def ggml_library() -> Path:
    """ggml's CPU library in the user's cache (built by `tools` already)."""
    with _home_cache():
        return ggml_build.library()


def _key(family: str, tied: bool, **more) -> str:
    ident = json.dumps({"family": family, "tied": tied, "config": CONFIG, "seed": SEED, **more}, sort_keys=True)
    return f"{family}-{'tied' if tied else 'untied'}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def _check(family: str, fmt: str | None = None) -> None:
    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: one of {', '.join(FAMILIES)}")
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: one of {', '.join(FORMATS)}")


@contextlib.contextmanager
def locked(path: Path):
    """Held while `path` is made: two sessions (or a benchmark and a session) wait for each other."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def staged(folder: Path):
    """A new folder beside `folder` to fill, renamed to `folder` (replacing any partial one) when the block ends
    without an error; removed otherwise."""
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        yield tmp
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def tokenizer_folder() -> Path:
    """The embedded SmolLM2's tokenizer, read from its GGUF by transformers once and saved."""
    folder = HOME_CACHE / "fixtures" / "tokenizer-smollm2"
    with locked(folder):
        if not (folder / "tokenizer.json").is_file():
            from transformers import AutoTokenizer

            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
            from llama_build import embedded_gguf  # finds the GGUF without importing the package

            gguf = embedded_gguf()
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            with staged(folder) as tmp:
                tokenizer.save_pretrained(tmp)
    return folder


def _model(family: str, tied: bool, tokenizer):
    import torch
    import transformers

    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }
    config_cls, model_cls = classes[family]
    config = config_cls(**CONFIG, vocab_size=len(tokenizer), tie_word_embeddings=tied,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(SEED)
    model = model_cls(config).eval()
    model.config.architectures = [model_cls.__name__]
    return model


def hf_folder(family: str, tied: bool) -> Path:
    """The float32 safetensors folder (config, weights, SmolLM2's tokenizer) of the tiny `family` model."""
    _check(family)
    folder = HOME_CACHE / "fixtures" / f"hf-{_key(family, tied)}"
    with locked(folder):
        if not (folder / "config.json").is_file():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder())
            model = _model(family, tied, tokenizer)
            with staged(folder) as tmp:
                model.save_pretrained(tmp, safe_serialization=True)
                tokenizer.save_pretrained(tmp)
    return folder


def _run(cmd: list, what: str, **kwargs) -> None:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=STEP_TIMEOUT_S, **kwargs)
    if out.returncode != 0:
        tail = " | ".join((out.stdout + out.stderr).strip().splitlines()[-3:])
        raise RuntimeError(f"{what} failed (exit {out.returncode}): {tail}")


# The converter run with transformers reading each folder's tokenizer as saved (its tokenizer_config names
# TokenizersBackend). For some model types (Qwen2's among them) transformers replaces the named class by its own
# (Qwen2Tokenizer, which rebuilds Qwen's pre-tokenizer around SmolLM2's vocabulary): the converter then hashes a
# pre-tokenizer that llama.cpp does not know and stops. Hub files of those types carry their own tokenizer, so this
# only concerns fixtures that borrow SmolLM2's.
_AS_SAVED = ("import runpy, sys\n"
             "import transformers.models.auto.tokenization_auto as auto\n"
             "getattr(auto, 'MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS', set()).clear()\n"
             "sys.argv = sys.argv[1:]\n"
             "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def _sentencepiece_stand_in() -> Path:
    """A folder holding an importable `sentencepiece` that cannot be used. The converter's Llama and Qwen vocab code
    imports sentencepiece before it looks for a tokenizer.model and falls back to the tokenizer.json (BPE) when there
    is none (conversion/base.py's _create_vocab_sentencepiece); these folders have none, so it is never used, and
    the tests need not install it for an import."""
    folder = HOME_CACHE / "fixtures" / "sentencepiece-stand-in"
    module = folder / "sentencepiece" / "__init__.py"
    if not module.is_file():
        module.parent.mkdir(parents=True, exist_ok=True)
        tmp = module.with_name(f".init.tmp{os.getpid()}")
        tmp.write_text("class SentencePieceProcessor:\n    def __init__(self, *args, **kwargs):\n"
                       "        raise ImportError('sentencepiece is not installed (tests/gguf_fixtures.py)')\n")
        os.replace(tmp, module)
    return folder


def converted(source: Path, fmt: str, target: Path) -> Path:
    """`target`, made first when missing by convert_hf_to_gguf.py from the HF folder `source` (fmt: F32 / F16 /
    BF16 / Q8_0), under a lock, renamed into place when complete."""
    made = tools()
    with locked(target):
        if not target.is_file():
            tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
            env = made.convert_env()
            if importlib.util.find_spec("sentencepiece") is None:
                env["PYTHONPATH"] += os.pathsep + str(_sentencepiece_stand_in())
            _run([sys.executable, "-c", _AS_SAVED, made.convert, source, "--outtype", CONVERTED[fmt], "--outfile",
                  tmp], f"convert_hf_to_gguf.py --outtype {CONVERTED[fmt]} on {source}", env=env)
            os.replace(tmp, target)
    return target


def quantized(source: Path, fmt: str, target: Path) -> Path:
    """`target`, made first when missing by llama-quantize from the GGUF `source` (fmt: llama.cpp's name of the
    file type, e.g. Q4_K_M), under a lock, renamed into place when complete."""
    made = tools()
    with locked(target):
        if not target.is_file():
            tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
            _run([made.quantize, source, tmp, fmt, str(os.cpu_count() or 1)], f"llama-quantize {source} {fmt}")
            os.replace(tmp, target)
    return target


def _gguf_folder(family: str, tied: bool) -> Path:
    return HOME_CACHE / "fixtures" / f"gguf-{_key(family, tied, llama_cpp=VERSION, format=FORMAT)}"


def tiny_gguf(family: str, fmt: str, *, tied: bool) -> Path:
    """The tiny `family` model as a GGUF of format `fmt`: F32 from convert_hf_to_gguf.py, every other format
    quantized from that F32 file by llama-quantize."""
    _check(family, fmt)
    target = _gguf_folder(family, tied) / f"{fmt}.gguf"
    if target.is_file():
        return target
    if fmt == "F32":
        return converted(hf_folder(family, tied), fmt, target)
    return quantized(tiny_gguf(family, "F32", tied=tied), fmt, target)


def tiny_gguf_converted(family: str, fmt: str, *, tied: bool) -> Path:
    """The tiny `family` model as convert_hf_to_gguf.py writes it with --outtype fmt (F32, F16, BF16, Q8_0)."""
    _check(family, fmt)
    if fmt not in CONVERTED:
        raise ValueError(f"the converter writes {', '.join(CONVERTED)}, not {fmt}")
    return converted(hf_folder(family, tied), fmt, _gguf_folder(family, tied) / f"converter-{fmt}.gguf")


# GGUF metadata value types (the GGUF spec): fixed sizes, 8 = string, 9 = array
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def tensor_types(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's (type name, shape as ggml lists it: the row length first) in a GGUF file, from its header alone.

    Why not gguf-py's GGUFReader: it builds a numpy view of every metadata item first, ~50,000 token strings here,
    which takes seconds a file (several minutes over the fixtures); this skips the metadata and reads the tensor
    list."""
    from gguf import GGMLQuantizationType

    with open(path, "rb") as fh:
        data = fh.read(64 << 20)  # the header (metadata, then the tensor list) comes before the weights
    magic, _version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
    if magic != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    at = 24

    def string() -> str:
        nonlocal at
        (n,) = struct.unpack_from("<Q", data, at)
        at += 8 + n
        return data[at - n:at].decode("utf-8", errors="replace")

    def skip(kind: int) -> None:
        nonlocal at
        if kind == 8:
            string()
        elif kind == 9:
            item, count = struct.unpack_from("<IQ", data, at)
            at += 12
            if item in _SIZES:
                at += count * _SIZES[item]
            else:
                for _ in range(count):
                    skip(item)
        else:
            at += _SIZES[kind]

    for _ in range(n_kv):
        string()
        (kind,) = struct.unpack_from("<I", data, at)
        at += 4
        skip(kind)
    tensors = {}
    for _ in range(n_tensors):
        name = string()
        (n_dims,) = struct.unpack_from("<I", data, at)
        shape = struct.unpack_from(f"<{n_dims}Q", data, at + 4)
        kind, _offset = struct.unpack_from("<IQ", data, at + 4 + 8 * n_dims)
        at += 4 + 8 * n_dims + 12
        tensors[name] = (GGMLQuantizationType(kind).name, tuple(shape))
    return tensors


def require_tools() -> ggml_build.Tools:
    """The converter and quantizer (built the first time), or skip (fail under TOKENTUI_REQUIRE_LLAMA_SERVER=1) with
    a one-line reason."""
    try:
        return tools()
    except ggml_build.GGMLUnavailable as exc:
        if os.environ.get("TOKENTUI_REQUIRE_LLAMA_SERVER") == "1":
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def gguf_tools():
    """llama.cpp's converter and quantizer for the session; ggml's library in the user's cache is exported as
    $TOKENTUI_GGML_LIB, so that a model loaded in the tests does not build its own in the session's cache."""
    made = require_tools()
    saved = os.environ.get(ggml_build.ENV_LIB)
    os.environ[ggml_build.ENV_LIB] = str(ggml_library())
    try:
        yield made
    finally:
        if saved is None:
            os.environ.pop(ggml_build.ENV_LIB, None)
        else:
            os.environ[ggml_build.ENV_LIB] = saved
