"""schooner.train has no import circle: module-level, function-local and type-only imports alike."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "src"
PACKAGE = "schooner.train"


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: pathlib.Path, modules: set[str]) -> set[str]:
    """The package's modules `path` imports, wherever the import statement sits."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in modules:  # `from x import name`: the module x (or a submodule x.name)
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name:
                found.add(t)
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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


def import_graph() -> dict[str, set[str]]:
    files = sorted((ROOT / "schooner" / "train").rglob("*.py"))
    modules = {module_name(p) for p in files}
    graph = {module_name(p): imports_of(p, modules) for p in files}
    # a package's __init__ runs before its submodules: importing `a.b` imports `a` (not a cycle edge we own)
    return graph


def test_no_import_circle_in_schooner_train() -> None:
    graph = import_graph()
    assert len(graph) > 20 and "schooner.train._trainer" in graph
    assert strongly_connected(graph) == []


def test_the_engine_does_not_import_the_step_builders() -> None:
    graph = import_graph()
    for module, deps in graph.items():
        if not module.startswith(("schooner.train.steps", "schooner.train.scaling")) and module != PACKAGE:
            assert not {d for d in deps if d.startswith("schooner.train.steps")}, module


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_files_go_through_the_cluster_storage_and_records_modules() -> None:
    """No raw fsspec in schooner.train (storage is `schooner.cluster.storage`), and the step runner's own
    files (`.schooner/status.json`, `history.jsonl`) are read through `schooner.cluster.records`, never by
    path."""
    offenders = []
    for path in sorted((ROOT / "schooner" / "train").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {  # docstrings may name the files; code may not build their paths
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n == "fsspec" or n.startswith("fsspec.") for n in names):
                    offenders.append(f"{path.name}:{node.lineno}: imports fsspec")
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and any(s in node.value for s in (".schooner/", "status.json", "history.jsonl"))
            ):
                offenders.append(f"{path.name}:{node.lineno}: {node.value!r}")
    assert offenders == []
