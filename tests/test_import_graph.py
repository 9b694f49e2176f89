"""No two modules of the project import each other, directly or around a circle, at any level.

Every `import` and `from ... import` in runner/, analysis/ and bench/ counts, those inside functions too
(a lazy import hides a circle from the interpreter, not from the reader). A circle is a strongly connected
component of more than one module in the graph of those imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runner", "analysis", "bench")


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (`from a.b import c` names a.b.c where c is a module)."""

    def owner(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                imported.update(owner(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.update(owner(f"{node.module}.{alias.name}") for alias in node.names)
        graph[name] = imported - {"", name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module, iteratively."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is not None:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                elif successor in on_stack:
                    low[node] = min(low[node], index[successor])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def test_circles_are_found():
    # the detector itself: a circle of three, a self-import and a chain
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_lazy_imports(tmp_path):
    (tmp_path / "low.py").write_text("def late():\n    from high import f\n    return f()\n")
    (tmp_path / "high.py").write_text("import low\n\ndef f():\n    return 1\n")
    graph = import_graph({"low": tmp_path / "low.py", "high": tmp_path / "high.py"})
    assert graph == {"low": {"high"}, "high": {"low"}}
    assert circles(graph) == [["high", "low"]]
    assert len(import_graph(project_modules())) > 100


def test_no_import_circle_in_the_project():
    found = circles(import_graph(project_modules()))
    assert not found, "modules that import each other: " + "; ".join(" -> ".join(c) for c in found)
