"""Model sources a user has: a hub id in the local Hugging Face cache (offline), a folder, accelerate's
device_map; and what the loader reports while it works."""

from __future__ import annotations

import pytest
import torch

from tiny_models import tiny_model
from tokentui.core.model.engine import Engine
from tokentui.core.errors import ModelLoadError, SettingsError
from tokentui.core.runs.events import StepEvent
from tokentui.core.model.load.loader import load_model, resolve_device, resolve_dtype
from tokentui.core.settings import RunOptions, SamplerSettings


def fake_hub_cache(root, repo_id, model, tokenizer):
    """Lay a model out exactly as huggingface_hub's cache does: blobs behind a snapshot folder and refs/main."""
    folder = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = folder / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0" * 40)
    return snapshot


def test_hub_id_from_the_local_cache_while_offline(smol_tokenizer, tmp_path, monkeypatch):
    model = tiny_model("qwen3", smol_tokenizer)
    fake_hub_cache(tmp_path, "someone/tiny-qwen3", model, smol_tokenizer)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.file_download.HF_HUB_CACHE", str(tmp_path), raising=False)
    stages = []
    loaded = load_model("someone/tiny-qwen3", device="cpu", dtype="float32", progress=stages.append)
    assert loaded.facts.source == "hub" and loaded.facts.name == "someone/tiny-qwen3"
    assert loaded.facts.architecture == "Qwen3ForCausalLM"
    assert stages[0].stage == "finding the model" and stages[-1].stage == "ready"
    for a, b in zip(model.state_dict().values(), loaded.model.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        load_model("someone/not-there", device="cpu")


def test_device_map_auto_through_accelerate(smol_tokenizer, tmp_path, monkeypatch):
    import transformers

    model = tiny_model("llama", smol_tokenizer)
    model.save_pretrained(tmp_path)
    smol_tokenizer.save_pretrained(tmp_path)
    seen = []
    original = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **kw: seen.append(kw.get("device_map")) or original(*a, **kw))
    loaded = load_model(str(tmp_path), device="cpu", dtype="float32", device_map="auto")
    assert seen == ["auto"]  # accelerate places the layers (all on the CPU here)
    engine = Engine(loaded, SamplerSettings(temperature=0), RunOptions(max_new_tokens=5, ignore_eos=True))
    assert len([e for e in engine.run("Hi") if isinstance(e, StepEvent)]) == 5


def test_device_and_dtype_resolution():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(SettingsError, match="--dtype must be one of"):
        resolve_dtype("int4", torch.device("cpu"))
    with pytest.raises(SettingsError, match="--device must be"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(SettingsError, match="no CUDA GPU"):
            resolve_device("cuda:0")


def test_trust_remote_code_is_off_unless_asked(smol_tokenizer, tmp_path, monkeypatch):
    import transformers

    model = tiny_model("llama", smol_tokenizer)
    model.save_pretrained(tmp_path)
    smol_tokenizer.save_pretrained(tmp_path)
    seen = []
    original = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    assert load_model(str(tmp_path), device="cpu").facts.trust_remote_code is False
    assert load_model(str(tmp_path), device="cpu", trust_remote_code=True).facts.trust_remote_code is True
    assert seen == [False, True]
