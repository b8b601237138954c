"""Fixed segmentation of a token stream into evaluation windows, independent of the batch size.

Scores must not depend on how many windows are scored at once, so the windows of a token stream are a pure
function of (stream, seq_len): window `i` covers stream positions `[i * (seq_len - 1), i * (seq_len - 1) +
seq_len)`. Consecutive windows overlap by exactly one token, so every token of the stream except the first is
predicted exactly once (as the target of the position before it in some window). The last window is padded to
`seq_len`; padded positions are never targets and sit at the end of the window, where causal attention keeps
them from influencing any real position.

Document boundaries: when `respect_documents` is true (the default, matching training, where attention is
masked across documents), each window carries segment ids numbering its documents from 0, and a target is
scored only when it belongs to the same document as its predecessor, i.e. the first token of every document
(which would otherwise be predicted across a document boundary) is not scored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class TokenStream:
    """A flat token stream with the document index of every token.

    Attributes:
        tokens: int32 `[N]` token ids, documents concatenated in order.
        doc_ids: int64 `[N]` index of the document each token belongs to (non-decreasing).
    """

    tokens: np.ndarray
    doc_ids: np.ndarray

    def __post_init__(self) -> None:
        if self.tokens.ndim != 1 or self.doc_ids.shape != self.tokens.shape:
            raise ValueError(
                f"TokenStream needs 1-D tokens and doc_ids of the same shape, got "
                f"tokens.shape={self.tokens.shape}, doc_ids.shape={self.doc_ids.shape}"
            )

    @staticmethod
    def from_documents(documents: list[np.ndarray], max_tokens: int | None = None) -> TokenStream:
        """Concatenate `documents` (1-D int arrays), keeping only the first `max_tokens` tokens if given."""
        parts: list[np.ndarray] = []
        ids: list[np.ndarray] = []
        total = 0
        for i, doc in enumerate(documents):
            doc = np.asarray(doc)
            if doc.ndim != 1:
                raise ValueError(f"document {i} must be a 1-D array of token ids, got shape {doc.shape}")
            if max_tokens is not None and total + doc.size > max_tokens:
                doc = doc[: max_tokens - total]
            parts.append(doc.astype(np.int32, copy=False))
            ids.append(np.full(doc.size, i, dtype=np.int64))
            total += doc.size
            if max_tokens is not None and total >= max_tokens:
                break
        if not parts:
            return TokenStream(np.zeros(0, np.int32), np.zeros(0, np.int64))
        return TokenStream(np.concatenate(parts), np.concatenate(ids))

    @staticmethod
    def from_cache(cache: Any, max_tokens: int | None = None) -> TokenStream:
        """A token cache's documents in order (the first ``max_tokens`` tokens when given).

        ``cache`` is a ``schooner.tokenize.TokenCache`` or anything with ``num_tokens``, ``offsets()`` (the
        start of every document) and ``tokens(start, stop)``.
        """
        total = int(cache.num_tokens)
        stop = total if max_tokens is None else min(total, max_tokens)
        offsets = np.asarray(cache.offsets(), dtype=np.int64)
        tokens = np.asarray(cache.tokens(0, stop), dtype=np.int32)
        # the document of every token: the last document start at or before it
        doc_ids = np.searchsorted(offsets, np.arange(stop, dtype=np.int64), side="right") - 1
        return TokenStream(tokens, doc_ids.astype(np.int64))

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def num_documents(self) -> int:
        return int(np.unique(self.doc_ids).size)


def num_windows(num_tokens: int, seq_len: int) -> int:
    """How many windows of `seq_len` (stride `seq_len - 1`) cover a stream of `num_tokens` tokens."""
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2 (one context token and one target), got {seq_len=}")
    if num_tokens < 2:
        return 0
    return -(-(num_tokens - 1) // (seq_len - 1))


@dataclasses.dataclass(frozen=True)
class WindowBatch:
    """A batch of windows, padded to `[batch_size, seq_len]`.

    Attributes:
        tokens: int32 `[B, T]`; padding holds `pad_id`.
        segment_ids: int32 `[B, T]`; padding gets a segment of its own.
        target_mask: bool `[B, T - 1]`; `target_mask[b, t]` says whether the prediction of `tokens[b, t + 1]`
            from positions `<= t` is scored.
        num_real: how many leading rows are real windows (the rest are all-padding rows).
    """

    tokens: np.ndarray
    segment_ids: np.ndarray
    target_mask: np.ndarray
    num_real: int


def _window(
    stream: TokenStream, index: int, seq_len: int, pad_id: int, respect_documents: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    start = index * (seq_len - 1)
    stop = min(start + seq_len, stream.num_tokens)
    n = stop - start
    tokens = np.full(seq_len, pad_id, dtype=np.int32)
    tokens[:n] = stream.tokens[start:stop]
    valid = np.zeros(seq_len, dtype=bool)
    valid[:n] = True
    if respect_documents:
        docs = stream.doc_ids[start:stop]
        seg = np.empty(seq_len, dtype=np.int32)
        seg[:n] = docs - docs[0]
        seg[n:] = (int(seg[n - 1]) + 1) if n else 0
    else:
        seg = np.where(valid, 0, 1).astype(np.int32)
    mask = valid[1:] & valid[:-1] & (seg[1:] == seg[:-1])
    return tokens, seg, mask


def iter_window_batches(
    stream: TokenStream, *, seq_len: int, batch_size: int, pad_id: int = 0, respect_documents: bool = True
) -> Iterator[WindowBatch]:
    """Yield the stream's windows in order, `batch_size` at a time (the last batch padded with empty rows)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size=}")
    total = num_windows(stream.num_tokens, seq_len)
    for first in range(0, total, batch_size):
        rows = [
            _window(stream, i, seq_len, pad_id, respect_documents)
            for i in range(first, min(first + batch_size, total))
        ]
        real = len(rows)
        tokens = np.full((batch_size, seq_len), pad_id, dtype=np.int32)
        segs = np.zeros((batch_size, seq_len), dtype=np.int32)
        masks = np.zeros((batch_size, seq_len - 1), dtype=bool)
        for r, (t, s, m) in enumerate(rows):
            tokens[r], segs[r], masks[r] = t, s, m
        yield WindowBatch(tokens=tokens, segment_ids=segs, target_mask=masks, num_real=real)
