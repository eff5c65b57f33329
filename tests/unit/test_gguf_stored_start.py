"""A GGUF run as stored (core/model/load/gguf_stored.py), its starts: the first start refuses a file whose first pass
gives NaN scores and caches nothing for it; a good file's first start caches its config and tokenizer, and a later
start, which reads them from the cache and trusts the file checked then, gives the same scores."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from gguf_fixtures import gguf_tools, tiny_gguf  # noqa: F401  (gguf_tools: a fixture)
from tokentui.core.errors import ModelLoadError
from tokentui.core.model.load.gguf_check import checked_reader
from tokentui.core.model.load.loader import load_model
from tokentui.core.model.quant import ggml_linear
from tokentui.core.paths import cache_dir

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("gguf_tools", "isolated_dirs", "one_torch_thread")]


@pytest.fixture(scope="module", autouse=True)
def bound():
    why = ggml_linear.load(lambda _: None)
    if why is not None:
        pytest.skip(why)


def trusted(stem: str) -> list:
    return [p.parent for p in cache_dir().rglob(".complete") if p.parent.name.startswith(f"{stem}-")]


def test_a_first_start_whose_first_pass_is_nan_is_refused_and_caches_nothing(tmp_path):
    source = tiny_gguf("qwen3", "Q8_0", tied=True)
    path = tmp_path / "nans.gguf"
    shutil.copyfile(source, path)
    norm = next(t for t in checked_reader(source).tensors if t.name == "blk.0.attn_norm.weight")
    with open(path, "r+b") as handle:
        handle.seek(int(norm.data_offset))
        handle.write(np.full(norm.data.size, np.nan, dtype=np.float32).tobytes())
    with pytest.raises(ModelLoadError, match="corrupt model weights: its scores for the first tokens are NaN") as err:
        load_model(str(path), device="cpu")
    assert "\n" not in str(err.value)
    assert not trusted("nans")


def test_a_later_start_from_the_cache_gives_the_first_starts_scores(tmp_path):
    path = tmp_path / "good.gguf"
    shutil.copyfile(tiny_gguf("qwen3", "Q8_0", tied=True), path)
    ids = torch.tensor([[1, 2, 3, 4, 5]])

    def scores():
        loaded = load_model(str(path), device="cpu")
        with torch.inference_mode():
            return loaded.model(input_ids=ids, use_cache=False).logits

    first = scores()
    assert len(trusted("good")) == 1
    second = scores()
    assert torch.isfinite(first).all() and torch.equal(first, second)
