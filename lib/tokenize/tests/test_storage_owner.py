"""Storage has one owner (issue 35): tokenize reads and writes its caches, ledgers, manifests and tokenizer
files through `schooner.cluster.storage` (atomic writes, deterministic JSON refusing NaN); of
`schooner.data.storage` it uses only what identifies input record files; no module opens fsspec, renames
files or makes temporary files itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import schooner.tokenize

PACKAGE = Path(schooner.tokenize.__file__).parent
INPUT_SIDE = {"file_identity", "has_glob"}  # schooner.data's notion of an input file


def _imports(tree: ast.AST) -> list[tuple[str, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names]
    return out


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_tokenize_reads_and_writes_through_the_cluster_storage_module(path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for module, name in _imports(tree):
        assert (module, name) != ("schooner.data", "storage"), f"{path.name}: use schooner.cluster.storage"
        if module == "schooner.data.storage":
            assert name in INPUT_SIDE, (
                f"{path.name}: schooner.data.storage.{name}; use schooner.cluster.storage"
            )
        assert module.split(".")[0] not in ("fsspec", "tempfile"), f"{path.name} imports {module}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            assert node.attr not in ("replace", "rename"), (
                f"{path.name}: os.{node.attr}; use storage.atomic_open"
            )
