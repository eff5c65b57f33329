"""A GGUF of every common format loaded as stored (core/model/load/gguf_stored.py): each matrix a ggml module over the
file's own memory-mapped bytes, against two oracles — transformers' de-quantization of the same file (the float32
reference tokentui runs with --dtype float32) and the float32 Hugging Face folder the file was made from — on the
tiny models of tests/gguf_fixtures.py (llama.cpp's converter and llama-quantize). Also: the routing (packed / stored),
the tied-head files of issue 37, the model facts, and which decode step the plan runs.

Tolerances (max |logit difference| over the prompt, relative to the reference's largest |logit|):
- against the file de-quantized by transformers, on a prompt longer than ggml_linear.PRODUCT_ROWS (its rows through
  llama.cpp's own matrix product, a ggml graph, or ggml's gemm on a repacked Q4_0 / Q4_K): for an F32 file
  FLOAT_PATH = 1e-4, float32 summation order only; for every other, PRODUCT_PREFILL = 0.35: the activations rounded
  to 8-bit blocks (or 16-bit floats) as on a short prompt (below), over more positions (measured worst 0.250,
  Mistral Q4_K_M untied; F16 files 0.0013-0.0043, BF16 0.008-0.030);
- the same on a short prompt (ggml's product: the activations rounded to the format's 8-bit blocks, or to fp16 /
  bf16 for those files, as llama.cpp does): ACTIVATIONS = 0.25. Measured worst 0.13 over the 4 families x 9 formats;
  these random models (init 0.2, tests/tiny_models.py's INIT) carry one rounding step through two layers by that much;
- against the float32 HF folder (the file's own rounding of the weights too): F32 1e-4; F16 0.02 and BF16 0.08 (their
  weights and activations rounded to 16 bits: measured 0.0055 / 0.030); Q8_0 0.25 (measured 0.11). The 4-bit to
  6-bit formats move these models' logits by as much as the logits themselves (measured 0.35 to 1.1), so for them
  the file's own de-quantization is the oracle (above) and the HF folder is not one.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import pytest
import torch
from torch import nn

from gguf_fixtures import FAMILIES, FORMATS, gguf_tools, hf_folder, tiny_gguf  # noqa: F401  (gguf_tools: a fixture)
from tokentui.core.model.load.file_tokenizer import FileTokenizer
from tokentui.core.model.load.gguf_check import checked_reader
from tokentui.core.model.load.gguf_plan import _skeleton, read_config
from tokentui.core.model.load.gguf_stored import load_stored, place_stored
from tokentui.core.model.load.loader import load_model
from tokentui.core.model.quant import ggml_linear
from tokentui.core.model.quant.ggml_linear import PRODUCT_ROWS, GGMLEmbedding, GGMLLinear

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("gguf_tools", "isolated_dirs", "one_torch_thread")]
FLOAT_PATH = 1e-4
ACTIVATIONS = 0.25
PRODUCT_PREFILL = 0.35
TO_HF = {"F32": 1e-4, "F16": 0.02, "BF16": 0.08, "Q8_0": 0.25}
TEXT = "Is OpenAI open? The quick brown fox jumps over the lazy dog, and then it runs far away into the woods"
# each family once per format, tied and untied alternating (every family x tied pair: the F32 test below)
CASES = [(family, fmt, tied) for i, family in enumerate(FAMILIES) for fmt, tied in
         zip(FORMATS, [(i + j) % 2 == 0 for j in range(len(FORMATS))])]


@pytest.fixture(scope="module", autouse=True)
def bound():
    why = ggml_linear.load(lambda _: None)
    if why is not None:
        pytest.skip(why)


@pytest.fixture(scope="module")
def ids(smol_tokenizer):
    ids = smol_tokenizer.encode(TEXT)[:24]
    assert len(ids) > PRODUCT_ROWS
    return torch.tensor([ids])


_CONFIGS: dict = {}


def config_of(family: str, tied: bool):
    """The config transformers reads from the files of (family, tied) (the same in every format)."""
    if (family, tied) not in _CONFIGS:
        path = tiny_gguf(family, "F32", tied=tied)
        _CONFIGS[family, tied] = read_config(path, checked_reader(path))
    return _CONFIGS[family, tied]


def stored(path, config):
    model = _skeleton(config)
    dequantized = place_stored(checked_reader(path), model)
    return model, dequantized


def dequantized_reference(path, config):
    """The file de-quantized by transformers' own GGUF loop (gguf.dequantize and its tensor processor), in the same
    architecture: what --dtype float32 runs."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    model = _skeleton(config)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    assert not any(p.is_meta for p in model.parameters())
    return model.eval()


def relative(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max()) / float(reference.abs().max())


@torch.inference_mode()
def logits(model, ids):
    return model(ids).logits[0]


