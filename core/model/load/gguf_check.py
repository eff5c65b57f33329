"""A GGUF file's metadata checked against its own tensor table before anything is built from it (`check_gguf`):
the first thing that does not hold is refused in one line (ModelLoadError, "corrupt GGUF file: ..."), instead of a
model built from numbers the file does not back (a layer count of 10^9 builds decoder layers until memory runs
out; a tensor whose block type was changed loads as garbage and shows as NaN scores at the first step).

gguf-py's GGUFReader parses the header, the metadata and the tensor table, and refuses what it cannot parse (the
magic, the version, an unknown block type, duplicate tensor names, an alignment that is not a power of two, a
quantized row that is not whole blocks, a tensor that runs past the end of the file). It does not check:

- that no tensor has a zero dimension;
- the data layout llama.cpp's own loader requires (gguf.cpp): each tensor, in table order, starts where the one
  before it ends (its size: the block type's bytes per block × the shape), padded to `general.alignment`; a type,
  shape or offset changed in one tensor breaks this (misaligned, overlapping the next tensor or leaving a gap);
- that the architecture's numbers agree with the tensors: `<arch>.block_count` with the blocks (`blk.N.`) the file
  holds tensors for (every architecture's decoder layers are built from it); `<arch>.embedding_length` and the
  vocabulary (`tokenizer.ggml.tokens`, `<arch>.vocab_size`) with the token embedding and the output matrix, whose
  shapes llama.cpp requires to be {embedding length, vocabulary}; for the architectures whose attention has one
  head size in every block (PLAIN_ATTENTION) the head counts and head size with each block's q / k / v rows.
Each of these is read from the tensor table and the scalar metadata (no tensor data is read), parsed with the
vocabulary's arrays skimmed (core/model/load/gguf_reader.py's lean_reader: only their lengths are compared); a packed
or converted model's cache is not checked again.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import re
from pathlib import Path

from ...errors import ModelLoadError, error_line
from .gguf_reader import fast_reader_class, lean_reader

BLOCK = re.compile(r"(?:^|\.)blk\.(\d+)\.")  # enc.blk.N. / dec.blk.N. (T5) count as block N too
# one head size in every block, q rows = heads × head size, k and v rows = key/value heads × head size (the head
# size: <arch>.attention.key_length, else the embedding length / heads), as llama.cpp builds these architectures
PLAIN_ATTENTION = frozenset({"llama", "mistral", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "gemma2", "gemma3",
                             "starcoder2", "stablelm", "nemotron"})
ROPE_WHOLE_HEAD = frozenset({"llama", "mistral"})  # rotary over the whole head: transformers sizes heads by it
_passed: set[tuple] = set()  # files checked in this process (path, size, mtime): checked once


def check_gguf(path: Path) -> None:
    """Refuse `path` (ModelLoadError, one line) when its metadata and tensors disagree; a file that passed once in
    this process is not read again."""
    if _identity(path) not in _passed:
        checked_reader(path)


def checked_reader(path: Path):
    """gguf-py's GGUFReader of `path`, its long arrays (the vocabulary) skimmed (gguf_reader.lean_reader: the checks
    need their lengths only), once every check above holds (raises ModelLoadError otherwise)."""
    try:
        reader = lean_reader(path)
    except Exception as err:  # gguf-py's own refusals (see the module docstring), worded as transformers' are
        raise ModelLoadError(f"{path}: corrupt, truncated or unsupported GGUF file ({error_line(err)}); download it "
                             "again or pass another --model") from None
    problem = _layout_problem(reader) or _config_problem(reader)
    if problem is not None:
        raise _corrupt(path, problem)
    _passed.add(_identity(path))
    return reader


_PATCH_LOCK = threading.RLock()


@contextlib.contextmanager
def fast_transformers_parse():
    """transformers' GGUF loading (`AutoTokenizer` / `AutoConfig` / `AutoModelForCausalLM` with `gguf_file`) parses
    the whole file with gguf-py's GGUFReader, which it imports from the `gguf` module at call time; inside this block
    that name is gguf_reader.fast_reader_class (the same parse, several times faster: each parse took ~4 s of a first
    start on the embedded model's 49k-entry vocabulary, and a first start parses twice). Hand-written because
    transformers takes no reader: the one place tokentui swaps a library's name, restored on the way out."""
    import gguf

    with _PATCH_LOCK:
        saved = gguf.GGUFReader
        gguf.GGUFReader = fast_reader_class()
        try:
            yield
        finally:
            gguf.GGUFReader = saved


@contextlib.contextmanager
def reading(path: Path):
    """Building a model from `path`: any failure but a ModelLoadError (already one line) becomes the one line for a
    file that cannot be read (both GGUF loaders, gguf_load.py and gguf_stored.py); transformers' parses of the file
    inside it are `fast_transformers_parse`'s."""
    try:
        with fast_transformers_parse():
            yield
    except ModelLoadError:
        raise
    except Exception as err:
        raise ModelLoadError(f"{path}: corrupt, truncated or unsupported GGUF file ({error_line(err)}); "
                             "download it again or pass another --model") from err


def _identity(path: Path) -> tuple:
    st = path.stat()
    return os.path.realpath(path), st.st_size, st.st_mtime_ns


def _corrupt(path: Path, problem: str) -> ModelLoadError:
    return ModelLoadError(f"{path}: corrupt GGUF file: {problem}; download it again or pass another --model")


# ---------------------------------------------------------------------------------------------- the tensor table
def _dims(tensor) -> list[int]:
    return [int(d) for d in tensor.shape]  # innermost first, as the file lists them


def _describe(tensor) -> str:
    return f"{tensor.name} ({tensor.tensor_type.name}, {'×'.join(str(d) for d in _dims(tensor))})"


def _layout_problem(reader) -> str | None:
    from gguf import GGML_QUANT_SIZES

    if not reader.tensors:
        return "it holds no tensors"
    for tensor in reader.tensors:
        if 0 in _dims(tensor):
            return f"tensor {_describe(tensor)} has a zero dimension"
    align = int(reader.alignment)
    expected, end, before = 0, 0, None  # (bytes into the data) where the next tensor must start, where the last ends
    for tensor in reader.tensors:
        offset = int(tensor.data_offset) - int(reader.data_offset)
        if offset % align:
            return (f"tensor {tensor.name} starts at byte {offset} of the data, not a multiple of the file's "
                    f"alignment ({align} bytes, general.alignment)")
        if before is None and offset:
            return f"the first tensor, {tensor.name}, starts at byte {offset} of the data, not at 0"
        if offset != expected:
            where = "inside" if offset < expected else "past the end of"
            return (f"tensor {tensor.name} starts at byte {offset} of the data, {where} the tensor before it, "
                    f"{_describe(before)}, which ends at byte {end} (a tensor's block type, shape or offset was "
                    "changed)")
        block, block_bytes = GGML_QUANT_SIZES[tensor.tensor_type]
        end = offset + math.prod(_dims(tensor)) // block * block_bytes
        expected, before = end + (-end) % align, tensor
    return None


# ---------------------------------------------------------------------------------------------- the metadata
def _field(reader, key: str):
    """(the integer value of `key`, or the element count of an array) — None when absent or of another type."""
    from gguf import GGUFValueType

    field = reader.fields.get(key)
    if field is None or not field.types:
        return None
    if field.types[0] == GGUFValueType.ARRAY:
        return len(field.data)
    if field.types[0] in (GGUFValueType.STRING, GGUFValueType.FLOAT32, GGUFValueType.FLOAT64, GGUFValueType.BOOL):
        return None
    return int(field.parts[field.data[0]][0])


def _string(reader, key: str) -> str | None:
    from gguf import GGUFValueType

    field = reader.fields.get(key)
    if field is None or field.types != [GGUFValueType.STRING]:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")


def _is_array(reader, key: str) -> bool:
    from gguf import GGUFValueType

    field = reader.fields.get(key)
    return field is not None and bool(field.types) and field.types[0] == GGUFValueType.ARRAY


def _config_problem(reader) -> str | None:
    arch = _string(reader, "general.architecture")
    if arch is None:
        return None  # transformers refuses it with its own message
    tensors = {t.name: _dims(t) for t in reader.tensors}
    return (_blocks_problem(reader, arch, tensors) or _embedding_problem(reader, arch, tensors)
            or (_heads_problem(reader, arch, tensors) if arch in PLAIN_ATTENTION else None))


def _blocks_problem(reader, arch: str, tensors: dict[str, list[int]]) -> str | None:
    key = f"{arch}.block_count"
    count = _field(reader, key)
    if count is None or _is_array(reader, key):
        return None
    held = {int(m.group(1)) for m in map(BLOCK.search, tensors) if m}
    if len(held) == count and (not held or (min(held), max(held)) == (0, count - 1)):  # blocks 0..count-1
        return None
    if len(held) != count:
        return f"it says {count} blocks ({key}) but holds tensors for {len(held)}"
    return f"it says {count} blocks ({key}) but its block tensors are numbered up to {max(held)}"


def _embedding_problem(reader, arch: str, tensors: dict[str, list[int]]) -> str | None:
    embedding = tensors.get("token_embd.weight")
    if embedding is None or len(embedding) != 2:
        return None
    width, rows = embedding
    key = f"{arch}.embedding_length"
    length = _field(reader, key)
    if length is not None and not _is_array(reader, key) and length != width:
        return f"it says an embedding length of {length} ({key}) but token_embd.weight has rows of {width}"
    for count, key in ((_field(reader, "tokenizer.ggml.tokens"), "tokenizer.ggml.tokens"),
                       (_field(reader, f"{arch}.vocab_size"), f"{arch}.vocab_size")):
        if count is not None and count != rows:
            return f"it has a vocabulary of {count} ({key}) but token_embd.weight has {rows} rows"
    output = tensors.get("output.weight")
    if output is not None and output != embedding:
        return (f"output.weight is {'×'.join(map(str, output))} but token_embd.weight "
                f"{'×'.join(map(str, embedding))} (both should be embedding length × vocabulary)")
    return None


def _heads_problem(reader, arch: str, tensors: dict[str, list[int]]) -> str | None:
    heads_key, kv_key = f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"
    if any(_is_array(reader, k) for k in (heads_key, kv_key)):
        return None  # per-block head counts: not this family's layout
    heads = _field(reader, heads_key)
    if heads is None or not any(BLOCK.search(name) and ".attn_" in name for name in tensors):
        return None
    kv = _field(reader, kv_key)
    kv = heads if kv is None else kv
    if heads <= 0 or kv <= 0 or heads % kv:
        return (f"it says {heads} attention heads ({heads_key}) and {kv} key/value heads ({kv_key}), which must "
                "be positive, the second dividing the first")
    key_length = _field(reader, f"{arch}.attention.key_length")
    value_length = _field(reader, f"{arch}.attention.value_length")
    if key_length is None:
        width = _field(reader, f"{arch}.embedding_length") or 0
        if width % heads:
            return f"its embedding length {width} ({arch}.embedding_length) is not a whole number of {heads} heads"
        key_length = width // heads
    value_length = key_length if value_length is None else value_length
    rope = _field(reader, f"{arch}.rope.dimension_count")
    if rope is not None and not (rope == key_length if arch in ROPE_WHOLE_HEAD else 0 < rope <= key_length):
        return f"it rotates {rope} dimensions of each head ({arch}.rope.dimension_count) but a head has {key_length}"
    for name, dims in tensors.items():
        found = re.fullmatch(r"blk\.\d+\.attn_([qkv])\.weight", name)
        if found is None or len(dims) != 2:
            continue
        count, size, key = {"q": (heads, key_length, heads_key), "k": (kv, key_length, kv_key),
                            "v": (kv, value_length, kv_key)}[found.group(1)]
        if dims[1] != count * size:
            return f"{name} has {dims[1]} rows but {count} heads ({key}) of {size} need {count * size}"
    return None
