"""MinHash signatures and LSH band buckets (Broder 1997; Leskovec et al., "Mining of Massive Datasets",
ch. 3), computed by Marin's Rust kernels (`marin-dupekit`), imported only here.

Defaults are Marin's: text normalised (lower case, punctuation removed, whitespace collapsed), character
5-grams, 286 permutations in 26 bands of 11 rows (pairs above Jaccard ~0.74 = (1/26)^(1/11) become
candidates), documents capped at 500,000 characters. Candidates are verified against the text: the exact
Jaccard similarity of the two documents' 5-gram sets must reach `threshold` (0.8, the near-duplicate
threshold of Lee et al. 2022, "Deduplicating Training Data Makes Language Models Better").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class MinHashConfig:
    """MinHash + LSH + verification settings."""

    num_perms: int = 286
    num_bands: int = 26
    ngram: int = 5
    """Character n-grams of the normalised text."""
    max_chars: int = 500_000
    """Characters of a document hashed (and verified)."""
    seed: int = 42
    threshold: float = 0.8
    """Exact 5-gram Jaccard a candidate pair must reach to count as near duplicates."""
    verify: bool = True
    """Verify candidates against the text (False: every LSH candidate counts, as Marin does)."""
    batch_size: int = 512
    """Documents per kernel call."""
    keep: str = "longest"
    """Which member of a cluster is kept (the others are its duplicates): `"longest"` (most characters of
    text: the full page, not a truncated copy), `"first"` (input order), or `"metadata.<field>"` (the highest
    number in that metadata field, e.g. a quality score). Ties go to the first in input order, and exact
    copies of a text stand as their first copy (with the best rank among them), the copy exact dedup keeps."""

    def __post_init__(self) -> None:
        if self.keep not in ("longest", "first") and not (
            self.keep.startswith("metadata.") and len(self.keep) > len("metadata.")
        ):
            raise ValueError(
                f"MinHashConfig: keep={self.keep!r}; use 'longest', 'first' or 'metadata.<field>' (a number in "
                "each record's metadata, the highest kept)"
            )
        if self.num_perms % self.num_bands:
            raise ValueError(
                f"MinHashConfig: num_perms={self.num_perms} must be a multiple of num_bands={self.num_bands}"
            )
        if not 0 < self.threshold <= 1:
            raise ValueError(f"MinHashConfig.threshold must be in (0, 1], got {self.threshold}")
        if self.ngram < 1 or self.max_chars < 1 or self.batch_size < 1:
            raise ValueError(f"MinHashConfig: ngram, max_chars and batch_size must be >= 1, got {self}")

    def rank(self, record: dict) -> float:
        """How strongly `record` is kept in its cluster under `keep` (higher first).

        Raises:
            ValueError: `keep="metadata.<field>"` and the record has no finite number there.
        """
        if self.keep == "longest":
            return float(len(record["text"]))
        if self.keep == "first":
            return 0.0
        name = self.keep.removeprefix("metadata.")
        meta = record.get("metadata")
        value = meta.get(name) if isinstance(meta, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(
                f"fuzzy dedup keep={self.keep!r}: record {record.get('id')!r} has no number in metadata field "
                f"{name!r} (got {value!r}); give every record one, or use keep='longest'"
            )
        return float(value)

    @property
    def rows(self) -> int:
        return self.num_perms // self.num_bands

    @property
    def lsh_threshold(self) -> float:
        """The Jaccard similarity at which a pair becomes a candidate with probability ~1/2."""
        return (1 / self.num_bands) ** (1 / self.rows)


def _kernels():  # noqa: ANN202
    try:
        import dupekit
    except ImportError as e:
        raise ImportError("fuzzy dedup needs marin-dupekit: pip install 'schooner-data[curation]'") from e
    return dupekit


def normalize_texts(texts: Sequence[str], max_chars: int = 500_000) -> list[str]:
    """The kernels' normalisation (lower case, punctuation removed, whitespace collapsed)."""
    import pyarrow as pa

    dk = _kernels()
    batch = pa.RecordBatch.from_pydict({"t": [t[:max_chars] for t in texts]})
    out = dk.transform(batch, [dk.Transformation.CleanText(input_col="t", output_col="c")])
    return out["c"].to_pylist()


def signatures_and_buckets(texts: Sequence[str], config: MinHashConfig) -> tuple[np.ndarray, np.ndarray]:
    """`(signatures uint64 [n, num_perms], buckets uint64 [n, num_bands])` of texts (one kernel call)."""
    out = _run_kernels(texts, config, ["sig", "b"])
    return _uint64_rows(out["sig"], config.num_perms), _uint64_rows(out["b"], config.num_bands)


