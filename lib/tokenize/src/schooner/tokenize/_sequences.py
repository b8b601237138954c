"""Fixed-length sequences cut from a cache's token stream, with segment ids from the cache's documents."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._cache import TokenCache


def segment_ids_from_eos(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """Segment id of every position: the number of EOS tokens strictly before it in its row.

    A new segment starts right AFTER each EOS, so an EOS belongs to the document it ends, and the first
    segment of every row is 0. The model masks attention (and loss) across segment boundaries.

    Example:
        >>> segment_ids_from_eos(np.array([[5, 1, 7, 8, 1, 9]]), eos_id=1).tolist()
        [[0, 0, 1, 1, 1, 2]]
    """
    tokens = np.asarray(tokens)
    is_eos = (tokens == eos_id).astype(np.int32)
    return (np.cumsum(is_eos, axis=-1, dtype=np.int32) - is_eos).astype(np.int32)


_INDEX_STRIDE = 256
"""Every this-many-th document offset is held in memory (8 bytes per 256 documents); a window's own
offsets are read from the cache beside its tokens."""


def held_bytes(cache: TokenCache) -> int:
    """Bytes a `TokenSequences(cache, ..., in_memory=True)` holds: the token ids and document offsets."""
    return cache.num_tokens * cache._tok.dtype.numpy_dtype.itemsize + (cache.num_documents + 1) * 8


class TokenSequences:
    """A cache seen as `len(self)` consecutive, non-overlapping sequences of `seq_len` tokens.

    Sequence `i` is tokens `[i * seq_len, (i + 1) * seq_len)` of the document stream; the final
    `num_tokens % seq_len` tokens (`dropped_tokens`) belong to no sequence. Segment ids come from the
    cache's document offsets (a new segment at each document start), not from the tokens: a BOS that is
    also the EOS token (`<|endoftext|>` with `prepend_bos=True`) starts its document's segment, and
    documents written without EOS are still kept apart.

    With `in_memory=True` the cache's token ids and document offsets are read once, here, and held
    (`held_bytes(cache)` bytes); batches then read nothing from storage. The arrays are the same.
    """

    def __init__(self, cache: TokenCache, seq_len: int, *, in_memory: bool = False) -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int | np.integer) or seq_len < 1:
            raise ValueError(f"seq_len must be a positive int, got seq_len={seq_len!r}")
        self.cache = cache
        self.seq_len = int(seq_len)
        self.num_sequences = cache.num_tokens // self.seq_len
        self.dropped_tokens = cache.num_tokens - self.num_sequences * self.seq_len
        self._sparse: np.ndarray | None = None  # offsets[::_INDEX_STRIDE], read on first use
        self._held: tuple[np.ndarray, np.ndarray] | None = None  # (all tokens, all offsets)
        if in_memory:
            self._held = (cache._tok.read().result(), cache.offsets().astype(np.int64, copy=False))

    def __len__(self) -> int:
        return self.num_sequences

    @property
    def held_bytes(self) -> int:
        """Bytes held in memory (0: batches are read from the cache)."""
        return 0 if self._held is None else sum(a.nbytes for a in self._held)

    def tokens(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """int32 `[len(indices), seq_len]`: the token ids of the given sequences."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_sequences):
            raise IndexError(
                f"token cache {self.cache.path!r}: sequence index {idx.tolist()[:8]} outside "
                f"[0, {self.num_sequences}) for seq_len={self.seq_len}"
            )
        if self._held is not None:
            positions = idx.reshape(-1, 1) * self.seq_len + np.arange(self.seq_len)
            return self._held[0][positions].astype(np.int32)
        return self.cache.token_windows(idx * self.seq_len, self.seq_len)

    def describe(self, index: int) -> str:
        """Sequence `index`, for error messages."""
        return f"sequence {index} (tokens {index * self.seq_len}..{(index + 1) * self.seq_len}) of token cache {self.cache.path!r}"

    def batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """`{"tokens", "loss_mask", "segment_ids"}` (int32 `[B, seq_len]`) of the given sequences; the loss
        mask is all ones (every token of a plain cache is a target)."""
        tokens = self.tokens(indices)
        starts = np.asarray(indices, dtype=np.int64).reshape(-1) * self.seq_len
        return {
            "tokens": tokens,
            "loss_mask": np.ones_like(tokens),
            "segment_ids": self.segment_ids(starts),
        }

    def segment_ids(self, starts: np.ndarray) -> np.ndarray:
        """int32 `[len(starts), seq_len]`: for the window of `seq_len` tokens at each stream position in
        `starts`, the number of documents that begin inside it at or before each position (0 at the
        window's first token)."""
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        offsets = self._held[1] if self._held is not None else self._offsets_around(starts)
        ends = starts[:, None] + np.arange(self.seq_len)
        before = np.searchsorted(offsets, starts, side="right")[:, None]
        return (np.searchsorted(offsets, ends, side="right") - before).astype(np.int32)

    def _offsets_around(self, starts: np.ndarray) -> np.ndarray:
        """Ascending document offsets that include every offset inside each window at `starts`: the
        `_INDEX_STRIDE`-document strides holding the windows, one read per run of overlapping strides."""
        if self._sparse is None:
            self._sparse = np.asarray(self.cache._off[::_INDEX_STRIDE].read().result(), dtype=np.int64)
        if not starts.size:
            return np.zeros(0, dtype=np.int64)
        n = self.cache.num_documents
        lo = (np.searchsorted(self._sparse, starts, side="right") - 1) * _INDEX_STRIDE
        hi = np.minimum(np.searchsorted(self._sparse, starts + self.seq_len) * _INDEX_STRIDE, n) + 1
        order = np.argsort(lo)
        lo, hi = lo[order], np.maximum.accumulate(hi[order])
        first = np.flatnonzero(np.r_[True, lo[1:] > hi[:-1]])  # where each run of overlapping ranges begins
        last = np.r_[first[1:] - 1, lo.size - 1]
        runs = zip(lo[first], hi[last])
        reads = [self.cache._off[int(a) : int(b)].read() for a, b in runs]  # issued together
        return np.concatenate([np.asarray(f.result(), dtype=np.int64) for f in reads])
