"""Split units: what one task reads (a file or parquet row group, records, a HF range, spill, a partition).

Every split is a small frozen type implementing `Split`: a `label` for messages and progress, `iterate`
over its records, and a `token` identifying its content in a plan fingerprint. Splits that read the
output of an earlier stage (`SpillSplit`, `ReduceSplit`) carry the token of the plan that produced it,
never the physical names of the files (those differ from run to run).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from . import storage
from ._errors import DataError, OnError, SkipLog, handle, record_error
from ._json import dumps_json
from ._readers import TextMode, read_records
from ._records import BadRecord, normalize
from ._shuffle import reduce_groups, sorted_items
from ._spill import SpillInfo
from ._spill import read_spill_records as read_spill


class Split(ABC):
    """What one task reads."""

    reads_input: bool = True
    """Whether the split reads pipeline input (counted as `read.records` / `read.skipped`)."""

    @property
    @abstractmethod
    def label(self) -> str:
        """A short description for messages and progress."""

    @abstractmethod
    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        """The records; bad input is counted in `skips`, other tallies go to `counters`."""

    @abstractmethod
    def token(self) -> Any:
        """What identifies the split's content in a plan fingerprint (JSON-able)."""


@dataclass(frozen=True)
class ReadOptions:
    """How input files are read (see `read_records`)."""

    text_field: str = "text"
    id_field: str = "id"
    source: str | None = None
    format: str | None = None
    compression: str | None = None
    columns: tuple[str, ...] | None = None
    filter: Any = None
    text_mode: TextMode = "file"
    on_error: OnError = "raise"
    locate: bool = False
    """Add `record["_loc"] = [file index, record index in the file]` (what co-partitioned attributes and
    deduplication marks are keyed by: ids need not be unique)."""

    def token(self) -> Any:
        return [self.text_field, self.id_field, self.source, self.format, self.compression,
                list(self.columns) if self.columns is not None else None,
                None if self.filter is None else str(self.filter), self.text_mode, self.on_error,
                self.locate]  # fmt: skip


@dataclass(frozen=True)
class FileSplit(Split):
    """One file, or some row groups of a parquet file."""

    path: str
    options: ReadOptions
    row_groups: tuple[int, ...] | None = None
    index: int = 0
    """The file's place among the pipeline's input files (for `ReadOptions.locate`)."""

    @property
    def label(self) -> str:
        return (
            self.path if self.row_groups is None else f"{self.path}#rg{','.join(map(str, self.row_groups))}"
        )

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        o = self.options
        it = read_records(
            self.path, text_field=o.text_field, id_field=o.id_field, on_error=o.on_error, source=o.source,
            format=o.format, compression=o.compression, columns=list(o.columns) if o.columns else None,
            filter=o.filter, row_groups=list(self.row_groups) if self.row_groups is not None else None,
            text_mode=o.text_mode, skips=skips,
        )  # fmt: skip
        return _located(it, self.index) if o.locate else it

    def token(self) -> Any:
        rgs = list(self.row_groups) if self.row_groups is not None else None
        where = [self.index] if self.options.locate else []
        return ["file", self.path, storage.file_identity(self.path), self.options.token(), rgs, *where]


def _located(records: Iterator[dict], index: int) -> Iterator[dict]:
    for i, rec in enumerate(records):
        rec["_loc"] = [index, i]
        yield rec


@dataclass(frozen=True)
class RecordsSplit(Split):
    """Records held in the task itself (from `Dataset.from_records`)."""

    records: tuple[dict, ...]
    index: int = 0

    @property
    def label(self) -> str:
        return f"records[{self.index}]"

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        return iter(self.records)

    def token(self) -> Any:
        h = hashlib.sha256()
        for r in self.records:
            try:
                h.update(dumps_json(r))
            except TypeError:
                from ._fingerprint import Unfingerprintable

                raise Unfingerprintable(f"record {str(r)[:60]!r} is not JSON") from None
            h.update(b"\n")
        return ["records", self.index, h.hexdigest()]


