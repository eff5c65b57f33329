"""tests/gguf_fixtures.py's files, as built by llama.cpp's converter and quantizer (core/model/native/ggml_build.py's
tools): every family x format x tied/untied file holds the tensor types its format promises, its token embedding
is the float32 reference's (the HF folder's) to within what the format keeps, and the F16 / BF16 / Q8_0 files that
llama-quantize makes from the F32 one hold the converter's own tensors, byte for byte.

Slow the first time on a machine (llama-quantize is built, each file converted once); cached after that."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf_fixtures import (FAMILIES, FORMATS, gguf_tools, hf_folder, tensor_types,  # noqa: F401  (the fixture)
                           tiny_gguf, tiny_gguf_converted)

pytestmark = pytest.mark.slow

FLOAT = {"F32", "F16", "BF16"}
# the layers' matrices: the format's own type, and the mixes llama-quantize makes (K-quant "M" mixes give some
# attn_v / ffn_down Q6_K)
LAYER_TYPES = {"F32": {"F32"}, "F16": {"F16"}, "BF16": {"BF16"}, "Q8_0": {"Q8_0"}, "Q4_0": {"Q4_0"},
               "Q4_1": {"Q4_1"}, "Q4_K_M": {"Q4_K", "Q6_K"}, "Q5_K_M": {"Q5_K", "Q6_K"}, "Q6_K": {"Q6_K"}}
# how far a de-quantized token embedding may be from the float32 one, relative to its largest |value| (F32: the
# same numbers; the rest: about half a step of the format's grid, with room)
EMBED_TOL = {"F32": 0.0, "F16": 1e-3, "BF16": 5e-3, "Q8_0": 1e-2, "Q6_K": 3e-2, "Q5_K": 6e-2, "Q4_K": 0.12,
             "Q4_0": 0.12, "Q4_1": 0.12}


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
def test_each_file_holds_its_formats_tensors(gguf_tools, family, fmt, tied):
    tensors = tensor_types(tiny_gguf(family, fmt, tied=tied))
    types = {name: kind for name, (kind, _) in tensors.items()}
    vectors = {name for name, (_, shape) in tensors.items() if len(shape) == 1}
    assert vectors and all(types[name] == "F32" for name in vectors), types  # norms (and biases) stay float32
    layers = {name: kind for name, kind in types.items() if name.startswith("blk.") and name not in vectors}
    assert len(layers) == 2 * 7, sorted(layers)  # 2 layers x q, k, v, o, gate, up, down
    assert set(layers.values()) == LAYER_TYPES[fmt], layers  # each type of the mix present, nothing else
    assert ("output.weight" in types) == (not tied)  # a tied file has no head: the embedding is the head
    if family == "qwen2":
        assert {f"blk.0.attn_{x}.bias" for x in "qkv"} <= vectors
    if family == "qwen3":
        assert {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"} <= vectors
    if fmt in FLOAT or fmt == "Q8_0":
        assert types["token_embd.weight"] == fmt and types.get("output.weight", fmt) == fmt


@pytest.mark.parametrize("fmt", FORMATS)
def test_token_embedding_is_the_references(gguf_tools, fmt):
    """The file's token embedding, de-quantized by gguf-py, against the HF folder's float32 one."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.numpy import load_file

    folder = hf_folder("llama", True)
    reference = load_file(folder / "model.safetensors")["model.embed_tokens.weight"]
    reader = GGUFReader(tiny_gguf("llama", fmt, tied=True))
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    got = dequantize(tensor.data, tensor.tensor_type).reshape(reference.shape)
    error = float(np.abs(got - reference).max()) / float(np.abs(reference).max())
    assert error <= EMBED_TOL[tensor.tensor_type.name], (tensor.tensor_type.name, error)
    config = json.loads((folder / "config.json").read_text())
    assert got.shape == (config["vocab_size"], config["hidden_size"])


@pytest.mark.parametrize("fmt", ["F16", "BF16", "Q8_0"])
def test_quantizer_writes_the_converters_tensors(gguf_tools, fmt):
    """Why the fixtures run the converter once a model (F32) and llama-quantize for the rest: the same bytes."""
    from gguf import GGUFReader

    ours = {t.name: t for t in GGUFReader(tiny_gguf("qwen3", fmt, tied=False)).tensors}
    theirs = GGUFReader(tiny_gguf_converted("qwen3", fmt, tied=False)).tensors
    assert sorted(ours) == sorted(t.name for t in theirs)
    for tensor in theirs:
        mine = ours[tensor.name]
        assert mine.tensor_type == tensor.tensor_type, tensor.name
        assert np.asarray(mine.data).tobytes() == np.asarray(tensor.data).tobytes(), tensor.name
