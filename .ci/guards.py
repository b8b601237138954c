"""Workspace guards run by .ci/run (stdlib + `packaging` only; run with the project's Python).

python .ci/guards.py ranges   every sibling dependency range admits the sibling's current version
python .ci/guards.py exact    each package's tests pass in an environment holding only what it declares
python .ci/guards.py wheels   each package builds a wheel that installs with its declared siblings and imports
python .ci/guards.py compat   each package's tests pass against the oldest sibling versions its ranges admit
python .ci/guards.py types    mypy over each package's public API (tools/mypy.ini; not in .ci/run until clean)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def packages() -> dict[str, dict]:
    """distribution name -> {"dir": Path, "project": dict} for every workspace member and the root."""
    out = {}
    for pyproject in sorted([ROOT / "pyproject.toml", *ROOT.glob("lib/*/pyproject.toml")]):
        data = tomllib.loads(pyproject.read_text())
        out[data["project"]["name"]] = {"dir": pyproject.parent, "project": data["project"]}
    return out


def check_ranges() -> int:
    pkgs = packages()
    errors = []
    checked = 0
    for info in pkgs.values():
        proj = info["project"]
        reqs = list(proj.get("dependencies", []))
        for extra in proj.get("optional-dependencies", {}).values():
            reqs += extra
        for raw in reqs:
            req = Requirement(raw)
            if req.name not in pkgs:
                continue
            checked += 1
            current = Version(pkgs[req.name]["project"]["version"])
            if not str(req.specifier):
                errors.append(
                    f"{info['dir'].relative_to(ROOT)}/pyproject.toml: {raw!r} has no version range; add one, e.g. '>=0.1,<0.2'"
                )
            elif current not in req.specifier:
                errors.append(
                    f"{info['dir'].relative_to(ROOT)}/pyproject.toml: {raw!r} does not admit {req.name} {current}; "
                    f"widen the range or fix the version in {pkgs[req.name]['dir'].relative_to(ROOT)}/pyproject.toml"
                )
    for e in errors:
        print("range guard:", e)
    print(f"range guard: {checked} sibling ranges checked, {len(errors)} problems")
    return 1 if errors else 0


def _run(cmd: list[str], **kw) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT, **kw)


def check_exact(only: list[str]) -> int:
    """Run each library's tests with `uv run --package X --exact` in its own environment, so an import of a
    sibling the package does not declare fails, without disturbing the project's .venv."""
    failed = []
    base = Path(tempfile.mkdtemp(prefix="schooner-exact-"))
    for name, info in packages().items():
        if name == "schooner" or (only and name not in only):
            continue
        tests = info["dir"] / "tests"
        env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(base / name)}
        cmd = [
            "uv",
            "run",
            "--locked",
            "--package",
            name,
            "--exact",
            "--all-extras",
            "pytest",
            str(tests.relative_to(ROOT)),
            "-n",
            "auto",
            "-q",
            "-p",
            "no:cacheprovider",
        ]
        rc = _run(cmd, env=env)
        if rc == 5:
            print(f"exact guard: {name} has no tests")
            failed.append(name)
        elif rc != 0:
            failed.append(name)
    shutil.rmtree(base, ignore_errors=True)
    print(
        f"exact guard: failed: {failed}"
        if failed
        else "exact guard: every package passes with only what it declares"
    )
    return 1 if failed else 0


def _siblings(name: str) -> set[str]:
    """`name` and every workspace sibling it needs (base dependencies only), transitively."""
    pkgs = packages()
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        todo += [
            r.name for r in map(Requirement, pkgs[n]["project"].get("dependencies", [])) if r.name in pkgs
        ]
    return seen


def _wheels(dist: Path, name: str) -> list[Path]:
    """The built wheel files of `name` and its siblings: installed by path, so no index can substitute them."""
    return [next(dist.glob(n.replace("-", "_") + "-*.whl")) for n in sorted(_siblings(name))]


_TEST_ONLY = re.compile(r"(^|/)(tests?|conftest\.py|pytest_fixtures\.py|testing\.py)(/|$)")


def check_wheels() -> int:
    """Build every library's wheel; install each alone (plus its declared siblings, from the built wheels) in a
    fresh venv and import it."""
    dist = Path(tempfile.mkdtemp(prefix="schooner-dist-"))
    failed = []
    names = [n for n in packages() if n != "schooner"]
    for name in names:
        if _run(["uv", "build", "--package", name, "--wheel", "--out-dir", str(dist), "-q"]) != 0:
            failed.append(f"{name} (build)")
    for wheel in dist.glob("*.whl"):  # test scaffolding stays in the source tree
        shipped = [n for n in zipfile.ZipFile(wheel).namelist() if _TEST_ONLY.search(n)]
        if shipped:
            print(f"wheel guard: {wheel.name} ships test-only files: {shipped}")
            failed.append(f"{wheel.name} (test files)")
    for name in names:
        venv = dist / f"venv-{name}"
        module = "schooner." + name.removeprefix("schooner-")
        py = venv / "bin" / "python"
        ok = (
            _run(["uv", "venv", "-q", "--python", sys.executable, str(venv)]) == 0
            and _run(["uv", "pip", "install", "-q", "--python", str(py), *map(str, _wheels(dist, name))]) == 0
            and _run(
                [str(py), "-c", f"import {module}, sys; print('{name} imports from', {module}.__file__)"]
            )
            == 0
        )
        if not ok:
            failed.append(name)
    shutil.rmtree(dist, ignore_errors=True)
    print(
        f"wheel guard: failed: {failed}"
        if failed
        else f"wheel guard: {len(names)} wheels build, install and import"
    )
    return 1 if failed else 0


def check_compat(only: list[str]) -> int:
    """The compatibility matrix (tools/compat.py): built wheels of the oldest admitted sibling versions."""
    sys.path.insert(0, str(ROOT))
    from tools import compat

    return compat.main(only)


def check_types(only: list[str]) -> int:
    """mypy over each package's public API (tools/typecheck.py)."""
    sys.path.insert(0, str(ROOT))
    from tools import typecheck

    return typecheck.main(only)


def main(argv: list[str]) -> int:
    commands = {
        "ranges": lambda rest: check_ranges(),
        "exact": check_exact,
        "wheels": lambda rest: check_wheels(),
        "compat": check_compat,
        "types": check_types,
    }
    if not argv or argv[0] not in commands:
        print(__doc__)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
