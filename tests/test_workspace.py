"""Workspace rules from DESIGN.md, checked statically: layout, import direction, lazy heavy imports."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
LIBS = sorted(p.parent for p in ROOT.glob("lib/*/pyproject.toml"))
NAMES = [p.name for p in LIBS]
HEAVY = ("ray", "wandb", "datasets", "matplotlib", "tensorboardX", "lm_eval", "torch")


def _project(lib: Path) -> dict:
    return tomllib.loads((lib / "pyproject.toml").read_text())["project"]


def test_six_packages() -> None:
    assert sorted(["cluster", "data", "tokenize", "model", "train", "eval"]) == NAMES


@pytest.mark.parametrize("lib", LIBS, ids=NAMES)
def test_package_layout(lib: Path) -> None:
    proj = _project(lib)
    assert proj["name"] == f"schooner-{lib.name}"
    assert proj["requires-python"] == ">=3.11", "one requires-python everywhere"
    for f in ("README.md", "CHANGELOG.md"):
        assert (lib / f).is_file(), f"{lib}/{f} is missing"
    assert proj["version"] in (lib / "CHANGELOG.md").read_text(), (
        f"{lib}/CHANGELOG.md has no entry for {proj['version']}"
    )
    assert (lib / "src/schooner" / lib.name / "__init__.py").is_file()
    assert not (lib / "src/schooner/__init__.py").exists(), (
        "schooner/ must stay a PEP 420 namespace (no __init__.py)"
    )
    assert any((lib / "tests").glob("test_*.py")), f"{lib}/tests has no tests"


def _schooner_imports(lib: Path) -> dict[str, set[str]]:
    """Sibling packages each source file of `lib` imports (anywhere in the file, lazily or not)."""
    found: dict[str, set[str]] = {}
    for py in (lib / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text(), filename=str(py))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for n in names:
                parts = n.split(".")
                if parts[0] == "schooner" and len(parts) > 1 and parts[1] != lib.name:
                    found.setdefault(parts[1], set()).add(str(py.relative_to(ROOT)))
                if parts[0] == "experiments":
                    found.setdefault("experiments", set()).add(str(py.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("lib", LIBS, ids=NAMES)
def test_imports_flow_down(lib: Path) -> None:
    declared = {
        Requirement(r).name.removeprefix("schooner-")
        for r in _project(lib).get("dependencies", [])
        if r.startswith("schooner-")
    }
    bad = {k: v for k, v in _schooner_imports(lib).items() if k not in declared}
    assert not bad, (
        f"schooner-{lib.name} imports packages it does not declare (declare them or move the code): {bad}"
    )


def test_no_heavy_imports_at_import_time() -> None:
    code = (
        "import sys\n"
        + "".join(f"import schooner.{n}\n" for n in NAMES)
        + f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"importing the packages loaded heavy optional modules: {out.strip()}"
