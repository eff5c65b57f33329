"""core/model/load/gguf_check.py `fast_transformers_parse`: transformers' own GGUF tokenizer and config, made while
gguf-py's reader is swapped for the faster parse, are the ones it makes without the swap, and the swap is undone
on the way out (also after a failure)."""

from __future__ import annotations

import gguf
import pytest
from transformers import AutoConfig, AutoTokenizer

from tokentui.core.model.load.gguf_check import fast_transformers_parse
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
