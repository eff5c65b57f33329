"""Issue 35 (reliability, round 2), the GGUF items: a file's metadata is checked against its own tensor table before
anything is built from it (core/model/load/gguf_check.py), a model whose first pass gives NaN scores is refused, and no
refused model leaves a cache entry a later start would trust; a cache folder that cannot be written leaves the model
running from memory with a notice (the command-line side: tests/cli/test_reliability_round2_gguf_cli.py).

Each broken file is the embedded GGUF copied with a few bytes changed, at the places gguf-py's reader finds for a
field's value or a tensor's table entry (its parts are views of the file), so the rest stays a good model."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from tokentui.core.errors import ModelLoadError
from tokentui.core.model.engine import Engine
from tokentui.core.model.load.loader import embedded_gguf, load_model
from tokentui.core.runs.events import Notice, StepEvent
from tokentui.core.settings import RunOptions, SamplerSettings


@pytest.fixture(scope="module")
def source() -> GGUFReader:
    """The embedded GGUF parsed once: where each field's value and each tensor's table entry and data lie."""
    return GGUFReader(str(embedded_gguf()))


def patched(folder: Path, name: str, source: GGUFReader, patch) -> Path:
    """A copy of the embedded GGUF named `name` with `patch(source)`'s (array, index, value) writes applied: each
    array a view of the source's bytes, so its position in the file is where the copy is changed."""
    path = folder / name
    shutil.copyfile(embedded_gguf(), path)
    base = source.data.__array_interface__["data"][0]
    with open(path, "r+b") as handle:
        for array, index, value in patch(source):
            handle.seek(array.__array_interface__["data"][0] - base + index * array.itemsize)
            handle.write(np.asarray(value, dtype=array.dtype).tobytes())
    return path


def set_field(key: str, value: int):
    return lambda reader: [(reader.fields[key].parts[-1], 0, value)]


def tensor_info(name: str, part: int, index: int, value=None, add: int = 0):
    """Set (or add to) element `index` of part `part` of tensor `name`'s table entry: 3 its dimensions, 4 its
    block type, 5 its offset in the data section."""
    def patch(reader):
        array = next(t for t in reader.tensors if t.name == name).field.parts[part]
        return [(array, index, array[index] + add if value is None else value)]
    return patch


def nan_data(name: str):
    def patch(reader):
        data = next(t for t in reader.tensors if t.name == name).data.reshape(-1)
        return [(data, i, np.nan) for i in range(data.size)]
    return patch


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A private model cache for one test (what a refused model must not leave behind)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("TOKENTUI_CACHE_DIR", str(folder))
    return folder


def trusted_entries(cache: Path, stem: str) -> list[Path]:
    """Cache folders for `stem`'s file that a later start would load (marked complete)."""
    return [p.parent for p in cache.rglob(".complete") if p.parent.name.startswith(f"{stem}-")]


@pytest.mark.parametrize("how, needle", [
    (set_field("llama.block_count", 1000), "it says 1000 blocks (llama.block_count) but holds tensors for 30"),
    (set_field("llama.attention.head_count", 8), "it says 8 attention heads (llama.attention.head_count) and 3 "
                                                 "key/value heads"),
    (set_field("llama.embedding_length", 512), "embedding length of 512 (llama.embedding_length) but "
                                               "token_embd.weight has rows of 576"),
    (set_field("llama.vocab_size", 50_000), "a vocabulary of 50000 (llama.vocab_size) but token_embd.weight has "
                                            "49152 rows"),
    (set_field("llama.rope.dimension_count", 32), "it rotates 32 dimensions of each head "
                                                  "(llama.rope.dimension_count) but a head has 64"),
    (tensor_info("blk.0.attn_norm.weight", 3, 0, value=0), "tensor blk.0.attn_norm.weight (F32, 0) has a zero "
                                                           "dimension"),
], ids=["block_count", "head_count", "embedding_length", "vocab_size", "rope_dims", "zero_dimension"])
def test_metadata_that_its_tensors_contradict_is_one_corrupt_line(tmp_path, cache, source, how, needle):
    """Before: 1000 blocks spent minutes in transformers' weight map; the rest crashed (a state_dict size mismatch,
    a crash log) or loaded and cached a model that does not match its own file."""
    path = patched(tmp_path, "meta.gguf", source, how)
    with pytest.raises(ModelLoadError) as caught:
        load_model(str(path), device="cpu")
    line = str(caught.value)
    assert line.startswith(f"{path}: corrupt GGUF file: ") and needle in line, line
    assert "\n" not in line and line.endswith("download it again or pass another --model")
    assert not trusted_entries(cache, "meta")


