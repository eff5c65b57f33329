"""Packaging: one import name (`tokentui.*`), every package folder shipped, the core headless."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from tiny_models import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def package_folders() -> dict[str, Path]:
    """Every folder with an __init__.py under the mapped roots, as its dotted import name."""
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    found = {}
    for name, folder in mapping.items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(root).parts
            found[".".join((name, *rel))] = init.parent
    return found


def test_every_package_folder_is_listed():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = set(package_folders())
    assert found <= listed, f"package folders missing from pyproject packages: {sorted(found - listed)}"
    assert listed <= found, f"listed packages without an __init__.py: {sorted(listed - found)}"
    for top in ("core", "tui", "themes"):
        assert (REPO / top / "__init__.py").is_file()


def test_no_bare_top_level_core_or_tui_is_importable(tmp_path):
    code = ("import importlib.util as u, sys; "
            "sys.exit(any(u.find_spec(n) is not None for n in ('core', 'tui', 'themes')))")
    assert subprocess.run([sys.executable, "-c", code], cwd=tmp_path).returncode == 0


def test_core_never_imports_textual():
    code = ("import sys; import tokentui.core.model.engine, tokentui.core.model.load.loader, tokentui.core.steps.select, "
            "tokentui.core.steps.detokenize, tokentui.core.runs.record_writer, tokentui.cli; "
            "bad = [m for m in sys.modules if m == 'textual' or m.startswith('textual.')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_engine_imports_no_model_classes():
    """transformers' modeling (modeling_utils and what it pulls in: over a second at a start) is imported where a
    model is built or a capture installed, never by importing the engine: what a start without transformers' model
    classes (issue 37's cold start) builds on."""
    code = ("import sys; import tokentui.core.model.engine, tokentui.core.model.load.loader, "
            "tokentui.core.model.native.ggml_prefill, tokentui.core.model.decode.steps; "
            "print(sorted(m for m in sys.modules if m == 'transformers.modeling_utils' "
            "or m.startswith('transformers.models.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


def test_wheel_holds_every_package_and_no_bare_top_level(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                             "-w", str(tmp_path), str(REPO)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = tmp_path.glob("tokentui-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"tokentui"}
    for package, folder in package_folders().items():
        for source in folder.glob("*.py"):
            rel = "/".join(package.split(".")) + "/" + source.name
            assert rel in names, f"{rel} missing from the wheel"
    for tcss in (REPO / "themes").glob("*.tcss"):
        assert f"tokentui/themes/{tcss.name}" in names
    assert "tokentui/core/model/native/q4_avx2.cpp" in names  # the AVX2 kernel's source, built on a first start