# ---------------------------------------------------------------------------------------------- every format
@pytest.mark.parametrize("family, fmt, tied", CASES)
def test_every_format_loads_as_stored_and_scores_as_its_dequantized_reference(family, fmt, tied, ids):
    path = tiny_gguf(family, fmt, tied=tied)
    config = config_of(family, tied)
    model, dequantized = stored(path, config)
    assert dequantized == {}  # ggml runs every format here: nothing de-quantized
    linears = [m for m in model.modules() if isinstance(m, GGMLLinear)]
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert isinstance(model.get_input_embeddings(), GGMLEmbedding)
    head, table = model.get_output_embeddings(), model.get_input_embeddings()
    assert isinstance(head, GGMLLinear) and (head.matrix is table.matrix) == tied
    # the formats are the file's: each matrix once (a tied head is the embedding's)
    matrices = {id(m.matrix): m.matrix for m in [*linears, table]}
    file_types = Counter(t.tensor_type.name for t in checked_reader(path).tensors if len(t.shape) == 2)
    assert Counter(m.type_name for m in matrices.values()) == file_types
    reference = dequantized_reference(path, config)
    # llama.cpp's products round the activations to each format's vec_dot_type at every length, F32's aside
    rounded = any(m.matrix.type_name != "F32" for m in linears)
    assert relative(logits(model, ids), logits(reference, ids)) <= (PRODUCT_PREFILL if rounded else FLOAT_PATH)
    short = ids[:, :PRODUCT_ROWS]
    assert relative(logits(model, short), logits(reference, short)) <= ACTIVATIONS


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
def test_an_f32_file_as_stored_is_the_hf_folder(family, tied, ids):
    """The whole mapping (names, llama's permuted q/k rows, biases, q/k norms, the tied head) against the folder the
    file was converted from."""
    from transformers import AutoModelForCausalLM

    model, _ = stored(tiny_gguf(family, "F32", tied=tied), config_of(family, tied))
    folder = AutoModelForCausalLM.from_pretrained(hf_folder(family, tied), dtype=torch.float32).eval()
    assert relative(logits(model, ids), logits(folder, ids)) <= TO_HF["F32"]


@pytest.mark.parametrize("fmt", ["F16", "BF16", "Q8_0"])
def test_16_and_8_bit_files_score_near_the_hf_folder(fmt, ids):
    from transformers import AutoModelForCausalLM

    for family in FAMILIES:
        model, _ = stored(tiny_gguf(family, fmt, tied=False), config_of(family, False))
        folder = AutoModelForCausalLM.from_pretrained(hf_folder(family, False), dtype=torch.float32).eval()
        assert relative(logits(model, ids), logits(folder, ids)) <= TO_HF[fmt], family


# ---------------------------------------------------------------------------------------------- no copies
def _mapped_ranges(path) -> list[tuple[int, int]]:
    """The address ranges this process has mapped from `path` (/proc/self/maps)."""
    ranges = []
    for line in open("/proc/self/maps"):
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str(path):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_matrices_are_the_files_own_bytes(family):
    """Every matrix's bytes lie in the file's memory map and equal the tensor's bytes there; only llama's q/k
    (stored with their rows permuted for ggml's rotation) are copies, of the same rows in transformers' order."""
    path = tiny_gguf(family, "Q4_K_M", tied=False)
    reader = checked_reader(path)
    model, _ = stored(path, config_of(family, False))
    ranges = _mapped_ranges(path.resolve())
    assert ranges
    by_bytes = {bytes(t.data.tobytes()): t.name for t in reader.tensors if len(t.shape) == 2}
    names = {id(m): n for n, m in model.named_modules()}
    copied = []
    for module in model.modules():
        if not isinstance(module, (GGMLLinear, GGMLEmbedding)):
            continue
        raw = module.matrix.raw
        start = raw.data_ptr()
        inside = any(a <= start and start + raw.numel() <= b for a, b in ranges)
        if bytes(raw.numpy().tobytes()) in by_bytes:
            assert inside, names[id(module)]
        else:
            assert not inside
            copied.append(names[id(module)])
            rows = sorted(bytes(r) for r in raw.numpy())
            assert any(sorted(bytes(r) for r in t.data) == rows for t in reader.tensors if t.data.shape == raw.shape)
    expected = [n for n in names.values() if re.search(r"\.(q|k)_proj$", n)] if family == "llama" else []
    assert sorted(copied) == sorted(expected)


