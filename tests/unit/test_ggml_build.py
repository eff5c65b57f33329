"""core/model/native/ggml_build.py: ggml's CPU library built once from the pinned llama.cpp sdist and cached per CPU,
$TOKENTUI_GGML_LIB used as is, every failure one line. cmake here is a stand-in script on PATH that records its calls
and writes what llama.cpp's build writes (versioned libraries behind symlinks, llama-quantize), and the sdist is a
small tarball shaped like the real one: the real build is tests/server/test_gguf_fixtures.py's."""

from __future__ import annotations

import io
import os
import shutil
import stat
import sys
import tarfile
from pathlib import Path

import pytest

from tokentui.core.model.native import ggml_build, llama_sdist
from tokentui.core.model.native.ggml_build import GGMLUnavailable

FAKE_CMAKE = r'''#!{python}
import os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_CMAKE_CALLS"], "a") as log:
    log.write(" ".join(args) + "\n")
if args[0] == "-S":
    Path(args[args.index("-B") + 1]).mkdir(parents=True)
    print("-- Configuring done")
    sys.exit(0)
if os.environ.get("FAKE_CMAKE_FAIL"):
    print("error: the compiler said no")
    sys.exit(2)
out = Path(args[1]) / "bin"
out.mkdir(parents=True)
print("[ 50%] Building C object ggml-cpu.c.o", flush=True)
libs = ["ggml-base", "ggml-cpu"] + (["llama"] if "llama-quantize" in args else [])
for lib in libs:
    (out / f"lib{lib}.so.0.26.0").write_bytes(lib.encode())
    os.symlink(f"lib{lib}.so.0.26.0", out / f"lib{lib}.so.0")
    os.symlink(f"lib{lib}.so.0", out / f"lib{lib}.so")
if "llama-quantize" in args:
    (out / "llama-quantize").write_text("quantize")
print("[100%] Built target", args[3])
'''


