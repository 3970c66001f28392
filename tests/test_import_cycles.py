"""No import cycle in ``src/loadshed``: modules form layers, each importing only below it.

The graph is read from the source with :mod:`ast` (nothing is imported). It counts every
import of a loadshed module: at module level, under ``if TYPE_CHECKING:`` and inside
functions (a lazy import hides a cycle from the interpreter, not from a reader), so it is
stricter than what Python itself would trip on.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "loadshed"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _parse(source: str) -> ast.Module:
    """``ast.parse``, tried again if another thread parsed at the same time.

    CPython 3.11 before 3.11.8 keeps the AST constructor's recursion depth in shared
    state: a traceback formatted in a server thread of an earlier test (which parses
    source lines) can make a parse here fail with ``SystemError: AST constructor
    recursion depth mismatch`` (python/cpython#106905).
    """
    for _ in range(4):
        try:
            return ast.parse(source)
        except SystemError:
            continue
    return ast.parse(source)


def imported_names(name: str, path: Path) -> Iterator[str]:
    """The dotted names that module ``name`` imports (``from a import b`` gives ``a.b``:
    the submodule when there is one, else ``a`` once resolved below)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(_parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    """Module -> the loadshed modules it imports."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges: set[str] = set()
        for target in imported_names(name, path):
            while target and target not in known:  # an attribute: its module
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: list[str] = []
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


def test_the_finder_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_graph_reads_every_kind_of_import() -> None:
    graph = import_graph()
    assert "loadshed.limits.base" in graph["loadshed.limiter"]  # module level
    assert "loadshed.limits" in graph["loadshed.limiter"]  # inside a function
    assert "loadshed.limiter" in graph["loadshed.metrics"]  # under TYPE_CHECKING
    assert "loadshed.cli" in graph["loadshed.__main__"]


def test_no_import_cycle_in_src() -> None:
    assert cycles(import_graph()) == []
