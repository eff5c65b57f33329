"""Fixtures that run a real llama.cpp llama-server (issue 15's ``--server`` tests). The binary is built once per
machine by ``python scripts/llama_server.py build`` (test.sh does it); without it these fixtures skip, or fail
when ``TOKENTUI_REQUIRE_LLAMA_SERVER=1`` (test.sh sets it, so a missing build can't pass silently)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

_SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _load_tool():
    """scripts/llama_serve.py (which imports scripts/llama_build.py): the scripts folder is not a package."""
    if str(_SCRIPTS) not in sys.path:
        sys.path.insert(0, str(_SCRIPTS))
    import llama_build
    import llama_serve

    return llama_build, llama_serve


build_tool, tool = _load_tool()  # scripts/llama_build.py: binary_path(), ...; scripts/llama_serve.py: start()


def require_binary() -> Path:
    """The llama-server binary, or skip (fail under TOKENTUI_REQUIRE_LLAMA_SERVER=1) with a one-line reason."""
    path = build_tool.binary_path()
    if path is None:
        message = build_tool.missing_message()
        if os.environ.get("TOKENTUI_REQUIRE_LLAMA_SERVER") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    """One llama-server on the embedded GGUF for the whole session (``.url``, ``.process``, ``.stop()``)."""
    require_binary()
    server = tool.start(build_tool.embedded_gguf(), log_dir=tmp_path_factory.mktemp("llama-server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def llama_server_factory(tmp_path):
    """``start(model_path=None, **kwargs) -> Server``: extra servers a test may kill; all stopped at teardown.
    kwargs go to ``scripts/llama_serve.py``'s start() (port, extra_args, ready_timeout, ...)."""
    require_binary()
    servers = []

    def start(model_path=None, **kwargs):
        kwargs.setdefault("log_dir", tmp_path / f"llama-server-{len(servers)}")
        server = tool.start(model_path or build_tool.embedded_gguf(), **kwargs)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in reversed(servers):
            server.stop()
