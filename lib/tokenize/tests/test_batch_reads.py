"""Batches read whole (one read for a batch's windows, one for its offsets) hold exactly what the documents do.

The reference is the written documents themselves, concatenated with numpy: row `r` of a text batch is
stream positions `[s, s + seq_len)` and its segment ids count the documents started since `s`; a chat row is
its whole conversations (packed first-fit, in order), cut to `seq_len`, then padding. Nothing in the
reference goes through the reader.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from schooner.tokenize import MixtureDataset, PreferenceDataset, TokenCache, Tokenizer, write_cache
from schooner.tokenize._sequences import TokenSequences, held_bytes


def _stream(docs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(all tokens, document offsets) of `docs`, as the cache should hold them."""
    return np.concatenate(docs), np.concatenate([[0], np.cumsum([d.size for d in docs])])


def _text_rows(tokens: np.ndarray, offsets: np.ndarray, seq: np.ndarray, seq_len: int) -> dict:
    pos = seq[:, None] * seq_len + np.arange(seq_len)
    doc = np.searchsorted(offsets, pos, side="right") - 1  # the document holding each position
    return {
        "tokens": tokens[pos].astype(np.int32),
        "loss_mask": np.ones(pos.shape, np.int32),
        "segment_ids": (doc - doc[:, :1]).astype(np.int32),
    }


def _assert_same(got: dict, want: dict, what: str) -> None:
    for k, w in want.items():
        g = got[k]
        assert g.dtype == w.dtype and g.shape == w.shape, (
            f"{what} {k}: {g.dtype}{g.shape}, want {w.dtype}{w.shape}"
        )
        if not np.array_equal(g, w):
            r, t = (int(x) for x in np.argwhere(g != w)[0])
            raise AssertionError(
                f"{what} {k} row {r} position {t}: {g[r, max(0, t - 2) : t + 3]} want {w[r, max(0, t - 2) : t + 3]}"
            )


@pytest.fixture(scope="module")
def text_docs(tokenizer: Tokenizer) -> list[np.ndarray]:
    """Documents of 1..40 tokens, with a run of 700 one-token documents (a window crossing many document
    starts, and the in-memory offset index's 256-document strides) and a few long ones."""
    rng = np.random.default_rng(7)
    lengths = np.concatenate(
        [rng.integers(1, 40, 300), np.ones(700, int), rng.integers(1, 4, 200), [900, 1500]]
    )
    rng.shuffle(lengths[-202:])
    return [rng.integers(3, tokenizer.vocab_size, n) for n in lengths]


@pytest.fixture(scope="module")
def text_cache(
    text_docs: list[np.ndarray], tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory
) -> str:
    path = str(tmp_path_factory.mktemp("text") / "c")
    write_cache(path, text_docs, tokenizer, append_eos=False)
    return path


@pytest.mark.parametrize("in_memory_bytes", [0, 1 << 30])
@pytest.mark.parametrize("seq_len", [1, 7, 64, 512])
def test_text_sequences_match_the_documents(
    text_cache: str, text_docs: list[np.ndarray], seq_len: int, in_memory_bytes: int
) -> None:
    # The rows of a mixture's batches (MixtureDataset.batch refuses rows of one-token documents only, which
    # have nothing to train on; test_text_cache_with_eos_matches_the_documents goes through it).
    tokens, offsets = _stream(text_docs)
    ds = MixtureDataset(
        {text_cache: 1.0}, seq_len=seq_len, seed=3, block_size=32, in_memory_bytes=in_memory_bytes
    )
    for step in [0, 1, 5, 10_000_003]:
        _, _, seq = ds.sequence_ids(step, 24)
        _assert_same(ds.sequences[0].batch(seq), _text_rows(tokens, offsets, seq, seq_len), f"step {step}")


@pytest.mark.parametrize("in_memory", [False, True])
def test_edge_sequences_match_the_documents(
    text_cache: str, text_docs: list[np.ndarray], in_memory: bool
) -> None:
    tokens, offsets = _stream(text_docs)
    seq_len = 128
    ones = int(offsets[300]) // seq_len + 1  # inside the run of one-token documents: 128 starts in one row
    seqs = TokenSequences(TokenCache.open(text_cache), seq_len, in_memory=in_memory)
    last = len(seqs) - 1
    for idx in ([last], [0, last, 0, last], [ones, ones + 1, ones + 2], list(range(len(seqs)))):
        idx = np.array(idx)
        _assert_same(seqs.batch(idx), _text_rows(tokens, offsets, idx, seq_len), f"sequences {idx[:4]}")
    assert _text_rows(tokens, offsets, np.array([ones]), seq_len)["segment_ids"][0, -1] == seq_len - 1
    empty = seqs.batch(np.zeros(0, np.int64))
    assert all(v.shape == (0, seq_len) for v in empty.values())


def test_text_cache_with_eos_matches_the_documents(
    text_docs: list[np.ndarray], tokenizer: Tokenizer, tmp_path: Path
) -> None:
    docs = [d[: i % 5] for i, d in enumerate(text_docs[:400])]  # every fifth document is EOS alone
    write_cache(str(tmp_path / "c"), docs, tokenizer)
    tokens, offsets = _stream([np.append(d, tokenizer.eos_id) for d in docs])
    ds = MixtureDataset({str(tmp_path / "c"): 1.0}, seq_len=16, seed=1, block_size=8)
    for step in [0, 3, 77, 5_000_001]:
        _, _, seq = ds.sequence_ids(step, 16)
        _assert_same(ds.batch(step, 16), _text_rows(tokens, offsets, seq, 16), f"step {step}")
    rows = np.array([5, 0, 15, 5])
    _, _, seq = ds.sequence_ids(2, 16, rows)
    _assert_same(ds.batch(2, 16, rows=rows), _text_rows(tokens, offsets, seq, 16), "rows")