# ---------------------------------------------------------------------------------------------- issue 37's files
@pytest.mark.parametrize("family", FAMILIES)
def test_the_tied_head_files_of_issue_37_load_by_default(family):
    """Q4_K_M and Q4_0 files of tied models keep their embedding in Q6_K, with no output.weight: both load with the
    default flags, as stored, the head the embedding's own Q6_K matrix (not de-quantized into a float32 table read
    whole every step, as the packed path would hold it: a Q4_0 file goes that way only with a 4-bit or Q8_0 head)."""
    q4_0, q4_k_m = (tiny_gguf(family, fmt, tied=True) for fmt in ("Q4_0", "Q4_K_M"))
    assert {t.tensor_type.name for t in checked_reader(q4_0).tensors if t.name == "token_embd.weight"} == {"Q6_K"}
    assert not any(t.name == "output.weight" for t in checked_reader(q4_k_m).tensors)
    for path, blocks in ((q4_0, {"Q4_0", "Q6_K"}), (q4_k_m, {"Q4_K", "Q6_K"})):
        as_stored = load_model(str(path), device="cpu")
        quant = as_stored.facts.quantization
        assert quant.head == "tied: token_embd Q6_K" and as_stored.facts.tied_lm_head
        assert set(quant.blocks.split("+")) == blocks and quant.dequantized == 0


def test_the_facts_count_the_files_matrices_and_bytes():
    """QuantFacts of a stored file against its tensor table: per format the matrices and their bytes, the bytes a
    decode step reads (every tensor but the embedding table of an untied file), the kernel."""
    path = tiny_gguf("qwen2", "Q4_K_M", tied=False)
    tensors = checked_reader(path).tensors
    loaded = load_model(str(path), device="cpu")
    quant = loaded.facts.quantization
    counts = Counter(t.tensor_type.name for t in tensors if len(t.shape) == 2)
    sizes = Counter()
    for t in tensors:
        if len(t.shape) == 2:
            sizes[t.tensor_type.name] += int(t.n_bytes)
    for kind, n in counts.items():
        assert f"{kind} ×{n} {sizes[kind] / 1e6:.1f} MB" in quant.formats
    assert quant.weight_bytes == sum(int(t.n_bytes) for t in tensors if t.name != "token_embd.weight")
    assert quant.matrices == sum(n for n in counts.values()) - 1  # every matrix but the embedding multiplies
    assert quant.kernel.startswith("ggml's vec_dot, llama.cpp ") and quant.activation_dtype == "int8"
    assert quant.head == f"output {next(t.tensor_type.name for t in tensors if t.name == 'output.weight')}"
    assert loaded.facts.parameters == sum(math.prod(int(d) for d in t.shape) for t in tensors)


def test_later_starts_read_the_cached_tokenizer_and_config():
    """A later start reads the tokenizer the first start ran with, without transformers (its verdict kept), and
    tokenizes as the first start did, which is as transformers reads the folder back: "\n\n" was split in two by
    the tokenizer made from the GGUF, one token read back (core/model/load/tokenizer_cache.py's `settled`)."""
    path = tiny_gguf("qwen3", "Q8_0", tied=True)
    first, second = load_stored(path), load_stored(path)
    assert not first.from_cache and second.from_cache and first.notice is None
    assert isinstance(second.tokenizer, FileTokenizer) and not isinstance(first.tokenizer, FileTokenizer)
    for text in (TEXT, "a\n\nb 1234 什么是大语言模型？"):
        assert second.tokenizer.encode(text) == first.tokenizer.encode(text)
    from transformers import AutoTokenizer

    from tokentui.core.model.load.gguf_stored import cached_folder

    # the first start's tokenizer is the one transformers reads back from the folder (Qwen's pre-tokenizer: "\n\n"
    # one token), not the one it made from the GGUF (GPT-2's: two)
    ids = first.tokenizer.encode("a\n\nb", add_special_tokens=False)
    assert ids == AutoTokenizer.from_pretrained(cached_folder(path)).encode("a\n\nb", add_special_tokens=False)
    assert len(ids) == 3
    same = [(a.to_dict() | {"_name_or_path": ""}) for a in (first.model.config, second.model.config)]
    assert same[0] == same[1]


def test_a_verdict_kept_with_other_libraries_is_made_again():
    """The tokenizer verdict holds for the libraries it was made with: for others, transformers' tokenizer is read
    and the comparison made again and kept, so the start after reads it without transformers again."""
    from tokentui.core.model.load.gguf_stored import cached_folder
    from tokentui.core.model.load.tokenizer_cache import VERDICT

    path = tiny_gguf("llama", "Q8_0", tied=False)
    load_stored(path)
    verdict = cached_folder(path) / VERDICT
    kept = json.loads(verdict.read_text())
    assert kept["agrees"] is True
    verdict.write_text(json.dumps({**kept, "tokenizers": "0.0.0"}))
    assert not isinstance(load_stored(path).tokenizer, FileTokenizer)
    assert json.loads(verdict.read_text()) == kept
    assert isinstance(load_stored(path).tokenizer, FileTokenizer)


def test_a_truncated_file_is_one_line(tmp_path):
    path = tiny_gguf("llama", "Q8_0", tied=True)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    from tokentui.core.errors import ModelLoadError

    with pytest.raises(ModelLoadError) as err:
        load_model(str(cut), device="cpu")
    assert "\n" not in str(err.value) and "corrupt" in str(err.value)
