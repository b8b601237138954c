"""`PreferenceDataset`: the pairs of a preference cache as DPO batches, a pure function of (seed, step).

A preference cache (`tokenized_preferences`) holds two documents per pair: document `2i` is pair `i`'s
prompt + chosen answer and `2i + 1` its prompt + rejected answer, each with a loss mask over its answer.
A batch row is one pair: both sequences cut to `seq_len` and padded (padding: mask 0, its own segment).
Every epoch visits every pair once, in a new seeded order; `pair_index` says which pairs a batch holds
(the key a reference-log-prob table is read by).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ._cache import CacheError, TokenCache
from ._mixture import BatchSize, _Offsets
from ._packing import AllMaskedError
from ._permute import Permutation, derive_key


class PreferenceDataset:
    """DPO batches from a preference cache.

    Args:
        cache: a preference cache (path, a `tokenized_preferences` step folder, or a `TokenCache`).
        seq_len: tokens per sequence; longer sequences are cut to their first `seq_len` tokens.
        seed: the shuffle seed.
        tokenizer: a `Tokenizer` or fingerprint the cache must have been built with.
        vocab_size: the model's vocabulary; every cached id must be below it.

    Raises:
        CacheError: not a preference cache, or an odd number of documents.
        AllMaskedError: a pair's answer starts beyond `seq_len` (it would train on nothing), naming it.

    Example:
        >>> prefs = PreferenceDataset("out/tokenized/prefs-1a2b/train", seq_len=512)   # doctest: +SKIP
        >>> b = prefs.batch(step=0, batch_size=8)                                      # doctest: +SKIP
        >>> sorted(b)                                                                   # doctest: +SKIP
        ['chosen_loss_mask', 'chosen_segment_ids', 'chosen_tokens', 'pair_index', 'rejected_loss_mask', ...]
    """

    def __init__(
        self, cache: Any, seq_len: int, seed: int = 0, *, tokenizer: Any = None, vocab_size: int | None = None
    ) -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
            raise ValueError(f"PreferenceDataset: seq_len must be an int >= 2, got seq_len={seq_len!r}")
        self.cache = cache if isinstance(cache, TokenCache) else TokenCache.open(os.fspath(cache))
        self.cache = TokenCache.open(self.cache.path, tokenizer=tokenizer, vocab_size=vocab_size)
        if self.cache.kind != "preference" or self.cache.num_documents % 2:
            raise CacheError(
                f"token cache {self.cache.path!r} is a {self.cache.kind} cache with {self.cache.num_documents} "
                "documents, not a preference cache (chosen/rejected pairs); build one with tokenized_preferences"
            )
        self.seq_len, self.seed = seq_len, int(seed)
        self.num_pairs = self.cache.num_documents // 2
        if self.num_pairs == 0:
            raise CacheError(f"token cache {self.cache.path!r} holds no preference pairs")
        self.offsets = self.cache.offsets()
        first = self.cache.first_targets()
        late = np.flatnonzero(first >= seq_len)
        if late.size:
            d = int(late[0])
            raise AllMaskedError(
                f"{self.cache.describe_document(d)} (pair {d // 2}) has its answer starting at token "
                f"{int(first[d])}, beyond seq_len={seq_len}: it would train on nothing ({late.size} sequences "
                f"are like it); raise seq_len, or rebuild with max_length <= {seq_len} and on_error='skip'"
            )
        self.pad_id = self.cache.pad_id if self.cache.pad_id is not None else self.cache.eos_id
        self._plans: dict[Any, _Offsets] = {}
        self._perms: dict[int, Permutation] = {}

    def __len__(self) -> int:
        return self.num_pairs

    def pairs(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The given pairs: `{chosen,rejected}_{tokens,loss_mask,segment_ids}` int32 `[B, seq_len]` and
        `pair_index` int64 `[B]`. The masks are per target token, as in `MixtureDataset.batch`."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_pairs):
            raise IndexError(f"pairs {idx.tolist()[:8]} outside [0, {self.num_pairs}) of {self.cache.path!r}")
        out: dict[str, np.ndarray] = {"pair_index": idx.copy()}
        for j, role in enumerate(("chosen", "rejected")):
            docs = 2 * idx + j
            starts = self.offsets[docs]
            stops = np.minimum(self.offsets[docs + 1], starts + self.seq_len)
            tokens = self.cache.padded_ranges(starts, stops, self.seq_len, fill=self.pad_id)
            mask = self.cache.padded_ranges(starts, stops, self.seq_len, masks=True)
            segs = (np.arange(self.seq_len) >= (stops - starts)[:, None]).astype(np.int32)  # padding: 1
            out |= {f"{role}_tokens": tokens, f"{role}_loss_mask": mask, f"{role}_segment_ids": segs}
        return out

    def pair_ids(self, step: int, batch_size: BatchSize, rows: np.ndarray | None = None) -> np.ndarray:
        """The pair index of each row (or of `rows`) of batch `step`."""
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise ValueError(f"step must be an int >= 0, got step={step!r}")
        offsets = self._plans.setdefault(batch_size, _Offsets(batch_size))
        start, size = offsets.offset(int(step)), offsets.size(int(step))
        rows = np.arange(size, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= size):
            raise IndexError(f"rows {rows.tolist()[:8]} are outside batch {step}'s [0, {size})")
        g = start + rows
        epoch = g // self.num_pairs
        out = np.empty_like(g)
        for e in np.unique(epoch):
            sel = epoch == e
            perm = self._perms.get(int(e))
            if perm is None:
                if len(self._perms) > 64:
                    self._perms.clear()
                perm = self._perms[int(e)] = Permutation(
                    self.num_pairs, derive_key(self.seed, "pairs", int(e))
                )
            out[sel] = perm(g[sel] % self.num_pairs)
        return out

    def batch(
        self, step: int, batch_size: BatchSize, rows: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """Batch `step` (see `pairs`), pure in (seed, step); `batch_size` an int or a function of the step."""
        return self.pairs(self.pair_ids(step, batch_size, rows))

    def epochs_at(self, step: int, batch_size: BatchSize) -> float:
        """Epochs of pairs consumed by the end of batch `step`."""
        offsets = self._plans.setdefault(batch_size, _Offsets(batch_size))
        return offsets.offset(int(step) + 1) / self.num_pairs

    @property
    def tokenizer_fingerprint(self) -> str:
        """The fingerprint of the tokenizer the cache was built with."""
        return self.cache.tokenizer_fingerprint

    def __repr__(self) -> str:
        return f"PreferenceDataset({self.cache.path!r}, pairs={self.num_pairs}, seq_len={self.seq_len}, seed={self.seed})"
