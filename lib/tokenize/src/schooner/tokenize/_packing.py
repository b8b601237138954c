"""`PackedSequences`: a chat cache seen as rows of whole conversations, for supervised fine-tuning.

Conversations are placed in cache order, whole, first-fit: one that does not fit in what is left of a row
starts the next row; one longer than `seq_len` fills a row alone and is cut to its first `seq_len` tokens.
Each conversation in a row is its own segment (attention and loss never cross it) and the padding after
the last is one more segment with mask 0. A conversation whose first target token lies beyond `seq_len`
would be a row with nothing to train on: that is an error at construction, naming the conversation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._cache import CacheError, TokenCache


class AllMaskedError(CacheError):
    """A training row would hold no target token (its loss would silently be 0)."""


def pack_rows(lengths: np.ndarray, seq_len: int) -> np.ndarray:
    """First document of each row, plus the end: int64 `[rows + 1]` (in-order first-fit; a document
    longer than `seq_len` counts as `seq_len` and fills its row alone)."""
    kept = np.minimum(lengths, seq_len).tolist()
    starts = [0]
    used = 0
    for d, n in enumerate(kept):
        if used + n > seq_len:
            starts.append(d)
            used = 0
        used += n
    if not kept:
        return np.zeros(1, dtype=np.int64)
    starts.append(len(kept))
    return np.asarray(starts, dtype=np.int64)


class PackedSequences:
    """Rows of `seq_len` tokens, each holding whole conversations of a masked cache (see the module doc).

    Args:
        cache: a cache with loss masks (`kind="chat"`).
        seq_len: tokens per row.
        pad_id: the padding token (default: the cache's pad id, else its EOS).

    Raises:
        AllMaskedError: a conversation has no target token within its first `seq_len` tokens.
    """

    def __init__(self, cache: TokenCache, seq_len: int, pad_id: int | None = None) -> None:
        if not cache.has_loss_mask:
            raise CacheError(f"token cache {cache.path!r}: PackedSequences needs a cache with loss masks")
        self.cache, self.seq_len = cache, int(seq_len)
        self.pad_id = int(
            pad_id if pad_id is not None else cache.pad_id if cache.pad_id is not None else cache.eos_id
        )
        self.offsets = cache.offsets()
        lengths = np.diff(self.offsets)
        first = cache.first_targets()
        late = np.flatnonzero(first >= self.seq_len)
        if late.size:
            d = int(late[0])
            raise AllMaskedError(
                f"{cache.describe_document(d)} has its first target token at position {int(first[d])}, beyond "
                f"seq_len={self.seq_len}: cut to seq_len it has nothing to train on ({late.size} conversations "
                f"of this cache are like it); raise seq_len, or rebuild the cache with max_length <= {self.seq_len} "
                "and on_error='skip' to leave them out (counted)"
            )
        self.rows = pack_rows(lengths, self.seq_len)
        self.num_sequences = len(self.rows) - 1
        self.dropped_tokens = int(np.maximum(lengths - self.seq_len, 0).sum())
        """Tokens cut off conversations longer than `seq_len`."""

    def __len__(self) -> int:
        return self.num_sequences

    def describe(self, index: int) -> str:
        """The conversations of row `index`, for error messages."""
        d0, d1 = int(self.rows[index]), int(self.rows[index + 1])
        return ", ".join(self.cache.describe_document(d) for d in range(d0, d1))

    def batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """`{"tokens", "loss_mask", "segment_ids"}`, int32 `[len(indices), seq_len]`, of the given rows."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_sequences):
            raise IndexError(
                f"token cache {self.cache.path!r}: row {idx.tolist()[:8]} outside [0, {self.num_sequences}) "
                f"for seq_len={self.seq_len}"
            )
        d0, d1 = self.rows[idx], self.rows[idx + 1]
        starts = self.offsets[d0]
        stops = np.minimum(self.offsets[d1], starts + self.seq_len)
        tokens = self.cache.padded_ranges(starts, stops, self.seq_len, fill=self.pad_id)
        mask = self.cache.padded_ranges(starts, stops, self.seq_len, masks=True)
        # The conversation holding each position, counted from the row's first; the padding after the
        # last is one more segment.
        doc = np.searchsorted(self.offsets, starts[:, None] + np.arange(self.seq_len), side="right") - 1
        segs = np.minimum(doc - d0[:, None], (d1 - d0)[:, None]).astype(np.int32)
        return {"tokens": tokens, "loss_mask": mask, "segment_ids": segs}
