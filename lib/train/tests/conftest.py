"""Shared fixtures: a real byte-level BPE tokenizer trained on Python stdlib source, and token caches."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os

import pytest


def stdlib_texts() -> list[str]:
    """Real text: the source of a few stdlib modules, split into function-sized documents."""
    import argparse
    import dataclasses as dc
    import json as js
    import textwrap

    docs: list[str] = []
    for mod in (argparse, dc, js.decoder, textwrap):
        src = inspect.getsource(mod)
        docs.extend(chunk for chunk in src.split("\n\n\n") if chunk.strip())
    return docs


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`<dir>/train`, `<dir>/validation` token caches and `<dir>/tokenizer.json` (vocab 320)."""
    from schooner.tokenize import train_bpe, write_cache

    root = tmp_path_factory.mktemp("data")
    texts = stdlib_texts()
    tok = train_bpe(texts, vocab_size=320)
    tok.save(str(root))
    docs = [tok.encode(t) for t in texts]
    n_val = max(4, len(docs) // 10)
    write_cache(str(root / "train"), docs[n_val:], tok)
    write_cache(str(root / "validation"), docs[:n_val], tok)
    return str(root)


def _nano(vocab_size: int = 320, **overrides):
    """The llama_nano preset, smaller still (2 layers, 64 wide), for fast tests."""
    from schooner.model import presets

    cfg = dataclasses.replace(
        presets.llama_nano,
        vocab_size=vocab_size,
        hidden_dim=64,
        intermediate_dim=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_seq_len=128,
    )
    return dataclasses.replace(cfg, **overrides)


@pytest.fixture(scope="session")
def nano():
    """A factory: the llama_nano preset shrunk to 2 layers x 64 wide, with overrides."""
    return _nano


def _read_losses(run_dir: str) -> dict[int, float]:
    """step -> train loss from a run's metrics.jsonl."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if "train/loss" in row:
                out[row["step"]] = row["train/loss"]
    return out


@pytest.fixture(scope="session")
def read_losses():
    """A function: step -> train loss from a run folder's metrics.jsonl."""
    return _read_losses


@pytest.fixture(autouse=True)
def _no_persistent_compilation_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests must not write into the user's ~/.cache; train() honours this switch.
    monkeypatch.setenv("SCHOONER_COMPILATION_CACHE", "off")
