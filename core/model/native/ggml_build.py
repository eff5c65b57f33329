"""ggml's CPU library (llama.cpp's ``libggml-cpu.so``: the dot products and activation quantizers of every GGUF block
format), built from the pinned llama.cpp sdist (core/model/native/llama_sdist.py) on the machine that runs it, once,
and cached; and llama.cpp's GGUF converter and quantizer from the same sdist, for the tests and benchmarks that make
GGUF files (`tools`).

Why built here: ggml is built with -march=native (its own default) for the CPU it runs on, and the wheel stays pure
Python, as for tokentui's own library (core/model/native/q4_native.py). Why a cmake build of llama.cpp's own targets
and not a compiler call of ours: ggml's CMake files choose its per-CPU sources and flags, which no short list here
would keep up with.

Cached in ``cache_dir()/ggml/<version>-<key>/`` (key: the CPU's flags, the machine and the cmake flags: a native
build is only reused on the same CPU, built the same way), built under a lock file so that two processes do not both
build it, each file renamed into place with the marker (``libggml-cpu.so``, ``llama-quantize``) last. The libraries
carry an ``$ORIGIN`` run path, so each finds the others beside it (``libggml-cpu.so`` needs ``libggml-base.so.0``).
The tests' llama-server is built into the same folder, in the same build as llama-quantize (scripts/llama_build.py).
``TOKENTUI_GGML_LIB=/path/to/libggml-cpu.so`` is used as is: nothing is built.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...paths import cache_dir
from ...runs.events import LoadProgress
from . import llama_sdist
from .llama_sdist import NO_AMX_FLAGS, SWITCHES, VERSION

ENV_LIB = "TOKENTUI_GGML_LIB"
LIB_NAME = "libggml-cpu.so"
QUANTIZE_NAME = "llama-quantize"
CONVERT_NAME = "convert_hf_to_gguf.py"
# what the converter imports from the sdist beside it: gguf-py (newer than the installed gguf) and its conversion/
CONVERT_PARTS = (CONVERT_NAME, "conversion", "gguf-py")
# shared ggml (libggml-base, libggml-cpu: what tokentui loads), each library finding the others beside it ($ORIGIN)
CMAKE_FLAGS = (*SWITCHES, "-DBUILD_SHARED_LIBS=ON", "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
               "-DCMAKE_INSTALL_RPATH=$ORIGIN", *NO_AMX_FLAGS)
STAGE_BUILD = (f"building ggml's CPU kernels from llama.cpp {VERSION} (first use of a non-4-bit GGUF only, ~30 s)")
STAGE_TOOLS = f"building llama.cpp {VERSION}'s llama-quantize (tests and benchmarks; once, a few minutes)"
RETRY_HINT = (f"retry, or let pip find a copy of {llama_sdist.SDIST_NAME} (PIP_FIND_LINKS=<its folder>), or set "
              f"{ENV_LIB} to a libggml-cpu.so")

Progress = Callable[[LoadProgress], None]


class GGMLUnavailable(RuntimeError):
    """ggml's CPU library cannot be had here; the message is one line saying why."""


