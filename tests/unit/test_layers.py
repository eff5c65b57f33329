"""The layers of the code, checked: the import-linter contracts in pyproject.toml hold, and no import cycle exists
among tokentui's modules (core/, tui/, themes/, tokentui/).

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
    assert "0 broken" in result.stdout and "Contracts: 4 kept" in result.stdout, result.stdout[-2000:]


def test_no_import_cycles(installed_layout):
    # in a fresh interpreter: grimp finds `tokentui` by importing it, and here it is the editable install's
    code = (
        "import json, sys, grimp; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]); "
        "from import_graph import strongly_connected; "
        "g = grimp.build_graph('tokentui', include_external_packages=False, exclude_type_checking_imports=True, "
        "cache_dir=None); mods = {m for m in g.modules if m.startswith('tokentui')}; "
        "print(json.dumps([sorted(mods), [sorted(c) for c in strongly_connected(g, mods)]]))")
    result = subprocess.run([sys.executable, "-c", code, str(installed_layout), str(Path(__file__).parent.parent)],
                            cwd=installed_layout, capture_output=True, text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(installed_layout)})
    assert result.returncode == 0, result.stderr[-3000:]
    modules, cycles = json.loads(result.stdout)
    assert "tokentui.core.model.engine" in modules and "tokentui.tui.app" in modules  # the copy was read whole
    # a package's __init__ importing its own modules is not a cycle between them
    cycles = [c for c in cycles if not any(m + "." in n for m in c for n in c)]
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a cycle, even through a lazy import, is found (a stand-in graph)."""

    class Graph:
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}

        def find_modules_directly_imported_by(self, module):
            return self.edges[module]

    assert strongly_connected(Graph(), set(Graph.edges)) == [{"a", "b", "c"}]
