"""core/model/load/gguf_check.py `fast_transformers_parse`: transformers' own GGUF tokenizer and config, made while
gguf-py's reader is swapped for the faster parse, are the ones it makes without the swap, and the swap is undone
on the way out (also after a failure). core/model/load/gguf_reader.py `lean_reader` (the as-stored start's parse):
gguf-py's own fields and tensors, its long arrays skimmed — their lengths kept, their entries refused — and a file
cut inside a skimmed array refused as gguf-py refuses it."""

from __future__ import annotations

import gguf
import pytest
from transformers import AutoConfig, AutoTokenizer

from tokentui.core.errors import ModelLoadError
from tokentui.core.model.load.gguf_check import checked_reader, fast_transformers_parse
from tokentui.core.model.load.gguf_reader import SKIM_AT, Skimmed, lean_reader
from tokentui.core.model.load.precheck import embedded_gguf

TEXTS = ["Is OpenAI open?", "  spaces\tand\nnewlines ", "émoji 🙂 and 中文", "<|im_start|>user\nhi<|im_end|>"]


def _made(path):
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    return tokenizer, config


def test_the_same_tokenizer_and_config_as_without_it():
    path = embedded_gguf()
    plain_tok, plain_cfg = _made(path)
    original = gguf.GGUFReader
    with fast_transformers_parse():
        assert gguf.GGUFReader is not original  # the swap is in place for transformers' call-time import
        fast_tok, fast_cfg = _made(path)
    assert gguf.GGUFReader is original
    assert fast_tok.get_vocab() == plain_tok.get_vocab() and len(fast_tok) == len(plain_tok)
    assert fast_tok.all_special_tokens == plain_tok.all_special_tokens
    assert fast_tok.chat_template == plain_tok.chat_template
    for text in TEXTS:
        assert fast_tok(text)["input_ids"] == plain_tok(text)["input_ids"]
    assert fast_cfg.to_dict() == plain_cfg.to_dict()


def test_undone_after_a_failure():
    original = gguf.GGUFReader
    with pytest.raises(RuntimeError, match="planted"):
        with fast_transformers_parse():
            raise RuntimeError("planted")
    assert gguf.GGUFReader is original


def test_the_lean_parse_has_gguf_pys_fields_and_tensors_its_long_arrays_skimmed():
    path = embedded_gguf()
    lean, full = lean_reader(path), gguf.GGUFReader(str(path))
    assert list(lean.fields) == list(full.fields)
    skimmed = []
    for key, field in full.fields.items():
        mine = lean.fields[key]
        assert mine.types == field.types and len(mine.data) == len(field.data), key
        if isinstance(mine.data, Skimmed):
            skimmed.append(key)
            with pytest.raises(LookupError, match=f"the GGUF field {key}'s {len(field.data)} entries were not parsed"):
                mine.contents()
        else:
            assert mine.contents() == field.contents(), key
    # the vocabulary, its token types and its merges: every array longer than SKIM_AT, and only those
    assert skimmed == [k for k, f in full.fields.items() if f.types[0] == gguf.GGUFValueType.ARRAY
                       and len(f.data) > SKIM_AT]
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"} <= set(skimmed)
    assert (lean.data_offset, lean.alignment) == (full.data_offset, full.alignment)
    assert len(lean.tensors) == len(full.tensors)
    for mine, theirs in zip(lean.tensors, full.tensors):
        assert (mine.name, mine.tensor_type, mine.shape.tolist(), mine.n_bytes, mine.data_offset) == \
               (theirs.name, theirs.tensor_type, theirs.shape.tolist(), theirs.n_bytes, theirs.data_offset)
        assert mine.data.shape == theirs.data.shape and mine.data.dtype == theirs.data.dtype
    last = lean.tensors[-1]  # the data are views of the file at the same place: the last tensor's bytes compared
    assert (last.data.view("uint8").tobytes() == full.tensors[-1].data.view("uint8").tobytes())


def test_a_file_cut_inside_its_vocabulary_is_refused_in_one_line(tmp_path):
    path = embedded_gguf()
    full = gguf.GGUFReader(str(path))
    tokens = full.fields["tokenizer.ggml.tokens"]
    middle = int(tokens.parts[tokens.data[len(tokens.data) // 2]].__array_interface__["data"][0]
                 - full.data.__array_interface__["data"][0])
    cut = tmp_path / "cut.gguf"
    with open(path, "rb") as handle:
        cut.write_bytes(handle.read(middle))
    with pytest.raises(Exception):
        gguf.GGUFReader(str(cut))  # gguf-py's own refusal
    with pytest.raises(ValueError, match="runs past the end of the file"):
        lean_reader(cut)
    with pytest.raises(ModelLoadError) as caught:
        checked_reader(cut)
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"{cut}: corrupt, truncated or unsupported GGUF file (")