def string_array(texts: Sequence[str], *, binary: bool = False) -> Any:
    """An Arrow array of `texts` built from one buffer (`pa.array` on a list imports pandas, which costs a
    cold worker seconds, only to ask whether the list is a pandas object): UTF-8 strings, a lone surrogate
    (JSON allows one) replaced; or, with `binary`, bytes that keep it (decode with "surrogatepass")."""
    import pyarrow as pa

    errors = "surrogatepass" if binary else "replace"
    data = [t.encode("utf-8", errors) for t in texts]
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in data], out=offsets[1:])
    small = offsets[-1] < 2**31
    if binary:
        kind = pa.binary() if small else pa.large_binary()
    else:
        kind = pa.string() if small else pa.large_string()
    width = np.int32 if small else np.int64
    return pa.Array.from_buffers(
        kind, len(data), [None, pa.py_buffer(offsets.astype(width)), pa.py_buffer(b"".join(data))]
    )


def kernel_batch(texts: Sequence[str], config: MinHashConfig) -> tuple[Any, np.ndarray]:
    """`(normalised texts as an Arrow string array, band keys uint64 [n, num_bands])` of texts (capped at
    `max_chars`), in one kernel call; the signatures never leave the kernels."""
    if not texts:
        return string_array([]), np.empty((0, config.num_bands), dtype=np.uint64)
    out = _run_kernels(texts, config, ["c", "b"])
    return out["c"], _uint64_rows(out["b"], config.num_bands)


def _run_kernels(texts: Sequence[str], config: MinHashConfig, columns: list[str]) -> Any:
    """The kernels over texts capped at `max_chars`: normalised text `c`, signatures `sig`, band keys `b`."""
    import pyarrow as pa

    dk = _kernels()
    T = dk.Transformation
    cap = config.max_chars
    batch = pa.RecordBatch.from_arrays(
        [string_array([t if len(t) <= cap else t[:cap] for t in texts])], ["t"]
    )
    return dk.transform(batch, [
        T.CleanText(input_col="t", output_col="c"),
        T.MinHash(input_col="c", output_col="sig", num_perms=config.num_perms, ngram_size=config.ngram,
                  seed=config.seed),
        T.MinHashLSH(input_col="sig", output_col="b", num_bands=config.num_bands),
        T.SelectColumns(columns=columns),
    ])  # fmt: skip


def _uint64_rows(column: Any, width: int) -> np.ndarray:
    """A list<uint64> column without nulls as `uint64 [n, width]`, read from its buffer (Arrow's to_numpy
    imports pandas)."""
    flat = column.flatten()
    keys = np.frombuffer(flat.buffers()[1], dtype=np.uint64, count=len(flat), offset=flat.offset * 8)
    return keys.reshape(-1, width)


def shingles(normalized: str, n: int = 5) -> set[str]:
    """Character n-grams of a normalised text (the whole text when it is shorter than n)."""
    if len(normalized) <= n:
        return {normalized} if normalized else set()
    return {normalized[i : i + n] for i in range(len(normalized) - n + 1)}


def ngram_codes(normalized: str, n: int = 5) -> np.ndarray | None:
    """The distinct character n-grams of a normalised text, each packed exactly (injectively) into a
    uint64, sorted: `64 // n` bits per character (12 for 5-grams), so None when a character's code point
    does not fit (then use `shingles`). A text shorter than n is one n-gram, as in `shingles`."""
    bits = 64 // n
    cp = np.frombuffer(normalized.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64) + 1
    if not len(cp):
        return np.empty(0, dtype=np.uint64)
    if int(cp.max()) >= 1 << bits:
        return None
    m = max(1, len(cp) - n + 1)
    code = cp[:m].copy()
    for k in range(1, min(n, len(cp))):
        code |= cp[k : k + m] << np.uint64(bits * k)
    code.sort()  # sort + neighbours: np.unique costs several times more on arrays this small
    keep = np.empty(m, dtype=bool)
    keep[0] = True
    np.not_equal(code[1:], code[:-1], out=keep[1:])
    return code[keep]


def jaccard(a: set[str] | np.ndarray, b: set[str] | np.ndarray) -> float:
    """Exact Jaccard similarity of two sets, or of two sorted arrays of distinct codes (1.0 for two empty)."""
    if not len(a) and not len(b):
        return 1.0
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if not len(a) or not len(b):
            return 0.0
        at = np.searchsorted(b, a)  # both sorted and distinct
        inter = int(np.count_nonzero(b[np.minimum(at, len(b) - 1)] == a))
    elif isinstance(a, set) and isinstance(b, set):
        inter = len(a & b)
    else:
        raise TypeError(
            f"jaccard of a {type(a).__name__} and a {type(b).__name__}: pass two sets of shingles or two "
            "arrays of n-gram codes"
        )
    return inter / (len(a) + len(b) - inter)
