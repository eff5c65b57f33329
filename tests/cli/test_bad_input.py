"""Bad input in headless mode: one actionable line on stderr, a non-zero exit, never a traceback.
Each broken model is made here, in the test (folders, truncated files, unknown architectures)."""

from __future__ import annotations

import json

import pytest
import torch

from tiny_models import tiny_model
from cli_run import tokentui
from cli_run import one_line_error
from tokentui.core.model.load.loader import embedded_gguf


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    base = tmp_path_factory.mktemp("broken-models")
    llama = json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    for name in ("noweights", "pickle", "unknown", "corrupt"):
        (base / name).mkdir()
    (base / "noweights" / "config.json").write_text(llama)
    (base / "pickle" / "config.json").write_text(llama)
    (base / "pickle" / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    (base / "unknown" / "config.json").write_text(json.dumps({"model_type": "frobnicator",
                                                               "architectures": ["FrobForCausalLM"]}))
    (base / "unknown" / "model.safetensors").write_bytes(b"\0" * 16)
    (base / "corrupt" / "config.json").write_text(llama)
    (base / "corrupt" / "model.safetensors").write_bytes(b"\xff" * 64)
    with open(embedded_gguf(), "rb") as src:
        (base / "truncated.gguf").write_bytes(src.read(4_000_000))
    (base / "notgguf.gguf").write_bytes(b"hello world, not a model" * 100)
    return base


@pytest.mark.parametrize("name, needle", [
    ("noweights", "no weights (*.safetensors)"),
    ("pickle", "pass --allow-pickle if you trust the source"),
    ("unknown", "transformers does not know this architecture"),
    ("corrupt", "corrupt or truncated safetensors file"),
    ("truncated.gguf", "corrupt, truncated or unsupported GGUF file"),
    ("notgguf.gguf", "corrupt, truncated or unsupported GGUF file"),
    ("missing-folder", "no such file or folder"),
])
def test_broken_models(broken, isolated_dirs, name, needle):
    one_line_error(tokentui("--headless", "--no-record", "--model", str(broken / name), timeout=180), needle)


def test_hub_id_not_cached_while_offline(isolated_dirs, tmp_path):
    result = tokentui("--headless", "--no-record", "--model", "nobody-here/not-a-model",
                      env_extra={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)})
    one_line_error(result, "not in the local Hugging Face cache and HF_HUB_OFFLINE is set")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_requested_without_cuda():
    one_line_error(tokentui("--headless", "--device", "cuda"), "no CUDA GPU is visible")


def test_prompt_longer_than_the_context(embedded, isolated_dirs):
    result = tokentui("--headless", "--no-record", "--prompt", "word " * 9000, "--max-new-tokens", "2")
    one_line_error(result, "over this model's context of 8192; shorten it by at least")


def test_pickle_folder_loads_only_with_allow_pickle(smol_tokenizer, tmp_path, isolated_dirs):
    model = tiny_model("llama", smol_tokenizer)
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")  # the old pickle format
    smol_tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "pytorch_model.bin").exists() and not list(tmp_path.glob("*.safetensors"))
    one_line_error(tokentui("--headless", "--no-record", "--model", str(tmp_path)), "--allow-pickle")
    result = tokentui("--headless", "--no-record", "--allow-pickle", "--model", str(tmp_path),
                      "--max-new-tokens", "3", "--temperature", "0")
    assert result.returncode == 0, result.stderr


def test_model_without_chat_template_uses_the_raw_prompt_with_a_notice(smol_tokenizer, tmp_path, isolated_dirs):
    model = tiny_model("qwen2", smol_tokenizer)
    model.save_pretrained(tmp_path)
    smol_tokenizer.save_pretrained(tmp_path)
    for leftover in tmp_path.glob("chat_template.*"):
        leftover.unlink()
    cfg_path = tmp_path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    result = tokentui("--headless", "--json", "--no-record", "--model", str(tmp_path), "--max-new-tokens", "3")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    notice = next(e for e in events if e["event"] == "notice")
    assert "no chat template" in notice["message"]
    prompt = next(e for e in events if e["event"] == "prompt")
    assert prompt["templated"] is False and "<|im_start|>" not in prompt["text"]
    plain = tokentui("--headless", "--no-record", "--model", str(tmp_path), "--max-new-tokens", "3")
    assert plain.returncode == 0 and "no chat template" in plain.stderr
