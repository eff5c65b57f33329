"""Import cycles in a module graph (tests/unit/test_layers.py).

Run as a script (`python import_graph.py PACKAGE`, with PACKAGE importable) it prints, as JSON, the package's modules
and every cycle among them with the imports that tie it. Every import counts: grimp reads each import statement of
a module, those inside functions (lazy) and under `if TYPE_CHECKING:` included (exclude_type_checking_imports off),
since either is still one module knowing the other."""

from __future__ import annotations

import json
import sys


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


def cycles_of(package: str) -> tuple[list[str], list[list[str]]]:
    """`package`'s modules, and its cycles: each a list of "importer -> imported (line N: the import)" ties."""
    import grimp

    graph = grimp.build_graph(package, include_external_packages=False, exclude_type_checking_imports=False,
                              cache_dir=None)
    modules = {m for m in graph.modules if m == package or m.startswith(package + ".")}
    found = []
    for component in strongly_connected(graph, modules):
        ties = []
        for importer in sorted(component):
            for imported in sorted(graph.find_modules_directly_imported_by(importer) & component):
                details = graph.get_import_details(importer=importer, imported=imported)
                ties += [f"{importer} -> {imported} (line {d['line_number']}: {d['line_contents'].strip()})"
                         for d in details] or [f"{importer} -> {imported}"]
        found.append(ties)
    return sorted(modules), found


if __name__ == "__main__":
    print(json.dumps(cycles_of(sys.argv[1])))