@dataclass(frozen=True)
class HFSplit(Split):
    """Rows `start:stop` of a Hugging Face dataset saved with `save_to_disk` (or a hub id)."""

    path: str
    split: str | None
    start: int
    stop: int
    text_field: str = "text"
    id_field: str = "id"
    source: str | None = None
    on_error: str = "raise"

    @property
    def label(self) -> str:
        return f"{self.path}[{self.start}:{self.stop}]"

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        from ._arrow_rows import arrow_value_rows

        table = load_hf(self.path, self.split).with_format("arrow")
        source = self.source if self.source is not None else hf_name(self.path, self.split)
        step = 8192
        for lo in range(self.start, self.stop, step):
            batch = table[lo : min(lo + step, self.stop)]
            for i, row in enumerate(arrow_value_rows(batch, self.path, lo), start=lo):
                try:
                    yield normalize(row, self.text_field, self.id_field, source)
                except BadRecord as e:
                    handle(record_error(self.path, str(e), row=i), self.on_error, skips)

    def token(self) -> Any:
        from ._folders import hf_fingerprint

        fp = hf_fingerprint(self.path) if storage.exists(self.path) else None
        return ["hf", self.path, fp, self.split, self.start, self.stop, self.text_field, self.id_field,
                self.source, self.on_error]  # fmt: skip


def hf_name(path: str, split: str | None) -> str:
    import os

    base = os.path.basename(path.rstrip("/")) or path
    return f"{base}/{split}" if split else base


def load_hf(path: str, split: str | None) -> Any:
    """A `datasets.Dataset`: `load_from_disk` for a saved folder, else `load_dataset(path, split=...)`.

    Raises:
        ImportError: the `datasets` library is not installed (install `schooner-data[hf]`).
        DataError: a DatasetDict without `split`, listing the splits.
    """
    try:
        import datasets
    except ImportError as e:
        raise ImportError(
            "reading Hugging Face datasets needs `datasets`: pip install 'schooner-data[hf]' (a folder saved "
            "with save_to_disk is also readable without it: Dataset.from_files(folder))"
        ) from e
    if storage.exists(path):
        ds = datasets.load_from_disk(path)
    else:  # a hub id: needs network access (never in tests)
        ds = datasets.load_dataset(path, split=split)
    if isinstance(ds, datasets.DatasetDict):
        if split is None or split not in ds:
            raise DataError(path, f"holds splits {sorted(ds)}; pass split= naming one (got split={split!r})")
        ds = ds[split]
    return ds


@dataclass(frozen=True)
class SpillSplit(Split):
    """Slices `(spill file, start, stop)` of an earlier stage's spill files (after `take` or `reshard`)."""

    pieces: tuple[tuple[dict, int, int], ...]
    index: int
    plan: Any
    reads_input = False

    @property
    def label(self) -> str:
        return f"spill[{self.index}]"

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        for info, start, stop in self.pieces:
            yield from read_spill(SpillInfo.from_dict(info), start, stop)

    def token(self) -> Any:
        return ["spill", self.plan, self.index]


@dataclass(frozen=True)
class ReduceSplit(Split):
    """One shuffle partition: its frames in every map task's spill file, reduced group by group."""

    inputs: tuple[dict, ...]
    partition: int
    key_fn: Callable[[dict], Any]
    reducer: Callable[[Any, list[dict]], Any]
    label_: str
    memory_budget: int
    scratch_dir: str
    plan: Any
    dedup: bool = False
    reads_input = False

    @property
    def label(self) -> str:
        return f"{self.label_}[partition {self.partition}]"

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        stats: dict[str, int] = {}
        inputs = [SpillInfo.from_dict(d) for d in self.inputs]
        items = sorted_items(inputs, self.partition, self.memory_budget, self.scratch_dir, stats)
        n_out = 0
        for rec in reduce_groups(items, self.key_fn, self.reducer, self.label_, stats, keep_first=self.dedup):
            n_out += 1
            yield rec
        lab = self.label_
        add = {"in": stats.get("in", 0), "groups": stats.get("groups", 0), "out": n_out,
               "spilled_runs": stats.get("spilled_runs", 0), "hash_collisions": stats.get("hash_collisions", 0)}  # fmt: skip
        for k, v in add.items():
            counters[f"{lab}.{k}"] = counters.get(f"{lab}.{k}", 0) + v
        if self.dedup:
            counters["dropped.duplicate"] = counters.get("dropped.duplicate", 0) + stats.get("in", 0) - n_out

    def token(self) -> Any:
        return ["reduce", self.plan, self.partition]
