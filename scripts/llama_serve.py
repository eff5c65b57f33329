"""Starting a real llama.cpp ``llama-server`` (built by scripts/llama_build.py) on a GGUF, on 127.0.0.1 at a free
port, and stopping it: ``start(model_path, ...) -> Server``; ``smoke_test(binary)`` checks a fresh build serves.
Stdlib only."""

from __future__ import annotations

import atexit
import contextlib
import json
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path

from llama_build import _cpus, _log, _tail, binary_path, embedded_gguf, missing_message

# --------------------------------------------------------------------------------------------------------------
# Start


class LlamaServerError(RuntimeError):
    pass


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_LIVE: "weakref.WeakSet[Server]" = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


atexit.register(_stop_all_at_exit)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET without any proxy from the environment; returns (status, body) for HTTP errors too."""
    try:
        with _NO_PROXY.open(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Server:
    """A running llama-server. ``url`` is ``http://127.0.0.1:PORT``; stdout+stderr go to ``log_path``."""

    def __init__(self, process: subprocess.Popen, *, port: int, log_path: Path, command: list[str],
                 model_path: Path):
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.command = command
        self.model_path = model_path
        _LIVE.add(self)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, n: int = 30) -> str:
        return _tail(self.log_path, n)

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        return http_get(self.url + path, timeout)

    def get_json(self, path: str, timeout: float = 10.0):
        status, body = self.get(path, timeout)
        if status != 200:
            raise LlamaServerError(f"GET {path} -> {status}: {body[:200]!r}")
        return json.loads(body)

    def stop(self, timeout: float = 5.0) -> int | None:
        """Terminate, wait up to ``timeout`` s, then kill. Returns the exit code. Safe to call twice."""
        proc = self.process
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        _LIVE.discard(self)
        return proc.returncode

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive else f"exited {self.process.returncode}"
        return f"<llama-server {self.url} pid={self.process.pid} {state}>"


def server_command(binary: Path, model_path: Path, port: int, *, threads: int | None = None,
                   extra_args=()) -> list[str]:
    return [str(binary), "-m", str(model_path), "--host", "127.0.0.1", "--port", str(port),
            "-c", "4096", "-np", "1", "-t", str(threads or _cpus()), "--metrics", "--slots", "--no-webui",
            *map(str, extra_args)]


def start(model_path, *, port: int | None = None, extra_args=(), ready_timeout: float = 120,
          binary: Path | str | None = None, log_dir: Path | str | None = None, threads: int | None = None) -> Server:
    """Start llama-server on ``model_path`` and wait until ``GET /health`` answers 200.

    ``port=None`` picks a free one (and retries with another if it was taken meanwhile). Raises LlamaServerError with
    the server's last log lines if it exits or is not ready within ``ready_timeout`` seconds."""
    exe = Path(binary) if binary else binary_path()
    if exe is None:
        raise LlamaServerError(missing_message())
    model_path = Path(model_path)
    if not model_path.is_file():
        raise FileNotFoundError(model_path)
    log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="tokentui-llama-server-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    attempts = 1 if port is not None else 3
    for attempt in range(attempts):
        this_port = port if port is not None else free_port()
        log_path = log_dir / f"llama-server-{this_port}.log"
        cmd = server_command(exe, model_path, this_port, threads=threads, extra_args=extra_args)
        with open(log_path, "wb") as log:
            log.write(("$ " + " ".join(cmd) + "\n").encode())
            log.flush()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        server = Server(proc, port=this_port, log_path=log_path, command=cmd, model_path=model_path)
        try:
            _wait_ready(server, ready_timeout)
            return server
        except LlamaServerError:
            server.stop()
            tail = server.log_tail(200).lower()
            if attempt + 1 < attempts and ("bind" in tail or "address already in use" in tail):
                continue
            raise
    raise AssertionError("unreachable")


def _wait_ready(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    last = "no answer yet"
    while True:
        code = server.process.poll()
        if code is not None:
            raise LlamaServerError(f"llama-server exited with code {code} before it was ready "
                              f"({' '.join(server.command)}); last log lines:\n{server.log_tail()}")
        try:
            status, body = http_get(server.url + "/health", timeout=2)
            if status == 200:
                return
            last = f"/health -> {status} {body[:120]!r}"
        except OSError as exc:
            last = f"/health: {exc}"
        if time.monotonic() > deadline:
            raise LlamaServerError(f"llama-server not ready after {timeout:.0f} s ({last}); last log lines:\n"
                              f"{server.log_tail()}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def smoke_test(binary: Path) -> None:
    """A fresh build must serve: start it on the embedded GGUF and ask for two tokens. A binary that cannot (it
    crashes on this CPU) is removed, so the next `build` tries again, and the build fails with its log's last lines."""
    try:
        with start(embedded_gguf(), binary=binary, ready_timeout=120) as server:
            request = urllib.request.Request(f"{server.url}/completion", method="POST",
                                             data=json.dumps({"prompt": "Hello", "n_predict": 2}).encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    body = json.loads(answer.read())
            except (OSError, ValueError) as exc:
                raise LlamaServerError(f"the built llama-server did not answer a completion ({exc}); last log lines:\n"
                                  f"{server.log_tail()}") from None
            if body.get("tokens_predicted") != 2:
                raise LlamaServerError(f"the built llama-server answered {str(body)[:200]}")
    except (LlamaServerError, FileNotFoundError) as exc:
        with contextlib.suppress(OSError):
            binary.unlink()
        raise RuntimeError(f"the built llama-server does not work here, removed: {exc}") from None
    _log("smoke test ok: the built llama-server serves the embedded model")
