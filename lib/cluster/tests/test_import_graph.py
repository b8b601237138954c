"""The modules of schooner.cluster import each other without a circle, counting module-level, function-local
and type-only (`if TYPE_CHECKING:`) imports alike, and the package face never imports the command line."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "schooner.cluster"


def _modules() -> dict[str, Path]:
    out = {}
    for path in (ROOT / "schooner" / "cluster").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of the package it imports anywhere in its file.

    `from pkg import name` is an edge to `pkg.name` when that is a module, else to `pkg`."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[: len(base) - (node.level - 1)]
                    src = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                for a in node.names:
                    targets.append(f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src)
            for t in targets:
                while t and t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != mod:
                    graph[mod].add(t)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle() -> None:
    assert strongly_connected(import_graph()) == []


def test_the_checker_finds_a_circle() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_package_face_never_imports_the_command_line() -> None:
    graph = import_graph()
    assert not {m for m in graph[PACKAGE] if m.startswith(f"{PACKAGE}.cli")}


def test_moved_command_helpers_still_import_with_a_deprecation_warning() -> None:
    import pytest

    from schooner.cluster import cli
    from schooner.cluster.cli import _run

    for name in ("module_handles", "capture_steps"):
        with pytest.warns(DeprecationWarning, match=f"schooner.cluster.cli.{name} moved"):
            assert getattr(cli, name) is getattr(_run, name)


def test_the_old_private_report_module_still_serves() -> None:
    from schooner.cluster import write_report
    from schooner.cluster.cli._report import write_report as old

    assert old is write_report
