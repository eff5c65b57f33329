"""A GGUF run as stored (core/model/load/gguf_stored.py), its starts: the first start refuses a file whose first pass
gives NaN scores and caches nothing for it; a good file's first start caches its config and tokenizer, and a later
start, which reads them from the cache and trusts the file checked then, gives the same scores and takes the first
start's verdict on the ggml decode step (kept with the libraries it held for); a start reserves the
huge-page memory its matrices take ahead of its imports, uses it whole and closes it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from gguf_fixtures import gguf_tools, tiny_gguf  # noqa: F401  (gguf_tools: a fixture)
from tokentui.core.errors import ModelLoadError
from tokentui.core.link.protocol import EngineSpec
from tokentui.core.model.load.build import load_engine, reserve_ahead
from tokentui.core.model.load.gguf_check import checked_reader
from tokentui.core.model.load.gguf_stored import huge_page_bytes
from tokentui.core.model.load.loader import load_model
from tokentui.core.model.native import ggml_native
from tokentui.core.model.quant import ggml_linear, ggml_settings
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


@pytest.mark.parametrize("tied", [True, False])
def test_a_start_reserves_what_its_matrices_take_ahead_and_closes_the_reservation(tied, monkeypatch, tmp_path):
    """`huge_page_bytes` is exactly what a stored load copies into huge-page memory (its resident and repacked
    matrices: a tied head's embedding, or an untied head), so the reservation a start makes ahead of its imports
    (core/model/load/build.py) is used whole; a start through it scores the first tokens as a load without one does,
    and leaves no reservation open."""
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")  # huge pages on, whatever this kernel's setting
    monkeypatch.setattr(ggml_settings, "THP_SETTING", str(setting))
    monkeypatch.delenv(ggml_linear.HUGE_PAGES_ENV, raising=False)
    path = tiny_gguf("qwen3", "Q8_0", tied=tied)
    loaded = load_model(str(path), device="cpu")
    copies = [m for m in loaded.model.modules()
              if isinstance(m, ggml_linear.GGMLLinear) and (m.resident is not None or m.packed is not None)]
    assert copies and sum(m.run_bytes.numel() for m in copies) == huge_page_bytes(checked_reader(path))
    reserved, route = reserve_ahead(EngineSpec(model=str(path)))
    assert ggml_linear.trim_reserved() == reserved and route.kind == "stored"
    assert reserved == (huge_page_bytes(checked_reader(path)) + (2 << 20) - 1) // (2 << 20) * (2 << 20)
    copied = huge_page_bytes(checked_reader(path)) - (3 << 20)  # what core/model/load/ahead.py copies: not reserved
    assert reserve_ahead(EngineSpec(model=str(path)), copied)[0] == 4 << 20 and ggml_linear.trim_reserved() == 4 << 20
    for other in (EngineSpec(model=str(path), dtype="float32"), EngineSpec(model=str(path), quantize="int8"),
                  EngineSpec(), EngineSpec(model=str(tmp_path / "absent.gguf"))):  # not as stored, or no file
        assert reserve_ahead(other) == (0, None)
    engine = load_engine(EngineSpec(model=str(path)))
    assert ggml_linear.reserve_huge_pages(2 << 20) == 2 << 20 and ggml_linear.trim_reserved() == 2 << 20
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        assert torch.equal(engine.model(input_ids=ids, use_cache=False).logits,
                           loaded.model(input_ids=ids, use_cache=False).logits)


def test_a_later_start_takes_the_ggml_steps_verdict_kept_by_the_first(tmp_path, monkeypatch):
    """The first start's ggml decode step is compared with the forward when first asked for, and the verdict kept
    with the libraries it held for; a later start takes the step without comparing again; a verdict for other
    libraries is not taken, nor a cache without one: that start compares, and keeps its verdict for the next. A
    trusted model is still refused what the step's construction refuses (an MLP made GELU after loading)."""
    path = tmp_path / "verdict.gguf"
    shutil.copyfile(tiny_gguf("qwen3", "Q8_0", tied=True), path)
    compared = []
    real = ggml_native.close_to_forward
    monkeypatch.setattr(ggml_native, "close_to_forward",
                        lambda model, step: compared.append(model) or real(model, step))

    def start():
        loaded = load_model(str(path), device="cpu")
        return loaded, ggml_native.ggml_step(loaded.model)

    first, step = start()
    assert step is not None and len(compared) == 1
    (folder,) = trusted("verdict")
    kept = folder / "ggml_step.json"
    shape = {"heads": step.heads, "kv_heads": step.kv_heads, "head_dim": step.head_dim, "eps": step.eps,
             "scale": step.scale}  # what a later start without transformers' model runs (gguf_direct.py)
    assert json.loads(kept.read_text()) == {"libraries": ggml_native.libraries(), "accepted": True, "shape": shape,
                                            "rope": True}
    _, step = start()
    assert step is not None and len(compared) == 1  # taken, not compared again
    kept.write_text(json.dumps({"libraries": "another build", "accepted": True}))
    _, step = start()
    assert step is not None and len(compared) == 2  # compared again, and kept
    assert json.loads(kept.read_text())["libraries"] == ggml_native.libraries()
    kept.unlink()  # a cache kept before verdicts were: compared, and the verdict kept for the next start
    start()
    assert len(compared) == 3 and json.loads(kept.read_text())["accepted"] is True
    start()
    assert len(compared) == 3
    changed = load_model(str(path), device="cpu")  # trusted, then changed before the step is asked for
    for layer in changed.model.model.layers:
        layer.mlp.act_fn = torch.nn.GELU()
    assert ggml_native.ggml_step(changed.model) is None and len(compared) == 3
    assert ggml_native.why_not(changed.model) == "an MLP activation other than SiLU"
