"""Segment ids of text-cache batches follow the cache's documents, whatever tokens they hold.

The reference is built independently of the reader: each document's token count is taken from HF
`tokenizers` itself (plus the BOS/EOS the build adds), and the segment of a stream position is the
document holding it, counted from the row's first document.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tokenizers

from schooner.data import make_record, write_records
from schooner.tokenize import MixtureDataset, Tokenizer, build_cache, train_bpe, write_cache


def _expected_segments(doc_lengths: list[int], row_starts: np.ndarray, seq_len: int) -> np.ndarray:
    ends = np.cumsum(doc_lengths)  # stream position where each document stops
    pos = row_starts[:, None] + np.arange(seq_len)[None, :]
    doc = np.searchsorted(ends, pos, side="right")
    return (doc - doc[:, :1]).astype(np.int32)


def _assert_segments(batch: dict, want: np.ndarray, eos: int) -> None:
    got = batch["segment_ids"]
    if not np.array_equal(got, want):
        r, t = (int(x) for x in np.argwhere(got != want)[0])
        lo = max(0, t - 3)
        raise AssertionError(
            f"row {r}, position {t}: segment ids {got[r, lo : t + 4].tolist()}, by the documents "
            f"{want[r, lo : t + 4].tolist()} (tokens {batch['tokens'][r, lo : t + 4].tolist()}, eos {eos})"
        )


@pytest.fixture(scope="module")
def endoftext_tokenizer(texts: list[str]) -> Tokenizer:
    """GPT-2 / Qwen style: one `<|endoftext|>` is BOS, EOS and padding at once."""
    return train_bpe(
        texts[:20], vocab_size=600, special_tokens=("<|endoftext|>",), bos_token="<|endoftext|>",
        eos_token="<|endoftext|>", pad_token="<|endoftext|>", chat_template=None,
    )  # fmt: skip


def test_prepended_bos_that_is_also_eos_starts_its_document_segment(
    endoftext_tokenizer: Tokenizer, texts: list[str], tmp_path: Path
) -> None:
    tok = endoftext_tokenizer
    assert tok.bos_id == tok.eos_id
    docs = [t[: 150 + 37 * i] for i, t in enumerate(texts[20:32])]
    write_records([make_record(d, source="s", id=f"d{i}") for i, d in enumerate(docs)], str(tmp_path / "rec"))
    build_cache(str(tmp_path / "rec"), str(tmp_path / "cache"), tok, prepend_bos=True)
    plain = tokenizers.Tokenizer.from_str(tok.to_json())
    plain.encode_special_tokens = True
    lengths = [1 + len(plain.encode(d, add_special_tokens=False).ids) + 1 for d in docs]  # BOS, text, EOS

    seq_len = 64
    ds = MixtureDataset({str(tmp_path / "cache" / "train"): 1.0}, seq_len=seq_len, seed=1, block_size=8)
    assert ds.caches[0].num_tokens == sum(lengths)
    for step in range(4):
        b = ds.batch(step, 4)
        _, _, seq = ds.sequence_ids(step, 4)
        want = _expected_segments(lengths, seq * seq_len, seq_len)
        _assert_segments(b, want, tok.eos_id)


def test_documents_written_without_eos_are_still_separate_segments(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    rng = np.random.default_rng(4)
    docs = [rng.integers(10, 500, size=int(n)) for n in rng.integers(3, 40, size=30)]
    write_cache(str(tmp_path / "c"), docs, tokenizer, append_eos=False)
    ds = MixtureDataset({str(tmp_path / "c"): 1.0}, seq_len=32, seed=0, block_size=4)
    b = ds.batch(2, 4)
    _, _, seq = ds.sequence_ids(2, 4)
    _assert_segments(b, _expected_segments([len(d) for d in docs], seq * 32, 32), tokenizer.eos_id)


@pytest.mark.parametrize("seq_len", [7, 256, 1031])
def test_segments_over_thousands_of_documents(tokenizer: Tokenizer, tmp_path: Path, seq_len: int) -> None:
    """Many short documents: windows start and end across the reader's sparse offset index (a stored
    offset every 256 documents) and can hold hundreds of documents."""
    rng = np.random.default_rng(seq_len)
    lengths = rng.integers(1, 6, size=3000)
    lengths[1500:1600] = 700  # a stretch of long ones: windows with no document start inside
    docs = [rng.integers(10, 500, size=int(n)) for n in lengths]
    write_cache(str(tmp_path / "c"), docs, tokenizer, append_eos=False)
    ds = MixtureDataset({str(tmp_path / "c"): 1.0}, seq_len=seq_len, seed=2, block_size=16)
    n = len(ds.sequences[0])
    every = np.arange(n)
    got = ds.sequences[0].batch(every)
    assert np.array_equal(got["segment_ids"], _expected_segments(lengths.tolist(), every * seq_len, seq_len))
