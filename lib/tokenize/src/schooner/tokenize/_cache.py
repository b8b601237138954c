"""`TokenCache`: lazy random access to a tokenized corpus stored as tensorstore (zarr3) arrays.

A cache folder holds:

- `manifest.json`: format version, tokenizer fingerprint, vocab size, special ids, token dtype, document
  and token counts, the largest token id, the per-shard ledger and the source paths.
- `tokens/`: every document's token ids (EOS-terminated), concatenated, 1-D.
- `offsets/`: int64 `[num_documents + 1]`; document `i` is `tokens[offsets[i]:offsets[i+1]]`.

Nothing is read until asked for, so a cache much larger than memory is fine.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from schooner.data import storage

from . import _arrays

MANIFEST = "manifest.json"
FORMAT = "schooner-token-cache"
FORMAT_VERSION = 1


class CacheError(ValueError):
    """A token cache is missing, incomplete, corrupt, or does not match what reads it."""


class TokenizerMismatchError(CacheError):
    """A cache built with one tokenizer is read with another."""


def _fingerprint_of(tokenizer: Any) -> tuple[str, str]:
    """(fingerprint, description) of a Tokenizer or a fingerprint string."""
    if isinstance(tokenizer, str):
        return tokenizer, f"fingerprint {tokenizer}"
    fp = getattr(tokenizer, "fingerprint", None)
    if not isinstance(fp, str):
        raise TypeError(
            f"tokenizer must be a schooner Tokenizer or a fingerprint string, got {type(tokenizer).__name__}"
        )
    return fp, f"{getattr(tokenizer, 'source', '?')} (fingerprint {fp})"


class TokenCache:
    """A read-only token cache. Open with `TokenCache.open(path)`.

    Example:
        >>> cache = TokenCache.open("out/tokenized/python-docs-1a2b3c4d/train")  # doctest: +SKIP
        >>> cache.num_documents, cache.num_tokens                                # doctest: +SKIP
        (1200, 803411)
        >>> cache.document(0)[-1] == cache.eos_id                                # doctest: +SKIP
        True
    """

    def __init__(self, path: str, manifest: dict) -> None:
        self.path = path
        self.manifest: dict = manifest
        """The parsed manifest.json."""
        self._tokens = None
        self._offsets = None

    # -- opening -------------------------------------------------------------------------------------
    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, tokenizer: Any = None, vocab_size: int | None = None
    ) -> TokenCache:
        """Open the cache at `path` (a cache folder, or a tokenized step's folder: its `train/` is used).

        Args:
            path: the folder.
            tokenizer: a `Tokenizer` or fingerprint the cache must have been built with.
            vocab_size: the vocabulary the reader (a model) supports; every token id must be below it.

        Raises:
            CacheError: no complete cache at `path`, or a token id beyond `vocab_size`.
            TokenizerMismatchError: the cache was built with a different tokenizer.
        """
        path = os.fspath(path)
        _arrays.check_supported(path)
        mpath = storage.join(path, MANIFEST)
        if not storage.exists(mpath):
            if storage.exists(storage.join(path, "train", MANIFEST)):
                return cls.open(storage.join(path, "train"), tokenizer=tokenizer, vocab_size=vocab_size)
            hint = (
                "the build was interrupted; rerun it to resume"
                if storage.exists(storage.join(path, "parts")) or storage.exists(storage.join(path, "tokens"))
                else "build it with schooner.tokenize.build_cache or the tokenized(...) step"
            )
            raise CacheError(f"token cache {path!r}: no {MANIFEST} (not a finished cache); {hint}")
        try:
            manifest = storage.read_json(mpath)
        except ValueError as e:
            raise CacheError(
                f"token cache {path!r}: {MANIFEST} is not valid JSON ({e}); rebuild the cache"
            ) from e
        if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
            raise CacheError(
                f"token cache {path!r}: manifest format {manifest.get('format')!r} v{manifest.get('format_version')!r} "
                f"is not {FORMAT!r} v{FORMAT_VERSION}; rebuild it with this version of schooner-tokenize"
            )
        cache = cls(path, manifest)
        if tokenizer is not None:
            cache.check_tokenizer(tokenizer)
        if vocab_size is not None:
            cache.check_vocab(vocab_size)
        if cache.max_token_id >= cache.vocab_size:
            raise CacheError(
                f"token cache {path!r}: holds token id {cache.max_token_id} but its tokenizer has only "
                f"vocab_size={cache.vocab_size} ids; the cache is corrupt, rebuild it"
            )
        return cache

    def check_tokenizer(self, tokenizer: Any) -> None:
        """Raise `TokenizerMismatchError` unless the cache was built with `tokenizer` (or its fingerprint)."""
        fp, desc = _fingerprint_of(tokenizer)
        if fp != self.tokenizer_fingerprint:
            raise TokenizerMismatchError(
                f"token cache {self.path!r} was built with tokenizer {self.manifest.get('tokenizer_source', '?')} "
                f"(fingerprint {self.tokenizer_fingerprint}) but is read with tokenizer {desc}; rebuild the "
                "cache with this tokenizer, or load the tokenizer the cache was built with"
            )

    def check_vocab(self, vocab_size: int) -> None:
        """Raise `CacheError` if any token id in the cache is >= `vocab_size` (e.g. a model's vocabulary)."""
        if self.max_token_id >= vocab_size:
            raise CacheError(
                f"token cache {self.path!r}: token id {self.max_token_id} is beyond vocab_size={vocab_size} "
                f"(the cache's tokenizer has {self.vocab_size} ids); use a model whose vocab_size is at least "
                f"{self.max_token_id + 1}, or a cache built with a matching tokenizer"
            )

    # -- facts ---------------------------------------------------------------------------------------
    @property
    def num_documents(self) -> int:
        return int(self.manifest["num_documents"])

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["num_tokens"])

    @property
    def tokenizer_fingerprint(self) -> str:
        return str(self.manifest["tokenizer_fingerprint"])

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def eos_id(self) -> int:
        return int(self.manifest["eos_id"])

    @property
    def max_token_id(self) -> int:
        return int(self.manifest["max_token_id"])

    def __len__(self) -> int:
        return self.num_documents

    def __repr__(self) -> str:
        return (
            f"TokenCache({self.path!r}, documents={self.num_documents}, tokens={self.num_tokens}, "
            f"vocab_size={self.vocab_size}, tokenizer={self.tokenizer_fingerprint[:12]})"
        )

    # -- reading -------------------------------------------------------------------------------------
    @property
    def _tok(self):
        if self._tokens is None:
            self._tokens = _arrays.open_array(storage.join(self.path, "tokens"))
        return self._tokens

    @property
    def _off(self):
        if self._offsets is None:
            self._offsets = _arrays.open_array(storage.join(self.path, "offsets"))
        return self._offsets

    def __getstate__(self) -> dict:  # tensorstore handles are reopened lazily after unpickling
        return {"path": self.path, "manifest": self.manifest}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["manifest"])

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Token ids `[start, stop)` of the concatenated stream, as int32."""
        if not (0 <= start <= stop <= self.num_tokens):
            raise IndexError(
                f"token cache {self.path!r}: token range [{start}, {stop}) is outside [0, {self.num_tokens}]"
            )
        return self._tok[start:stop].read().result().astype(np.int32, copy=False)

    def token_windows(self, starts: Sequence[int] | np.ndarray, length: int) -> np.ndarray:
        """Token ids `[s, s + length)` for every `s` in `starts`, as int32 `[len(starts), length]`.

        The reads are issued together and overlap, which is what makes random batches fast.
        """
        starts = np.asarray(starts, dtype=np.int64)
        if starts.size and (starts.min() < 0 or starts.max() + length > self.num_tokens):
            raise IndexError(
                f"token cache {self.path!r}: windows of {length} tokens at {starts.tolist()[:8]} reach past "
                f"num_tokens={self.num_tokens}"
            )
        arr = self._tok
        futures = [arr[int(s) : int(s) + length].read() for s in starts]
        out = np.empty((starts.size, length), dtype=np.int32)
        for i, f in enumerate(futures):
            out[i] = f.result()
        return out

    def document_bounds(self, index: int) -> tuple[int, int]:
        """Token range `[start, stop)` of document `index` (its EOS included)."""
        n = self.num_documents
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"token cache {self.path!r}: document {index} is outside [0, {n})")
        lo, hi = self._off[i : i + 2].read().result().tolist()
        return int(lo), int(hi)

    def document(self, index: int) -> np.ndarray:
        """Token ids of document `index` (ending with EOS), as int32."""
        lo, hi = self.document_bounds(index)
        return self.tokens(lo, hi)

    def offsets(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Document offsets `[start, stop]` (int64); `offsets()[-1] == num_tokens`."""
        stop = self.num_documents if stop is None else stop
        return self._off[start : stop + 1].read().result()

    def verify(self, chunk_tokens: int = 1 << 24) -> None:
        """Re-hash every shard's tokens and check them against the manifest's ledger; check the offsets.

        Reads the whole cache once (in `chunk_tokens` pieces). Raises `CacheError` naming the first shard
        whose tokens differ from what was written, or the first bad offset.
        """
        for shard in self.manifest["shards"]:
            h = hashlib.sha256()
            start, n = int(shard["token_start"]), int(shard["tokens"])
            for lo in range(start, start + n, chunk_tokens):
                h.update(self.tokens(lo, min(start + n, lo + chunk_tokens)).astype("<i4").tobytes())
            if h.hexdigest() != shard["sha256"]:
                raise CacheError(
                    f"token cache {self.path!r}: the tokens of shard {shard['path']!r} (tokens {start}..{start + n}) "
                    "do not match the sha256 recorded when they were written; the cache is corrupt, rebuild it"
                )
        offsets = self.offsets()
        bad = np.flatnonzero(np.diff(offsets) <= 0)
        if offsets[0] != 0 or offsets[-1] != self.num_tokens or bad.size:
            where = f"document {int(bad[0])}" if bad.size else "the first or last offset"
            raise CacheError(
                f"token cache {self.path!r}: offsets are inconsistent at {where}; rebuild the cache"
            )
        ends = offsets[1:] - 1
        if ends.size and not np.all(self._tok.oindex[ends].read().result() == self.eos_id):
            raise CacheError(
                f"token cache {self.path!r}: a document does not end with EOS ({self.eos_id}); rebuild it"
            )
