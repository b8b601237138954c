"""The statements that assign a module-level name, hashed (for step keys, `_fingerprint`).

A step key counts a module-level value that is not code by the source of the statement assigning it
(`SCALE = 2`, `DELAY = float(os.environ["DELAY"])`), not by what it holds while the program runs: this
module finds those statements (following `from x import name` into user modules) and hashes them.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys

from ._libraries import library_module


def assignment_source(module: str, name: str, hops: int = 0) -> str | None:
    """SHA-256 of the top-level statements of `module`'s file that assign `name` (following `from x import
    name` into user modules), or None when the file or such a statement is not found."""
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None)
    if not path or not path.endswith(".py") or hops > 4:
        return None
    try:
        st = os.stat(path)
        assigns, imports = _module_statements(path, st.st_mtime_ns, st.st_size)
    except (OSError, SyntaxError, ValueError):
        return None
    if name in assigns:
        return assigns[name]
    if name in imports:
        source_module, original = imports[name]
        if source_module.startswith("."):
            try:
                source_module = importlib.util.resolve_name(source_module, getattr(mod, "__package__", None))
            except (ImportError, ValueError):
                return None
        if not library_module(source_module):
            return assignment_source(source_module, original, hops + 1)
    return None


@functools.lru_cache(maxsize=256)
def _module_statements(
    path: str, mtime_ns: int, size: int
) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """For one file (cached while it is unchanged): name -> hash of the statements assigning it at module
    level (also inside `if`/`try`/`with`/`for` blocks, not in functions or classes), and name -> (module,
    name) of its `from ... import` statements."""
    import ast

    with open(path, "rb") as f:
        tree = ast.parse(f.read(), filename=path)
    texts: dict[str, list[str]] = {}
    imports: dict[str, tuple[str, str]] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    imports[alias.asname or alias.name] = ("." * node.level + (node.module or ""), alias.name)
            for target in targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        texts.setdefault(n.id, []).append(ast.dump(node))
            for field in ("body", "orelse", "finalbody", "handlers"):
                sub = getattr(node, field, None)
                if isinstance(sub, list) and not isinstance(
                    node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
                ):
                    visit([x for x in sub if isinstance(x, ast.stmt | ast.excepthandler)])  # type: ignore[misc]

    visit(tree.body)
    digests = {
        k: hashlib.sha256("\n".join(v).encode("utf-8", "surrogatepass")).hexdigest() for k, v in texts.items()
    }
    return digests, imports