@dataclass(frozen=True)
class Tools:
    """llama.cpp's quantizer and converter, from the cached build folder."""

    quantize: Path  # llama-quantize (finds its libraries beside it)
    convert: Path  # convert_hf_to_gguf.py
    python_path: str  # what PYTHONPATH needs when running the converter: its gguf-py and its conversion package

    def convert_env(self) -> dict[str, str]:
        """The environment to run the converter in: this one, with python_path first on PYTHONPATH."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (self.python_path, env.get("PYTHONPATH")) if p)
        return env


def build_dir() -> Path:
    """The cached build folder for this CPU and these flags."""
    return cache_dir() / "ggml" / f"{VERSION}-{llama_sdist.build_key(CMAKE_FLAGS)}"


def library_if_built() -> Path | None:
    """$TOKENTUI_GGML_LIB if set (None when it is not a file), else the cached library (None when not built)."""
    override = os.environ.get(ENV_LIB)
    path = Path(override).expanduser() if override else build_dir() / LIB_NAME
    return path if path.is_file() else None


def library(progress: Progress | None = None) -> Path:
    """The library to load: $TOKENTUI_GGML_LIB as is, else the cached build, built first when missing (said as a
    load stage with its progress). GGMLUnavailable (one line) when it cannot be had."""
    override = os.environ.get(ENV_LIB)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise GGMLUnavailable(f"${ENV_LIB}={override} is not a file")
        return path
    folder = build_dir()
    _build(folder, targets=("ggml-cpu",), marker=LIB_NAME, stage=STAGE_BUILD, progress=progress)
    return folder / LIB_NAME


def tools(progress: Progress | None = None) -> Tools:
    """llama-quantize and the converter, built (and cached beside the library) first when missing."""
    folder = build_dir()
    _build(folder, targets=(QUANTIZE_NAME,), marker=QUANTIZE_NAME, stage=STAGE_TOOLS, progress=progress)
    return Tools(quantize=folder / QUANTIZE_NAME, convert=folder / CONVERT_NAME,
                 python_path=os.pathsep.join((str(folder / "gguf-py"), str(folder))))


# --------------------------------------------------------------------------------------------------------------
# Build


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _missing_tool() -> str | None:
    """Why cmake cannot build here (one line), or None."""
    if shutil.which("cmake") is None:
        return (f"cmake is not on PATH (building ggml's CPU kernels from llama.cpp {VERSION} needs it: apt-get "
                f"install cmake, or set {ENV_LIB} to a libggml-cpu.so)")
    if not (os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")):
        return (f"no C++ compiler on PATH (building ggml's CPU kernels needs one: apt-get install g++, or set "
                f"{ENV_LIB} to a libggml-cpu.so)")
    return None


def _build(folder: Path, *, targets: tuple[str, ...], marker: str, stage: str, progress: Progress | None) -> None:
    """Build `targets` into `folder` unless `marker` is there, under a lock file beside the folder."""
    if (folder / marker).exists():
        return
    if (why := _missing_tool()) is not None:
        raise GGMLUnavailable(why)
    import fcntl  # POSIX only, as the build is

    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process is building it (setup's background build): wait, use its build
            if progress is not None:
                progress(LoadProgress(f"{stage}: waiting for the build another process started", None))
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / marker).exists():
            return
        _build_locked(folder, targets, marker, stage, progress or (lambda event: None))


def _build_locked(folder: Path, targets: tuple[str, ...], marker: str, stage: str, progress: Progress) -> None:
    progress(LoadProgress(stage, 0.0))
    log_path = folder.parent / f"{folder.name}-{marker}.build.log"
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=folder.parent))
    t0 = time.monotonic()
    try:
        with open(log_path, "w") as log:
            def say(line: str) -> None:
                log.write(line.rstrip("\n") + "\n")
                log.flush()

            try:
                sdist = llama_sdist.download_sdist(work, retry_hint=RETRY_HINT, log=say)
                src = llama_sdist.unpack_sdist(sdist, work / "src")
            except (RuntimeError, OSError) as exc:
                raise GGMLUnavailable(f"could not get llama.cpp's source to build ggml: {_one_line(exc)}") from None
            sdist.unlink()
            bdir = work / "build"
            t1 = time.monotonic()
            _run(["cmake", "-S", str(src), "-B", str(bdir), *CMAKE_FLAGS], log, log_path)
            t2 = time.monotonic()
            command = ["cmake", "--build", str(bdir), "--target", *targets, f"-j{_cpus()}"]
            _run(command, log, log_path, lambda f: progress(LoadProgress(stage, f)))
            t3 = time.monotonic()
            say(f"# fetch+unpack {t1 - t0:.1f} s, configure {t2 - t1:.1f} s, compile {t3 - t2:.1f} s")
        install(bdir / "bin", src, folder, marker)
        info = {"version": VERSION, "targets": list(targets), "cmake_flags": list(CMAKE_FLAGS), "jobs": _cpus(),
                "fetch_seconds": round(t1 - t0, 1), "configure_seconds": round(t2 - t1, 1),
                "compile_seconds": round(t3 - t2, 1)}
        (folder.parent / f"{folder.name}-{marker}.json").write_text(json.dumps(info, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(LoadProgress(stage, 1.0))


def _run(cmd: list[str], log, log_path: Path, fraction: Callable[[float], None] | None = None) -> None:
    """Run cmd with its output appended to log; cmake's "[ 42%]" lines reported as fractions."""
    log.write(f"\n$ {' '.join(cmd)}\n")
    log.flush()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", bufsize=1)
    except OSError as exc:
        raise GGMLUnavailable(f"could not run {cmd[0]}: {_one_line(exc)}") from None
    assert proc.stdout is not None
    last = -1
    for line in proc.stdout:
        log.write(line)
        if fraction is not None and (m := re.match(r"^\[\s*(\d+)%\]", line)) and int(m.group(1)) > last:
            last = int(m.group(1))
            fraction(last / 100)
    rc = proc.wait()
    log.flush()
    if rc != 0:
        step = "configuring" if "--build" not in cmd else "compiling"
        raise GGMLUnavailable(f"building ggml's CPU kernels failed ({step} llama.cpp {VERSION}, cmake exit {rc}): "
                              f"the end of {log_path} says why")


def install(bin_dir: Path, src: Path, folder: Path, marker: str) -> None:
    """Copy the built libraries (each real file under its SONAME, e.g. libggml-base.so.0, and the bare name as a
    link to it), the quantizer and the converter into folder; a file already there is kept (the same sources built
    the same way); the marker last, so that its presence means a complete build. (Also scripts/llama_build.py's,
    whose build of llama-server makes these too.)"""
    folder.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".stage-", dir=folder))
    try:
        entries: list[str] = []
        for bare in sorted(bin_dir.glob("lib*.so")):
            if bare.is_symlink():
                soname = os.readlink(bare)  # cmake's chain: libX.so -> libX.so.0 -> libX.so.0.26.0
                shutil.copy2(bare.resolve(), staged / soname)
                os.symlink(soname, staged / bare.name)
                entries += [soname, bare.name]
            else:
                shutil.copy2(bare, staged / bare.name)
                entries.append(bare.name)
        if (bin_dir / QUANTIZE_NAME).is_file():
            shutil.copy2(bin_dir / QUANTIZE_NAME, staged / QUANTIZE_NAME)
            for part in CONVERT_PARTS:
                copy = shutil.copytree if (src / part).is_dir() else shutil.copy2
                copy(src / part, staged / part)
            entries += [*CONVERT_PARTS, QUANTIZE_NAME]
        if marker not in entries:
            raise GGMLUnavailable(f"building ggml's CPU kernels finished without {marker} in {bin_dir}")
        for name in sorted(entries, key=lambda n: n == marker):  # the marker last
            target = folder / name
            if name != marker and (target.exists() or target.is_symlink()):
                continue
            os.replace(staged / name, target)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _one_line(text: object, limit: int = 400) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
