"""Pipelines for `schooner.data.steps.transform`: module-level functions taking a `Dataset` (and JSON-able
keyword arguments) and returning the `Dataset` to write. A step stores a pipeline by its name
(`module:function`), so workers import it.

Example:
    >>> from schooner.data import Dataset
    >>> ds = Dataset.from_records([{"text": "a"}, {"text": "abc"}, {"text": "abc"}])
    >>> [r["text"] for r in drop_exact_duplicates(length_filter(ds, min_chars=2)).collect(client="inline", progress=False)]
    ['abc']
"""

from __future__ import annotations

from dataclasses import dataclass

from ._dataset import Dataset


def identity(ds: Dataset) -> Dataset:
    """The records unchanged (what `import_files` writes: its inputs normalised to records)."""
    return ds


def length_filter(ds: Dataset, min_chars: int = 0, max_chars: int | None = None) -> Dataset:
    """Keep records whose text has `min_chars..max_chars` characters (drops counted under `length`)."""
    return ds.filter(_LengthBetween(min_chars, max_chars), reason="length")


@dataclass(frozen=True)
class _LengthBetween:
    lo: int
    hi: int | None

    def __call__(self, rec: dict) -> bool:
        n = len(rec["text"])
        return n >= self.lo and (self.hi is None or n <= self.hi)


def drop_exact_duplicates(ds: Dataset, key: str = "text") -> Dataset:
    """Keep the first record of each exact `key` value (`Dataset.deduplicate`, a disk shuffle).

    Not to be confused with the curation step `schooner.data.curation.steps.exact_dedup`, which marks
    duplicates as attributes and leaves dropping them to `consolidate`.
    """
    return ds.deduplicate(key)
