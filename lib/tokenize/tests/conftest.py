"""Shared fixtures: a small real BPE tokenizer trained on stdlib sources, and token caches built from it."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from schooner.tokenize import Tokenizer, train_bpe


def stdlib_texts(n: int = 40, start: int = 0) -> list[str]:
    """Real text: the first `n` modules of this interpreter's standard library (sorted, deterministic)."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[start : start + n]
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


@pytest.fixture(scope="session")
def texts() -> list[str]:
    return stdlib_texts(40)


@pytest.fixture(scope="session")
def tokenizer(texts: list[str]) -> Tokenizer:
    return train_bpe(texts, vocab_size=800)


@pytest.fixture(scope="session")
def tokenizer_path(tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> str:
    return tokenizer.save(tmp_path_factory.mktemp("tok"))


from schooner.cluster.pytest_fixtures import s3_prefix as s3_prefix  # noqa: E402
from schooner.cluster.pytest_fixtures import s3_server as s3_server  # noqa: E402
