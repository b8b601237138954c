"""DESIGN.md's import rules over the real tree, and the checker (tools/architecture.py) on small made-up trees.

The real tree passes while its violations are the known ones listed below. Each entry is a violation that a
branch of issue 35 is removing: when it merges, delete the entry (the stale-entry test says which). A new
circle, a new reach into another package's privates or a new upward import fails at once, naming the
modules and the import lines.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tools.architecture import DEPENDS_ON, ROOT, Report, Violation, check

# ------------------------------------------------------------------ known violations (delete as they go)


def _modules(package: str, *names: str) -> frozenset[str]:
    return frozenset(f"schooner.{package}.{name}" for name in names)


# Import circles: a circle found now must lie inside one of these sets of modules (a circle that shrank
# while its branch is half merged still passes).
KNOWN_CYCLES: list[frozenset[str]] = []

# (file, private thing it imports): another package's private module or name.
KNOWN_PRIVATE: set[tuple[str, str]] = {
    # train's MoE balancing test builds its reference from the model's solver constants and layers.
    ("lib/train/tests/test_moe_balance.py", "schooner.model._balancing"),
    ("lib/train/tests/test_moe_balance.py", "schooner.model._layers"),
    # the classifier page's example builds its inputs from curation privates (data's helper).
    ("docs/curation/classifier.md", "schooner.data.curation._classifier"),
}

# (package, package it imports against DESIGN.md's column), wherever in the package the import sits.
KNOWN_LAYERING: set[tuple[str, str]] = set()


def _layer_key(v: Violation) -> tuple[str, str]:
    return (v.imp.file.split("/")[1], v.target)


@pytest.fixture(scope="module")
def report() -> Report:
    return check(ROOT)


def test_no_new_import_circle(report: Report) -> None:
    new = [c for c in report.cycles if not any(c.modules <= known for known in KNOWN_CYCLES)]
    assert not new, "import circles (break them; lazy and TYPE_CHECKING imports count too):\n" + "\n".join(
        c.describe() for c in new
    )


def test_no_new_private_import(report: Report) -> None:
    new = [v for v in report.of("private") if v.key not in KNOWN_PRIVATE]
    assert not new, "imports of another package's privates:\n" + "\n".join(v.describe() for v in new)


def test_imports_flow_down_the_column(report: Report) -> None:
    new = [v for v in report.of("layering") if _layer_key(v) not in KNOWN_LAYERING]
    assert not new, "imports against DESIGN.md's dependency column:\n" + "\n".join(v.describe() for v in new)


def test_no_library_imports_experiments(report: Report) -> None:
    found = report.of("experiments")
    assert not found, "\n".join(v.describe() for v in found)


def test_known_violations_are_still_there(report: Report) -> None:
    """An entry whose violation is gone must go too, so the lists only shrink."""
    stale = [sorted(k) for k in KNOWN_CYCLES if not any(c.modules <= k for c in report.cycles)]
    stale += sorted(KNOWN_PRIVATE - {v.key for v in report.of("private")})
    stale += sorted(KNOWN_LAYERING - {_layer_key(v) for v in report.of("layering")})
    assert not stale, f"fixed, so delete from tests/test_architecture.py's known violations: {stale}"


def test_the_column_names_every_package() -> None:
    assert set(DEPENDS_ON) == {p.name for p in ROOT.glob("lib/*") if (p / "pyproject.toml").exists()}


# ------------------------------------------------------------------ the checker on made-up trees


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


COLUMN = {"a": frozenset(), "b": frozenset({"a"})}


def test_a_circle_through_a_lazy_import_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "lib/a/src/schooner/a/__init__.py": "from ._x import f as f\n",
            "lib/a/src/schooner/a/_x.py": "from ._y import g\n\ndef f():\n    return g()\n",
            "lib/a/src/schooner/a/_y.py": "def g():\n    from . import _x  # lazy\n    return _x\n",
        },
    )
    (cycle,) = check(root, COLUMN).cycles
    assert cycle.modules == {"schooner.a._x", "schooner.a._y"}
    text = cycle.describe()
    assert "lib/a/src/schooner/a/_x.py:1: from ._y import g" in text
    assert "lib/a/src/schooner/a/_y.py:2: from . import _x  # lazy" in text


def test_a_circle_through_a_type_checking_import_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "lib/a/src/schooner/a/__init__.py": "",
            "lib/a/src/schooner/a/sub/__init__.py": "",
            "lib/a/src/schooner/a/sub/_p.py": "from schooner.a.sub import _q\n",
            "lib/a/src/schooner/a/sub/_q.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..sub._p import P\n"
            ),
        },
    )
    (cycle,) = check(root, COLUMN).cycles
    assert cycle.modules == {"schooner.a.sub._p", "schooner.a.sub._q"}
    assert "_q.py:3: from ..sub._p import P" in cycle.describe()


def test_importing_the_own_package_face_from_inside_is_a_circle(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "lib/a/src/schooner/a/__init__.py": "from ._x import f as f\n",
            "lib/a/src/schooner/a/_x.py": "import importlib\nf = importlib.import_module('schooner.a')\n",
        },
    )
    (cycle,) = check(root, COLUMN).cycles
    assert cycle.modules == {"schooner.a", "schooner.a._x"}


def test_a_tree_without_circles_passes(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "lib/a/src/schooner/a/__init__.py": "from ._x import f as f\nfrom ._y import g as g\n",
            "lib/a/src/schooner/a/_x.py": "from ._y import g\n\ndef f():\n    return g()\n",
            "lib/a/src/schooner/a/_y.py": "import schooner.a._z\n\ndef g():\n    return 1\n",
            "lib/a/src/schooner/a/_z.py": "",
            "lib/b/src/schooner/b/__init__.py": "from schooner.a import f\n",
            "lib/b/tests/test_b.py": "from schooner.b import _helper\n",  # its own privates
        },
    )
    report = check(root, COLUMN)
    assert report.cycles == [] and report.violations == []


def test_private_imports_are_found_everywhere_but_the_owners_tests(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "lib/a/src/schooner/a/__init__.py": "",
            "lib/a/src/schooner/a/_x.py": "",
            "lib/a/src/schooner/a/runner/__init__.py": "",
            "lib/a/tests/test_a.py": "from schooner.a._x import thing\n",  # allowed: a's own tests
            "lib/b/src/schooner/b/__init__.py": "def f():\n    from schooner.a._x import thing\n",
            "lib/b/tests/test_b.py": "from schooner.a.runner import _publish\n",
            "benchmarks/bench.py": "import schooner.a._x as x\n",
            "experiments/exp.py": "from schooner.a import _name\n",
            "docs/page.md": "Text.\n\n```python\nimport os\nfrom schooner.a._x import y\n```\n",
        },
    )
    found = sorted((v.imp.file, v.imp.line, v.target) for v in check(root, COLUMN).of("private"))
    assert found == [
        ("benchmarks/bench.py", 1, "schooner.a._x"),
        ("docs/page.md", 5, "schooner.a._x"),
        ("experiments/exp.py", 1, "schooner.a._name"),
        ("lib/b/src/schooner/b/__init__.py", 2, "schooner.a._x"),
        ("lib/b/tests/test_b.py", 1, "schooner.a.runner._publish"),
    ]


def test_upward_imports_and_experiments_are_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "lib/a/src/schooner/a/__init__.py": "def f():\n    import schooner.b\n",
            "lib/b/src/schooner/b/__init__.py": "from experiments.models import tiny\n",
        },
    )
    report = check(root, COLUMN)
    assert [(v.imp.file, v.target) for v in report.of("layering")] == [
        ("lib/a/src/schooner/a/__init__.py", "schooner.b")
    ]
    assert [v.imp.file for v in report.of("experiments")] == ["lib/b/src/schooner/b/__init__.py"]