@pytest.mark.parametrize("how, needle", [
    (tensor_info("blk.3.attn_q.weight", 4, 0, value=GGMLQuantizationType.F32),
     "tensor blk.3.attn_v.weight starts at byte 83206656 of the data, inside the tensor before it, "
     "blk.3.attn_q.weight (F32, 576×576)"),
    (tensor_info("blk.3.attn_q.weight", 5, 0, add=1),
     "tensor blk.3.attn_q.weight starts at byte 82999297 of the data, not a multiple of the file's alignment "
     "(32 bytes, general.alignment)"),
], ids=["Q4_1_as_F32", "offset_plus_1"])
@pytest.mark.parametrize("dtype", ["auto", "float32"])  # the 4-bit path and the de-quantized one
def test_tensor_layout_that_does_not_add_up_is_refused_and_never_cached(tmp_path, cache, source, how, needle,
                                                                        dtype):
    """Before: both loaded, failed at the first step with "NaN scores, try another dtype", and the conversion was
    cached as a good model."""
    path = patched(tmp_path, "layout.gguf", source, how)
    with pytest.raises(ModelLoadError, match="corrupt GGUF file") as caught:
        load_model(str(path), device="cpu", dtype=dtype)
    assert needle in str(caught.value), caught.value
    assert not trusted_entries(cache, "layout")


def test_a_model_whose_first_pass_is_nan_is_refused_and_never_cached(tmp_path, cache, source, monkeypatch):
    """A file whose layout and metadata are sound but whose weights are not (a norm of NaNs): its first pass,
    before the cache is written, refuses it. Before: it was cached, and every run stopped at step 1 blaming the
    dtype. (torch's int4 kernel: the native one would be compiled into this private cache first.)"""
    monkeypatch.setenv("TOKENTUI_INT4_KERNEL", "torch-int4")
    path = patched(tmp_path, "nans.gguf", source, nan_data("blk.0.attn_norm.weight"))
    with pytest.raises(ModelLoadError, match="corrupt model weights: its scores for the first tokens are NaN"):
        load_model(str(path), device="cpu")
    assert not trusted_entries(cache, "nans")


def test_a_cache_that_cannot_be_written_leaves_the_model_in_memory_with_a_notice(tmp_path, monkeypatch):
    """The float32 conversion with TOKENTUI_CACHE_DIR below a regular file (ENOTDIR: root, which these tests run as,
    writes through chmod 0500; the read-only file system, EROFS, is the command-line test's). Before: the OSError
    from write_cache escaped as a crash."""
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("TOKENTUI_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    loaded = load_model(None, device="cpu", dtype="float32")
    assert loaded.notice is not None and loaded.notice.startswith("the model cache is off: ")
    assert "(Not a directory)" in loaded.notice and "set TOKENTUI_CACHE_DIR to a writable folder" in loaded.notice
    assert loaded.facts.dequantized_from == "Q4_1+Q8_0"  # read off the file, with nowhere to keep it
    engine = Engine(loaded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=2, ignore_eos=True))
    first, second = list(engine.run("Hi")), list(engine.run("Hi"))
    assert [e.message for e in first if isinstance(e, Notice)] == [loaded.notice]  # said once, in the first run
    assert not any(isinstance(e, Notice) for e in second)
    assert len([e for e in first if isinstance(e, StepEvent)]) == 2
