"""The type check: mypy over every package's src/ (and tools/), and every public function fully annotated.

    uv run python .ci/guards.py types [PACKAGE ...]      (or: uv run python -m tools.typecheck)

mypy (pinned below, run through `uv tool run`, so it is not a dependency of the workspace) sees the
project's environment for third-party types and `lib/*/src` for the packages; its settings and the
strictness are in tools/mypy.ini. mypy cannot tell public from private, so the rule that the public API is
annotated is checked here: for each name a package's `__init__.py` exports, and each public top-level
function or class of its public modules (`steps.py`, `presets.py`, ...), every parameter and the return
must be annotated, methods of public classes included (except `_private` ones). Errors are printed per
package, as `file:line: message`.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from .workspace import ROOT, packages

MYPY = "mypy==2.4.1"


def _owner(path: str, root: Path) -> str:
    rel = Path(path)
    rel = rel.relative_to(root) if rel.is_absolute() else rel
    parts = rel.parts
    return f"schooner-{parts[1]}" if parts[0] == "lib" and len(parts) > 1 else parts[0]


def run_mypy(names: list[str], root: Path = ROOT) -> tuple[int, list[str]]:
    """(mypy's exit status, its error lines) over the packages `names` and tools/."""
    pkgs = packages(root)
    targets = [a for n in names for a in ("-p", pkgs[n].module)] + ["-p", "tools"]
    cache = Path(tempfile.gettempdir()) / "schooner-mypy-cache"
    env = {
        **os.environ,
        "MYPYPATH": os.pathsep.join([*(str(p.dir / "src") for p in pkgs.values()), str(root)]),
    }
    cmd = [
        "uv", "tool", "run", "--from", MYPY, "mypy", "--config-file", str(root / "tools" / "mypy.ini"),
        "--python-executable", sys.executable, "--cache-dir", str(cache), *targets,
    ]  # fmt: skip
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if re.match(r"^\S+\.py:\d+: error:", line)]
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not lines):
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
        lines.append(f"mypy: exited {proc.returncode} without error lines (see above)")
    return proc.returncode, lines


def _unannotated(fn: ast.FunctionDef | ast.AsyncFunctionDef, *, method: bool) -> list[str]:
    args = fn.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    if (
        method
        and params
        and not any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    ):
        params = params[1:]  # self / cls
    missing = [a.arg for a in params if a.annotation is None]
    missing += [f"*{a.arg}" for a in (args.vararg,) if a is not None and a.annotation is None]
    missing += [f"**{a.arg}" for a in (args.kwarg,) if a is not None and a.annotation is None]
    gaps = [f"parameter {m!r} has no annotation" for m in missing]
    if fn.returns is None and not (fn.name == "__init__" and not missing and params):
        gaps.append("no return annotation")
    return gaps


def _check_def(node: ast.AST, path: Path, root: Path) -> list[str]:
    out = []
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        out += [
            f"{path.relative_to(root)}:{node.lineno}: {node.name}: {g}"
            for g in _unannotated(node, method=False)
        ]
    elif isinstance(node, ast.ClassDef):
        for item in node.body:
            if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if not item.name.startswith("_") or item.name in ("__init__", "__call__"):
                for g in _unannotated(item, method=True):
                    out.append(f"{path.relative_to(root)}:{item.lineno}: {node.name}.{item.name}: {g}")
    return out


def _module_file(pkg_dir: Path, module: str) -> Path | None:
    base = pkg_dir / Path(*module.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def public_api_gaps(name: str, root: Path = ROOT) -> list[str]:
    """`file:line: name: what is missing` for each public function or method of `name` not fully annotated."""
    pkg = packages(root)[name]
    src = pkg.dir / "src" / Path(*pkg.module.split("."))
    gaps: list[str] = []
    seen: set[tuple[Path, str]] = set()

    def check_name(path: Path, wanted: str) -> None:
        if (path, wanted) in seen:
            return
        seen.add((path, wanted))
        for node in ast.parse(path.read_text()).body:
            if getattr(node, "name", None) == wanted:
                gaps.extend(_check_def(node, path, root))

    for py in sorted(src.rglob("*.py")):
        rel = py.relative_to(src)
        if any(part.startswith("_") and part != "__init__.py" for part in rel.parts):
            continue  # private modules: only what __init__ re-exports from them is public
        tree = ast.parse(py.read_text())
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level > 0 and node.module:
                base = py.parent if node.level == 1 else py.parents[node.level - 1]
                target = _module_file(base, node.module)
                for alias in node.names:
                    if target is not None and not alias.name.startswith("_"):
                        check_name(target, alias.name)
            elif py.name != "__init__.py" and not getattr(node, "name", "_").startswith("_"):
                gaps.extend(_check_def(node, py, root))
    return gaps


def main(argv: list[str] | None = None) -> int:
    names = list(argv or []) or sorted(packages(ROOT))
    rc, errors = run_mypy(names)
    by_owner: dict[str, list[str]] = {}
    for line in errors:
        by_owner.setdefault(_owner(line.split(":", 1)[0], ROOT), []).append(line)
    for name in names:
        by_owner.setdefault(name, [])
        by_owner[name] += [f"{g}  [public-api]" for g in public_api_gaps(name)]
    total = 0
    for owner in sorted(by_owner):
        found = by_owner[owner]
        total += len(found)
        print(f"types: {owner}: {len(found)} errors")
        for line in found:
            print(f"  {line}")
    print(f"types: {total} errors" if total else "types: clean")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
