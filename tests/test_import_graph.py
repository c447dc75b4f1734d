"""The import graph of the lmforge packages, read from the source (ast): each package imports only
the packages below it in docs/design.md's "Where things live", and no module imports one that
imports it back, directly or around a longer circle (lazy imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = [*sorted(REPO.glob("services/*/src")), REPO / "pipelines" / "src", REPO / "tooling" / "src"]

SERVICES = {"lmforge.dataprep", "lmforge.trainer", "lmforge.uploader", "lmforge.inference", "lmforge.canary"}
# What each package may import, besides itself.
ALLOWED = {
    "lmforge.common": set(),
    "lmforge.pages": set(),
    "lmforge.model": {"lmforge.common"},
    "lmforge.trace": {"lmforge.common"},
    **{service: {"lmforge.common", "lmforge.model", "lmforge.pages"} for service in SERVICES},
    # the trace index: data prep builds it, the server searches it (the canary asks the server over HTTP)
    **{service: {"lmforge.common", "lmforge.model", "lmforge.pages", "lmforge.trace"}
       for service in ("lmforge.dataprep", "lmforge.inference")},
    "lmforge.sample_data": {"lmforge.common", "lmforge.model"},
    "lmforge_pipelines": {"lmforge.common", "lmforge.model", "lmforge.dataprep", "lmforge.trainer",
                          "lmforge.sample_data"},
    "lmforge.demo": {"lmforge.common", "lmforge.model", "lmforge.pages", *SERVICES, "lmforge.sample_data",
                     "lmforge_pipelines"},
    "lmforge.tooling": {"lmforge.common", "lmforge.model", *SERVICES, "lmforge.demo"},
}


def modules() -> dict[str, Path]:
    found = {}
    for root in SOURCES:
        for path in root.rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "lmforge" else parts[0]


def import_graph() -> dict[str, set[str]]:
    """{module: the lmforge modules it imports}; `from pkg import mod` counts as importing pkg.mod."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in known and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_package_imports_only_the_packages_below_it():
    graph = import_graph()
    assert {package(m) for m in graph} == set(ALLOWED)  # a new package gets its place here first
    wrong = sorted(f"{m} imports {t}" for m, targets in graph.items() for t in targets
                   if package(t) != package(m) and package(t) not in ALLOWED[package(m)])
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(import_graph()) == []


def test_a_circle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
