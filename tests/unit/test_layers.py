"""The layers of the code, checked: the import-linter contracts in pyproject.toml hold, and no import cycle exists
among tokentui's modules (core/, tui/, themes/, tokentui/).

tokentui installs core/, tui/ and themes/ as tokentui.core / tokentui.tui / tokentui.themes (pyproject's
package-dir), which import-linter's module finder (grimp: it walks the root package's folder) cannot see in the
source tree; so the checks run on a copy of the sources laid out as installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_models import REPO

grimp = pytest.importorskip("grimp")


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


def strongly_connected(graph, modules: set[str]) -> list[set[str]]:
    """Tarjan's algorithm over `modules`' direct imports (hand-written: grimp finds chains between two modules,
    not cycles; networkx would be a dependency for one function)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = [0]

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start) & modules)))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt) & modules))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles(installed_layout, monkeypatch):
    monkeypatch.syspath_prepend(str(installed_layout))
    graph = grimp.build_graph("tokentui", include_external_packages=False, exclude_type_checking_imports=True,
                              cache_dir=None)
    modules = {m for m in graph.modules if m.startswith("tokentui")}
    assert "tokentui.core.model.engine" in modules and "tokentui.tui.app" in modules  # the copy was read whole
    # a package's __init__ importing its own modules is not a cycle between them
    cycles = [c for c in strongly_connected(graph, modules) if not any(m + "." in n for m in c for n in c)]
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a cycle, even through a lazy import, is found (a stand-in graph)."""

    class Graph:
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}

        def find_modules_directly_imported_by(self, module):
            return self.edges[module]

    assert strongly_connected(Graph(), set(Graph.edges)) == [{"a", "b", "c"}]
