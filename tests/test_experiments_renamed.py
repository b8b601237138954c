"""`experiments.tokenizers` (renamed `experiments.tokenizer_defs`) still imports for one release, with a warning,
and no file in experiments/ shadows an installed package when a script there runs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_old_name_warns_and_gives_the_same_handles() -> None:
    from experiments import tokenizer_defs

    with pytest.warns(DeprecationWarning, match="experiments.tokenizer_defs import default_tokenizer"):
        from experiments.tokenizers import default_tokenizer
    assert default_tokenizer is tokenizer_defs.default_tokenizer
    with pytest.warns(DeprecationWarning, match="renamed experiments.tokenizer_defs"):
        import experiments.tokenizers as old

        assert old.python_docs_records is tokenizer_defs.python_docs_records


def test_no_file_in_experiments_shadows_an_installed_module() -> None:
    """A script in experiments/ runs with the folder first on sys.path: none of its files may hide a
    module the project's environment holds (as experiments/tokenizers.py hid Hugging Face's `tokenizers`)."""
    names = {p.stem for p in (ROOT / "experiments").glob("*.py")} | {
        p.name for p in (ROOT / "experiments").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
    }
    code = (
        "import importlib.util, sys\n"
        f"names = {sorted(names)!r}\n"
        "print(sorted(n for n in names if importlib.util.find_spec(n) is not None))\n"
    )
    # outside the repository root, so `experiments` itself and the root's folders are not on sys.path
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]", f"files in experiments/ that shadow installed modules: {out.stdout}"
    assert importlib.util.find_spec("tokenizers") is not None  # the check above looked for real packages
