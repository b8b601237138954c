"""`TokenCache`: lazy random access to a tokenized corpus stored as tensorstore (zarr3) arrays.

A cache folder holds:

- `manifest.json`: format version, tokenizer fingerprint, vocab size, special ids, token dtype, document
  and token counts, the largest token id, the per-shard ledger and the source paths.
- `tokens/`: every document's token ids (EOS-terminated), concatenated, 1-D.
- `offsets/`: int64 `[num_documents + 1]`; document `i` is `tokens[offsets[i]:offsets[i+1]]`.

Format 2 adds, for caches whose `kind` is `"chat"` or `"preference"` (`has_loss_mask` in the manifest):

- `loss_mask/`: uint8 `[num_tokens]`, 1 where the token is a training target (the assistant's tokens).
- `first_target/`: int64 `[num_documents]`, the position of each document's first target inside it.
- `info/` + `info_offsets/`: uint8 bytes and int64 `[num_documents + 1]` offsets of one JSON object per
  document (`{"id", "source"}`, and `"role"` in preference caches), so errors can name a document.

Text caches built by this version also hold (`has_document_bytes` and `text_bytes` in the manifest; older
caches lack them and are read as before):

- `document_bytes/`: int64 `[num_documents]`, the UTF-8 bytes of each document's text: what bits per byte
  divides by. Summing the tokenizer's per-token byte lengths instead counts 0 for an `<unk>` token and
  is off for tokenizers whose tokens do not spell the text (a SentencePiece `▁` prefix, WordPiece `##`).

Format 1 caches (token ids only) are still read, as caches without masks.

Nothing is read until asked for, so a cache much larger than memory is fine.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorstore as ts

from schooner.cluster import storage

from . import _arrays

MANIFEST = "manifest.json"
FORMAT = "schooner-token-cache"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
"""Format versions this package reads: 1 (ids only), 2 (adds `kind`, and loss masks for chat/preference)."""
KINDS = ("text", "chat", "preference")
"""What a cache holds: plain documents, rendered conversations (SFT), or chosen/rejected pairs (DPO)."""


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
        self._tokens: ts.TensorStore | None = None
        self._offsets: ts.TensorStore | None = None
        self._arrays: dict[str, Any] = {}

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
        if manifest.get("format") != FORMAT or manifest.get("format_version") not in READABLE_VERSIONS:
            raise CacheError(
                f"token cache {path!r}: manifest format {manifest.get('format')!r} v{manifest.get('format_version')!r} "
                f"is not {FORMAT!r} v{' or v'.join(map(str, READABLE_VERSIONS))}; it was written by another "
                "version of schooner-tokenize: rebuild it with this one (or read it with the version that wrote it)"
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
        """Raise `TokenizerMismatchError` unless the cache was built with `tokenizer` (or its fingerprint): the
        same tokenizer JSON and, for a `Tokenizer`, the same BOS and EOS ids."""
        fp, desc = _fingerprint_of(tokenizer)
        if fp != self.tokenizer_fingerprint:
            raise TokenizerMismatchError(
                f"token cache {self.path!r} was built with tokenizer {self.manifest.get('tokenizer_source', '?')} "
                f"(fingerprint {self.tokenizer_fingerprint}) but is read with tokenizer {desc}; rebuild the "
                "cache with this tokenizer, or load the tokenizer the cache was built with"
            )
        # The same tokenizer.json with other special tokens (tokenizer_config.json, or bos_token=/eos_token=
        # at load): the cached documents end with the cache's EOS, not this tokenizer's. A fingerprint
        # string says nothing of them, and manifests written before they were recorded are accepted.
        for key in ("bos_id", "eos_id"):
            if isinstance(tokenizer, str) or key not in self.manifest:
                continue
            built, given = self.manifest[key], getattr(tokenizer, key, None)
            if built != given:
                raise TokenizerMismatchError(
                    f"token cache {self.path!r} was built with {key}={built} but is read with tokenizer {desc} "
                    f"whose {key}={given} (the same tokenizer.json, other special tokens: its "
                    "tokenizer_config.json or bos_token=/eos_token= differ); rebuild the cache with this "
                    "tokenizer, or load it with the special tokens the cache was built with"
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

    @property
    def kind(self) -> str:
        """`"text"`, `"chat"` or `"preference"` (format 1 caches are `"text"`)."""
        return str(self.manifest.get("kind", "text"))

    @property
    def has_loss_mask(self) -> bool:
        """Whether the cache stores a per-token loss mask (chat and preference caches)."""
        return bool(self.manifest.get("has_loss_mask", False))

    @property
    def has_document_bytes(self) -> bool:
        """Whether the cache stores the UTF-8 bytes of each document's text (text caches built by this
        version; see `document_bytes`)."""
        return bool(self.manifest.get("has_document_bytes", False))

    def document_bytes(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """int64: the UTF-8 bytes of the texts of documents `[start, stop)` (default all).

        Raises:
            CacheError: the cache holds no byte counts (a chat or preference cache, or a text cache built
                before they were recorded: rebuild it).
        """
        if not self.has_document_bytes:
            raise CacheError(
                f"token cache {self.path!r} ({self.kind} cache) has no per-document byte counts: "
                + (
                    "it was built before they were recorded; rebuild it (build_cache or the tokenized step)"
                    if self.kind == "text"
                    else "only text caches record them"
                )
            )
        stop = self.num_documents if stop is None else stop
        if not 0 <= start <= stop <= self.num_documents:
            raise IndexError(
                f"token cache {self.path!r}: documents [{start}, {stop}) are outside [0, {self.num_documents}]"
            )
        return self._array("document_bytes")[start:stop].read().result().astype(np.int64, copy=False)

    @property
    def pad_id(self) -> int | None:
        """The tokenizer's padding id, or None."""
        pad = self.manifest.get("pad_id")
        return None if pad is None else int(pad)

    def __len__(self) -> int:
        return self.num_documents

    def __repr__(self) -> str:
        return (
            f"TokenCache({self.path!r}, documents={self.num_documents}, tokens={self.num_tokens}, "
            f"vocab_size={self.vocab_size}, tokenizer={self.tokenizer_fingerprint[:12]})"
        )

    # -- reading -------------------------------------------------------------------------------------
    @property
    def _tok(self) -> ts.TensorStore:
        if self._tokens is None:
            self._tokens = _arrays.open_array(storage.join(self.path, "tokens"))
        return self._tokens

    @property
    def _off(self) -> ts.TensorStore:
        if self._offsets is None:
            self._offsets = _arrays.open_array(storage.join(self.path, "offsets"))
        return self._offsets

    def _array(self, name: str) -> Any:
        if name not in self._arrays:
            self._arrays[name] = _arrays.open_array(storage.join(self.path, name))
        return self._arrays[name]

    def _need_masks(self, what: str) -> None:
        if not self.has_loss_mask:
            raise CacheError(
                f"token cache {self.path!r} ({self.kind} cache) has no {what}; only chat and preference caches "
                "(tokenized_chat / tokenized_preferences) do"
            )

    def loss_mask(self, start: int, stop: int) -> np.ndarray:
        """Loss mask of tokens `[start, stop)` as uint8 (1: a training target); all ones without masks."""
        if not (0 <= start <= stop <= self.num_tokens):
            raise IndexError(
                f"token cache {self.path!r}: token range [{start}, {stop}) is outside [0, {self.num_tokens}]"
            )
        if not self.has_loss_mask:
            return np.ones(stop - start, dtype=np.uint8)
        return self._array("loss_mask")[start:stop].read().result()

    def first_targets(self) -> np.ndarray:
        """int64 `[num_documents]`: where each document's first target token is, counted from its start."""
        self._need_masks("first_target array")
        return self._array("first_target").read().result()

    def document_info(self, index: int) -> dict[str, Any]:
        """`{"id", "source"}` of document `index` (and `"role"`: chosen/rejected in preference caches)."""
        self._need_masks("per-document info")
        n = self.num_documents
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"token cache {self.path!r}: document {index} is outside [0, {n})")
        lo, hi = self._array("info_offsets")[i : i + 2].read().result().tolist()
        return json.loads(self._array("info")[lo:hi].read().result().tobytes())

    def describe_document(self, index: int) -> str:
        """`document 12 (id 'abc', source 'chats') of token cache '...'`, for error messages."""
        if not self.has_loss_mask:
            return f"document {index} of token cache {self.path!r}"
        info = self.document_info(index)
        return f"document {index} (id {info.get('id')!r}, source {info.get('source')!r}) of token cache {self.path!r}"

    def __getstate__(self) -> dict:  # tensorstore handles are reopened lazily after unpickling
        return {"path": self.path, "manifest": self.manifest}

    def __setstate__(self, state: dict) -> None:
        TokenCache.__init__(self, state["path"], state["manifest"])

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Token ids `[start, stop)` of the concatenated stream, as int32."""
        if not (0 <= start <= stop <= self.num_tokens):
            raise IndexError(
                f"token cache {self.path!r}: token range [{start}, {stop}) is outside [0, {self.num_tokens}]"
            )
        return self._tok[start:stop].read().result().astype(np.int32, copy=False)

    def token_windows(self, starts: Sequence[int] | np.ndarray, length: int) -> np.ndarray:
        """Token ids `[s, s + length)` for every `s` in `starts`, as int32 `[len(starts), length]`."""
        starts = np.asarray(starts, dtype=np.int64)
        if starts.size and (starts.min() < 0 or starts.max() + length > self.num_tokens):
            raise IndexError(
                f"token cache {self.path!r}: windows of {length} tokens at {starts.tolist()[:8]} reach past "
                f"num_tokens={self.num_tokens}"
            )
        return _read_rows(self._tok, starts, np.full(starts.size, length, np.int64), length, 0)

    def padded_ranges(
        self, starts: np.ndarray, stops: np.ndarray, width: int, *, fill: int = 0, masks: bool = False
    ) -> np.ndarray:
        """int32 `[len(starts), width]`: row `i` holds the token ids (or with `masks=True` the loss mask) of
        `[starts[i], stops[i])`, then `fill`. Each range is at most `width` tokens long."""
        starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
        lengths = stops - starts
        if starts.size and (
            starts.min() < 0 or stops.max() > self.num_tokens or lengths.min() < 0 or lengths.max() > width
        ):
            raise IndexError(
                f"token cache {self.path!r}: ranges reach outside [0, {self.num_tokens}] or are longer than "
                f"width={width}"
            )
        if masks and not self.has_loss_mask:
            return np.where(np.arange(width) < lengths[:, None], 1, fill).astype(np.int32)
        return _read_rows(self._array("loss_mask") if masks else self._tok, starts, lengths, width, fill)

    def ranges(self, starts: np.ndarray, stops: np.ndarray, *, masks: bool = False) -> list[np.ndarray]:
        """Token ids (int32), or with `masks=True` loss masks (uint8), of every range `[starts[i], stops[i])`,
        read together (the reads overlap)."""
        starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
        if starts.size and (starts.min() < 0 or stops.max() > self.num_tokens or np.any(stops < starts)):
            raise IndexError(f"token cache {self.path!r}: ranges reach outside [0, {self.num_tokens}]")
        if masks and not self.has_loss_mask:
            return [np.ones(int(b - a), dtype=np.uint8) for a, b in zip(starts, stops)]
        arr = self._array("loss_mask") if masks else self._tok
        futures = [arr[int(a) : int(b)].read() for a, b in zip(starts, stops)]
        out = [f.result() for f in futures]
        return out if masks else [o.astype(np.int32, copy=False) for o in out]

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
        if self.has_loss_mask:
            self._verify_masks(offsets, chunk_tokens)
        if self.has_document_bytes:
            nbytes = self.document_bytes()
            if nbytes.size != self.num_documents or int(nbytes.sum()) != self.manifest.get("text_bytes"):
                raise CacheError(
                    f"token cache {self.path!r}: the per-document byte counts ({nbytes.size} documents, "
                    f"{int(nbytes.sum())} bytes) do not match the manifest ({self.num_documents} documents, "
                    f"text_bytes={self.manifest.get('text_bytes')}); the cache is corrupt, rebuild it"
                )

    def _verify_masks(self, offsets: np.ndarray, chunk_tokens: int) -> None:
        h = hashlib.sha256()
        for lo in range(0, self.num_tokens, chunk_tokens):
            h.update(self.loss_mask(lo, min(self.num_tokens, lo + chunk_tokens)).tobytes())
        if h.hexdigest() != self.manifest.get("loss_mask_sha256"):
            raise CacheError(
                f"token cache {self.path!r}: the loss mask does not match the sha256 recorded when it was "
                "written; the cache is corrupt, rebuild it"
            )
        first = self.first_targets()
        lengths = np.diff(offsets)
        bad = np.flatnonzero((first < 1) | (first >= lengths))
        if bad.size:
            raise CacheError(
                f"token cache {self.path!r}: {self.describe_document(int(bad[0]))} has first target "
                f"{int(first[bad[0]])}, outside [1, {int(lengths[bad[0]])}); rebuild the cache"
            )


_INDEX_READ_MAX = 128
"""Rows up to this wide are read as one index-array read for the whole batch; wider rows one slice read
each, issued together. Measured on 64 random rows of a 40M-token cache (tensorstore 0.1.86): one slice read
a row, about 25 us each whatever its width; one index-array read, 1.2 ms at 64 tokens a row, 1.9 ms at
256, 6 ms at 1024 (its cost grows with the elements), so index arrays pay only for narrow rows."""


def _read_rows(
    arr: ts.TensorStore, starts: np.ndarray, lengths: np.ndarray, width: int, fill: int
) -> np.ndarray:
    """int32 `[len(starts), width]`: `arr[starts[i] : starts[i] + lengths[i]]` in row `i`, then `fill`."""
    out = np.full((starts.size, width), fill, dtype=np.int32)
    inside = np.arange(width) < lengths[:, None]
    if not inside.any():
        return out
    if width <= _INDEX_READ_MAX:
        # Past a range's end: index 0, any index that exists; its value is replaced by `fill`.
        positions = np.where(inside, starts[:, None] + np.arange(width), 0)
        values = arr.vindex[positions].read().result()
        return np.where(inside, values, out).astype(np.int32, copy=False)
    futures = [arr[int(a) : int(a + n)].read() for a, n in zip(starts, lengths)]  # issued together
    for row, n, f in zip(out, lengths, futures):
        row[:n] = f.result()
    return out
