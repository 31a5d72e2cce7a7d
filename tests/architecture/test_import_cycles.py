"""No module of numapin's packages imports another that imports it back, directly or through others.

The import graph is read from the source (every ``import`` / ``from ... import`` statement, those inside
functions and under ``if TYPE_CHECKING`` included: a lazy import that hides a cycle is still a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("allocator", "kubeapi", "criproxy", "webhook", "nriplugin", "numapin", "numapin_lab")
# Cycles still to remove (none left). A cycle not listed here fails the test; so does a listed one that is gone
# (delete its line).
KNOWN_CYCLES: list[list[str]] = []


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the project modules it imports (``from pkg import sub`` counts pkg.sub when it is a module)."""
    files = {module_name(p): p for pkg in packages for p in (REPO / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        base = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    origin = f"{anchor}.{node.module}" if node.module else anchor
                else:
                    origin = node.module or ""
                targets = [origin] + [f"{origin}.{a.name}" for a in node.names]
            for t in targets:
                dep = resolve(t)
                if dep is not None and dep != mod:
                    graph[mod].add(dep)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_the_checker_sees_a_cycle() -> None:
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}
    assert cycles(graph) == [["a.x", "a.y", "a.z"]]


def test_the_graph_holds_lazy_and_type_checking_imports() -> None:
    graph = import_graph(("allocator",))
    assert "allocator.topology_manager.factory" in graph["allocator.topology_manager.manager"]
    assert "allocator.pod" in graph["allocator.topology_manager.scope"]  # under TYPE_CHECKING


def test_no_import_cycle() -> None:
    assert cycles(import_graph(PACKAGES)) == KNOWN_CYCLES


@pytest.mark.parametrize("package", ["allocator", "webhook", "numapin", "numapin_lab"])
def test_package_is_acyclic(package: str) -> None:
    found = [c for c in cycles(import_graph(PACKAGES)) if any(m.split(".")[0] == package for m in c)]
    assert found == [], f"import cycles through {package}: {found}"