def _packed_rows(docs: list[np.ndarray], masks: list[np.ndarray], seq_len: int, pad: int) -> list[dict]:
    """Every packed row, first-fit in order, by hand."""
    rows: list[list[int]] = [[]]
    used = 0
    for d, doc in enumerate(docs):
        n = min(doc.size, seq_len)
        if used + n > seq_len:
            rows.append([])
            used = 0
        rows[-1].append(d)
        used += n
    out = []
    for ds_ in rows:
        tok = np.full(seq_len, pad, np.int32)
        mask = np.zeros(seq_len, np.int32)
        seg = np.full(seq_len, len(ds_), np.int32)
        at = 0
        for k, d in enumerate(ds_):
            n = min(docs[d].size, seq_len)
            tok[at : at + n], mask[at : at + n], seg[at : at + n] = docs[d][:n], masks[d][:n], k
            at += n
        out.append({"tokens": tok, "loss_mask": mask, "segment_ids": seg})
    return out


def _chat_docs(tokenizer: Tokenizer, n: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    docs, masks = [], []
    for length in rng.integers(2, 60, n):
        doc = rng.integers(3, tokenizer.vocab_size, length)
        mask = np.zeros(length, np.int64)
        mask[rng.integers(1, min(length, 20)) :] = 1
        docs.append(doc)
        masks.append(mask)
    return docs, masks


def test_chat_batches_match_the_conversations(tokenizer: Tokenizer, tmp_path: Path) -> None:
    docs, masks = _chat_docs(tokenizer, 300, seed=2)
    write_cache(str(tmp_path / "c"), docs, tokenizer, loss_masks=masks)
    eos = tokenizer.eos_id
    docs = [np.append(d, eos) for d in docs]
    masks = [np.append(m, 0) for m in masks]
    for seq_len in (24, 64, 300):
        ds = MixtureDataset({str(tmp_path / "c"): 1.0}, seq_len=seq_len, seed=4, block_size=16)
        pad = ds.sequences[0].pad_id
        want = _packed_rows(docs, masks, seq_len, pad)
        assert len(ds.sequences[0]) == len(want)
        for step in [0, 2, 9_999]:
            _, _, seq = ds.sequence_ids(step, 8)
            rows = {k: np.stack([want[i][k] for i in seq]) for k in want[0]}
            _assert_same(ds.batch(step, 8), rows, f"seq_len {seq_len} step {step}")


def test_preference_pairs_match_the_documents(tokenizer: Tokenizer, tmp_path: Path) -> None:
    docs, masks = _chat_docs(tokenizer, 80, seed=3)
    write_cache(str(tmp_path / "p"), docs, tokenizer, loss_masks=masks, kind="preference")
    eos = tokenizer.eos_id
    docs = [np.append(d, eos) for d in docs]
    masks = [np.append(m, 0) for m in masks]
    seq_len = 40
    prefs = PreferenceDataset(str(tmp_path / "p"), seq_len=seq_len, seed=1)
    pad = prefs.pad_id
    idx = np.array([0, 39, 7, 7, 20])
    got = prefs.pairs(idx)
    for j, role in enumerate(("chosen", "rejected")):
        want: dict[str, np.ndarray] = {}
        for k in ("tokens", "loss_mask", "segment_ids"):
            want[k] = np.stack(
                [_packed_rows([docs[2 * i + j]], [masks[2 * i + j]], seq_len, pad)[0][k] for i in idx]
            )
        _assert_same({k: got[f"{role}_{k}"] for k in want}, want, role)


def test_components_are_held_in_memory_within_the_budget_only(
    text_docs: list[np.ndarray], tokenizer: Tokenizer, tmp_path: Path
) -> None:
    paths = [str(tmp_path / name) for name in ("a", "b", "c")]
    for path, (lo, hi) in zip(paths, [(0, 100), (100, 300), (300, 350)]):  # b is the largest
        write_cache(path, text_docs[lo:hi], tokenizer)
    sizes = [held_bytes(TokenCache.open(p)) for p in paths]
    assert sizes[1] > sizes[2]
    budget = sizes[0] + sizes[2]  # a and c fit together; b does not fit beside a
    ds = MixtureDataset(dict.fromkeys(paths, 1.0), seq_len=8, block_size=6, in_memory_bytes=budget)
    assert [s._held is not None for s in ds.sequences] == [True, False, True]
    reference = MixtureDataset(dict.fromkeys(paths, 1.0), seq_len=8, block_size=6)
    for step in (0, 7):
        _assert_same(ds.batch(step, 12), reference.batch(step, 12), f"step {step}")
    with pytest.raises(ValueError, match="in_memory_bytes must be an int >= 0"):
        MixtureDataset({paths[0]: 1.0}, seq_len=8, in_memory_bytes=-1)


def test_held_sequences_read_nothing_from_storage(
    text_docs: list[np.ndarray], tokenizer: Tokenizer, tmp_path: Path
) -> None:
    write_cache(str(tmp_path / "c"), text_docs[:300], tokenizer)
    tokens, offsets = _stream([np.append(d, tokenizer.eos_id) for d in text_docs[:300]])
    seqs = TokenSequences(TokenCache.open(str(tmp_path / "c")), 16, in_memory=True)
    shutil.rmtree(tmp_path / "c")
    idx = np.arange(len(seqs))
    _assert_same(seqs.batch(idx), _text_rows(tokens, offsets, idx, 16), "held")
