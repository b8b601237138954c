"""No import circle among tokenize's modules, counting every import: module level, inside functions, and under
`if TYPE_CHECKING:` alike (a circle hidden in a function is still a circle in the design)."""

from __future__ import annotations

import ast
from pathlib import Path

import schooner.tokenize

PACKAGE = Path(schooner.tokenize.__file__).parent


def _modules(root: Path, name: str) -> dict[str, Path]:
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([name, *parts])] = f
    return out


def import_graph(root: Path, name: str) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (a submodule's implicit import of its parent
    package is left out: every submodule has it)."""
    mods = _modules(root, name)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                parent = ".".join(base[: len(base) - node.level + 1] + [node.module or ""]).strip(".")
                parent = parent if node.level else (node.module or "")
                targets = [
                    f"{parent}.{a.name}" if f"{parent}.{a.name}" in mods else parent for a in node.names
                ]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_package_has_no_import_circle() -> None:
    graph = import_graph(PACKAGE, "schooner.tokenize")
    assert len(graph) > 5  # the walk found the package's modules
    found = circles(graph)
    assert not found, "import circles (move the shared piece into a module of its own): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_the_check_sees_lazy_and_type_only_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from ._a import f as f\n")
    (pkg / "_a.py").write_text("from . import _d\n\ndef f():\n    from ._b import g\n    return g\n")
    (pkg / "_b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg._a import f\n"
    )
    (pkg / "_c.py").write_text("import pkg._d\n")
    (pkg / "_d.py").write_text("X = 1\n")
    graph = import_graph(pkg, "pkg")
    assert graph == {"pkg": {"pkg._a"}, "pkg._a": {"pkg._b", "pkg._d"}, "pkg._b": {"pkg._a"},
                     "pkg._c": {"pkg._d"}, "pkg._d": set()}  # fmt: skip
    assert circles(graph) == [["pkg._a", "pkg._b"]]
