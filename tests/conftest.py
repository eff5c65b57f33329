"""Shared fixtures. The embedded model is converted once per test session into a private cache folder (the
conversion itself is under test), then shared read-only by the tests that need a real model."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from tiny_models import REPO  # noqa: F401  (tests import it from here too)
from llama_server_fixture import llama_server, llama_server_factory  # noqa: F401
from hostile_server import hostile_server  # noqa: F401  (the misbehaving server's modes, issue 21)


def required_but_missing() -> list[str]:
    """What test.sh requires (TOKENTUI_REQUIRE_TMUX, _NATIVE, _LLAMA_SERVER = 1) and this machine lacks, each with
    how to install it. Without the switches a missing tool skips its tests; test.sh sets them, so none is skipped."""
    missing = []
    if os.environ.get("TOKENTUI_REQUIRE_TMUX") == "1":
        from tmux_pane import have_tmux

        if not have_tmux():
            missing.append("tmux is not installed (the end-to-end tests drive the dashboard in it): "
                           "apt-get install tmux")
    if os.environ.get("TOKENTUI_REQUIRE_NATIVE") == "1":
        from tokentui.core.model.native.q4_native import NativeQ4

        if (why := NativeQ4.unavailable()) is not None:  # builds it the first time, as collecting its tests does
            missing.append(f"tokentui's native library is not available: {why} (it needs a C++ compiler: "
                           "apt-get install g++)")
    if os.environ.get("TOKENTUI_REQUIRE_LLAMA_SERVER") == "1":
        from llama_server_fixture import build_tool

        if build_tool.binary_path() is None:
            missing.append(build_tool.missing_message())
    return missing


def pytest_configure(config):
    """Under test.sh a missing requirement stops the run before it starts, in one line, rather than failing or
    skipping test by test."""
    if missing := required_but_missing():
        raise pytest.UsageError("; ".join(missing))



@pytest.fixture(scope="session")
def isolated_dirs(tmp_path_factory) -> dict[str, Path]:
    """Cache/state/config dirs for this test session; exported so CLI subprocesses use them too."""
    base = tmp_path_factory.mktemp("tokentui-home")
    dirs = {"TOKENTUI_CACHE_DIR": base / "cache", "TOKENTUI_STATE_DIR": base / "state",
            "TOKENTUI_CONFIG_DIR": base / "config"}
    for key, value in dirs.items():
        os.environ[key] = str(value)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return dirs


@pytest.fixture(scope="session")
def embedded_cold(isolated_dirs):
    """The embedded model loaded the first time: de-quantized from the GGUF (and cached as safetensors)."""
    from tokentui.core.model.load.loader import load_model

    stages = []
    loaded = load_model(None, device="cpu", dtype="float32", progress=stages.append)
    return loaded, stages


@pytest.fixture(scope="session")
def embedded(embedded_cold):
    """The embedded model as every later start loads it: from the safetensors cache."""
    from tokentui.core.model.load.loader import load_model

    return load_model(None, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def embedded_stock(embedded_cold):
    """A second copy that no Engine is ever given: engines store wide weights transposed (core/model/quant/weight_layout.py), so
    oracles that must run on the model exactly as transformers loads it use this one."""
    from tokentui.core.model.load.loader import load_model

    return load_model(None, device="cpu", dtype="float32")


@contextlib.contextmanager
def quantized_cache(isolated_dirs):
    """The 4-bit fixtures' own cache folder: any command-line test that ran the default model before them has
    filled the session's cache already, and the first start must be a first start."""
    saved = os.environ["TOKENTUI_CACHE_DIR"]
    os.environ["TOKENTUI_CACHE_DIR"] = str(isolated_dirs["TOKENTUI_CACHE_DIR"].with_name("cache-4bit"))
    try:
        yield
    finally:
        os.environ["TOKENTUI_CACHE_DIR"] = saved


@pytest.fixture(scope="session")
def embedded_quantized_cold(isolated_dirs):
    """The embedded model as tokentui runs it by default on CPU, the first time: its 4-bit matrices read from the
    GGUF as stored, packed for the int4 kernel and cached (core/model/load/gguf_load.py)."""
    from tokentui.core.model.load.loader import load_model

    stages = []
    with quantized_cache(isolated_dirs):
        loaded = load_model(None, device="cpu", progress=stages.append)
    return loaded, stages


@pytest.fixture(scope="session")
def embedded_quantized(embedded_quantized_cold, isolated_dirs):
    """The default CPU model as every later start loads it: the packed 4-bit tensors from the cache. The float32
    `embedded` fixture is its reference (the same file de-quantized)."""
    from tokentui.core.model.load.loader import load_model

    with quantized_cache(isolated_dirs):
        return load_model(None, device="cpu")


@pytest.fixture(scope="session")
def smol_tokenizer(embedded):
    """transformers' tokenizer of the embedded model, read from the folder its later starts read (theirs may be
    core/model/load/file_tokenizer.py's FileTokenizer, held to this one as its oracle)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded.tokenizer.name_or_path)




@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread: on a shared two-core box a second thread that gets descheduled stalls every O(V) op.
    (Modules that time or compare O(V) work use it: `pytestmark = pytest.mark.usefixtures("one_torch_thread")`.)"""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
