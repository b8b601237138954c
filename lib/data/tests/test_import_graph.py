"""schooner.data has no import circle: module-level, function-local and TYPE_CHECKING imports alike."""

from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in (SRC / "schooner" / "data").rglob("*.py"):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _targets(mod: str, path: pathlib.Path, node: ast.AST, mods: dict[str, pathlib.Path]) -> list[str]:
    """What an import statement imports: `from pkg import sub` is the module `pkg.sub` when it is one,
    else (a name defined in `pkg`) the module `pkg`. A module's parent packages, which Python runs first,
    are not counted (every module would otherwise sit in a circle with its package's `__init__`)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)]
        pkg = ".".join(base + ([node.module] if node.module else []))
    else:
        pkg = node.module or ""
    return [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in mods else pkg for a in node.names]


def import_graph() -> dict[str, set[str]]:
    """Edges module -> schooner.data module it imports (anywhere in its body), by static reading."""
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            for t in _targets(m, p, node, mods):
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    edges[m].add(t)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_circles_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    edges = import_graph()
    assert "schooner.data.fixtures._pages" in edges["schooner.data.fixtures._junk"]  # module level
    assert "schooner.data.sources" in edges["schooner.data._dataset"]  # inside a function
    assert "schooner.data.storage" in edges["schooner.data._folders"]  # `from . import storage`


def test_schooner_data_has_no_import_circle() -> None:
    found = circles(import_graph())
    assert found == [], (
        f"import circles in schooner.data (break each by moving the shared part down): {found}"
    )
