"""The layers of the code, checked: the import-linter contracts in pyproject.toml hold, and no import cycle exists
among tokentui's modules (core/, tui/, themes/, tokentui/); both count every import, lazy ones and those under
`if TYPE_CHECKING:` too.

tokentui installs core/, tui/ and themes/ as tokentui.core / tokentui.tui / tokentui.themes (pyproject's
package-dir), which import-linter's module finder (grimp: it walks the root package's folder) cannot see in the
source tree; so the checks run on a copy of the sources laid out as installed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import grimp  # import-linter's import graph: a dev dependency (pyproject.toml), so never skipped
import pytest

from import_graph import strongly_connected
from tiny_models import REPO

@pytest.fixture(scope="module")
def installed_layout(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("layout")
    package = root / "tokentui"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "tokentui", package, ignore=ignore)
    for name in ("core", "tui", "themes"):
        shutil.copytree(REPO / name, package / name, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_import_linter_contracts_hold(installed_layout):
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--config", "pyproject.toml", "--no-cache"], cwd=installed_layout,
                            capture_output=True, text=True, timeout=300,
                            env={"PYTHONPATH": str(installed_layout), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout and "Contracts: 7 kept" in result.stdout, result.stdout[-2000:]


def _cycles(package: str, path: Path) -> tuple[list[str], list[list[str]]]:
    """tests/import_graph.py's cycles of `package`, found in `path`: in a fresh interpreter, since grimp finds a
    package by importing it, and in this one `tokentui` is the editable install's."""
    script = Path(__file__).parent.parent / "import_graph.py"
    result = subprocess.run([sys.executable, str(script), package], cwd=path, capture_output=True, text=True,
                            timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(path)})
    assert result.returncode == 0, result.stderr[-3000:]
    modules, cycles = json.loads(result.stdout)
    return modules, cycles


def test_no_import_cycles(installed_layout):
    """No module imports one that imports it back, however indirectly, counting every import: lazy ones (inside a
    function) and those under `if TYPE_CHECKING:` too — either is still one module knowing the other."""
    modules, cycles = _cycles("tokentui", installed_layout)
    assert "tokentui.core.model.engine" in modules and "tokentui.tui.app" in modules  # the copy was read whole
    assert cycles == [], f"{len(cycles)} import cycles:\n" + "\n".join(
        f"  cycle {n}:\n" + "\n".join("    " + tie for tie in ties) for n, ties in enumerate(cycles, 1))


def test_the_cycle_check_counts_lazy_and_type_checking_imports(tmp_path):
    """The check above can fail: a package whose cycles close only through an import inside a function or one
    under TYPE_CHECKING has each of them found, with the imports that tie it; an import one way only is none."""
    package = tmp_path / "standin"
    package.mkdir()
    files = {
        "__init__.py": "",
        "lazy_a.py": "def f():\n    from . import lazy_b\n    return lazy_b\n",
        "lazy_b.py": "from . import lazy_a\n",
        "typed_a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .typed_b import B\n",
        "typed_b.py": "from .typed_a import *\nclass B: ...\n",
        "one_way.py": "from . import lazy_a, typed_a\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    modules, cycles = _cycles("standin", tmp_path)
    assert "standin.one_way" in modules
    assert sorted(cycles) == [
        ["standin.lazy_a -> standin.lazy_b (line 2: from . import lazy_b)",
         "standin.lazy_b -> standin.lazy_a (line 1: from . import lazy_a)"],
        ["standin.typed_a -> standin.typed_b (line 3: from .typed_b import B)",
         "standin.typed_b -> standin.typed_a (line 1: from .typed_a import *)"],
    ]


def test_the_cycle_finder_finds_a_cycle():
    """Tarjan's algorithm finds the strongly connected sets, a self-import aside (a stand-in graph)."""

    class Graph:
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}

        def find_modules_directly_imported_by(self, module):
            return self.edges[module]

    assert strongly_connected(Graph(), set(Graph.edges)) == [{"a", "b", "c"}]