def _tarball(path: Path) -> Path:
    """A .tar.gz shaped like the sdist: llama.cpp/CMakeLists.txt, the converter, its conversion/ and gguf-py/."""
    top = path.name[: -len(".tar.gz")]
    with tarfile.open(path, "w:gz") as tar:
        for name in ("CMakeLists.txt", "convert_hf_to_gguf.py", "conversion/__init__.py", "gguf-py/gguf/__init__.py"):
            data = name.encode()
            info = tarfile.TarInfo(f"{top}/llama.cpp/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def fake_build(monkeypatch, tmp_path):
    """A cache folder of its own, a recording cmake first on PATH, and the sdist fetch answered by a small
    tarball; returns the list of cmake calls made so far (read it again after each call)."""
    monkeypatch.setenv("TOKENTUI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(ggml_build.ENV_LIB, raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cmake = bin_dir / "cmake"
    cmake.write_text(FAKE_CMAKE.replace("{python}", sys.executable))
    cmake.chmod(cmake.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "cmake-calls.txt"
    calls.write_text("")
    monkeypatch.setenv("FAKE_CMAKE_CALLS", str(calls))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    fetched = []

    def download(dest_dir, **kwargs):
        fetched.append(kwargs)
        return _tarball(Path(dest_dir) / llama_sdist.SDIST_NAME)

    monkeypatch.setattr(llama_sdist, "download_sdist", download)
    return lambda: calls.read_text().splitlines()


def test_built_once_then_found_without_a_second_build(fake_build):
    assert ggml_build.library_if_built() is None
    stages = []
    lib = ggml_build.library(stages.append)
    calls = fake_build()
    assert len(calls) == 2 and calls[0].startswith("-S") and "-DBUILD_SHARED_LIBS=ON" in calls[0]
    assert calls[1].split()[2:4] == ["--target", "ggml-cpu"]
    # the bare name links to the SONAME file that the other libraries name (libggml-cpu.so needs libggml-base.so.0)
    assert lib.name == "libggml-cpu.so" and lib.is_symlink() and os.readlink(lib) == "libggml-cpu.so.0"
    assert lib.read_bytes() == b"ggml-cpu" and (lib.parent / "libggml-base.so.0").read_bytes() == b"ggml-base"
    assert lib.parent == ggml_build.build_dir() and ggml_build.library_if_built() == lib
    assert {s.stage for s in stages} == {ggml_build.STAGE_BUILD}
    assert [s.fraction for s in stages] == [0.0, 0.5, 1.0, 1.0]
    assert not [p for p in lib.parent.parent.iterdir() if p.name.startswith(".build-")]  # the sources removed

    assert ggml_build.library(stages.append) == lib
    assert len(fake_build()) == 2 and len(stages) == 4  # found: no cmake call, no stage


def test_tools_beside_the_library(fake_build):
    lib = ggml_build.library()
    made = ggml_build.tools()
    assert fake_build()[3].split()[2:4] == ["--target", "llama-quantize"]
    assert made.quantize == lib.parent / "llama-quantize" and made.quantize.read_text() == "quantize"
    assert made.convert.read_text() == "convert_hf_to_gguf.py"
    assert (lib.parent / "libllama.so.0").is_file() and lib.read_bytes() == b"ggml-cpu"
    gguf_py, root = made.python_path.split(os.pathsep)
    assert (Path(gguf_py) / "gguf" / "__init__.py").is_file() and (Path(root) / "conversion").is_dir()
    assert made.convert_env()["PYTHONPATH"].startswith(made.python_path)
    assert ggml_build.tools() == made and len(fake_build()) == 4


def test_env_override_is_used_as_is(fake_build, monkeypatch, tmp_path):
    given = tmp_path / "elsewhere" / "libggml-cpu.so"
    given.parent.mkdir()
    given.write_bytes(b"x")
    monkeypatch.setenv(ggml_build.ENV_LIB, str(given))
    assert ggml_build.library() == given and ggml_build.library_if_built() == given
    assert fake_build() == []  # nothing built
    monkeypatch.setenv(ggml_build.ENV_LIB, str(tmp_path / "missing.so"))
    assert ggml_build.library_if_built() is None
    with pytest.raises(GGMLUnavailable) as info:
        ggml_build.library()
    assert str(info.value) == f"${ggml_build.ENV_LIB}={tmp_path / 'missing.so'} is not a file"


def test_missing_cmake_is_one_line(fake_build, monkeypatch):
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "cmake" else which(name, *a, **k))
    with pytest.raises(GGMLUnavailable) as info:
        ggml_build.library()
    message = str(info.value)
    assert "\n" not in message and message.startswith("cmake is not on PATH") and ggml_build.ENV_LIB in message
    assert fake_build() == []


def test_failed_build_is_one_line_naming_its_log(fake_build, monkeypatch):
    monkeypatch.setenv("FAKE_CMAKE_FAIL", "1")
    with pytest.raises(GGMLUnavailable) as info:
        ggml_build.library()
    message = str(info.value)
    assert "\n" not in message and "compiling" in message and "cmake exit 2" in message, message
    log = Path(message.split("the end of ")[1].split(" says why")[0])
    assert "the compiler said no" in log.read_text()
    assert ggml_build.library_if_built() is None  # nothing half-built is taken for a build
    monkeypatch.delenv("FAKE_CMAKE_FAIL")
    assert ggml_build.library().is_file()  # the next try builds


def test_failed_fetch_is_one_line(fake_build, monkeypatch):
    def refuse(dest_dir, **kwargs):
        raise RuntimeError(f"could not fetch {llama_sdist.SDIST_NAME} with pip's settings: index x answered 404; "
                           f"{kwargs['retry_hint']}")

    monkeypatch.setattr(llama_sdist, "download_sdist", refuse)
    with pytest.raises(GGMLUnavailable) as info:
        ggml_build.library()
    message = str(info.value)
    assert "\n" not in message and "answered 404" in message and ggml_build.ENV_LIB in message, message
    assert fake_build() == []


def test_cache_key_follows_the_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENTUI_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(llama_sdist, "cpu_flags", lambda: "fpu sse2 avx2 fma")
    avx2 = ggml_build.build_dir()
    monkeypatch.setattr(llama_sdist, "cpu_flags", lambda: "fpu sse2 avx2 fma avx512f")
    avx512 = ggml_build.build_dir()
    assert avx2 != avx512 and avx2.parent == avx512.parent == tmp_path / "ggml"
    assert avx2.name.startswith(f"{llama_sdist.VERSION}-")
    monkeypatch.setattr(llama_sdist, "cpu_flags", lambda: "fpu sse2 avx2 fma")
    assert ggml_build.build_dir() == avx2


def test_a_build_another_process_holds_is_waited_for_said_and_used(fake_build):
    """setup.sh builds the library in a detached background process: a model load meanwhile waits on its lock (a
    load stage says so), then uses that build instead of building again."""
    import fcntl
    import subprocess
    import textwrap

    folder = ggml_build.build_dir()
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = folder.parent / f".{folder.name}.lock"
    # the other process: takes the lock, waits for a go file, then leaves a finished build and exits
    go = folder.parent / "go"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, time
        from pathlib import Path
        with open({str(lock)!r}, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            print("held", flush=True)
            while not Path({str(go)!r}).exists():
                time.sleep(0.02)
            Path({str(folder)!r}).mkdir(parents=True)
            Path({str(folder / ggml_build.LIB_NAME)!r}).write_bytes(b"built elsewhere")
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        stages = []

        def progress(event):
            stages.append(event)
            go.touch()  # the holder finishes only once the wait was said

        lib = ggml_build.library(progress)
    finally:
        go.touch()
        holder.wait(timeout=30)
    assert [s.stage for s in stages] == [f"{ggml_build.STAGE_BUILD}: waiting for the build another process started"]
    assert lib.read_bytes() == b"built elsewhere" and fake_build() == []  # no build of its own
    with open(lock, "w") as f:  # and the lock is free again
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
