"""Split units: what one task reads (a file or parquet row group, records, a HF range, spill, a partition)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ._errors import DataError, SkipLog, handle, record_error
from ._readers import read_records
from ._records import BadRecord, normalize
from ._shuffle import read_spill, reduce_groups, sorted_items


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
    text_mode: str = "file"
    on_error: str = "raise"


@dataclass(frozen=True)
class FileSplit:
    """One file, or some row groups of a parquet file."""

    path: str
    options: ReadOptions
    row_groups: tuple[int, ...] | None = None

    @property
    def label(self) -> str:
        return (
            self.path if self.row_groups is None else f"{self.path}#rg{','.join(map(str, self.row_groups))}"
        )

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        o = self.options
        return read_records(
            self.path, text_field=o.text_field, id_field=o.id_field, on_error=o.on_error, source=o.source,
            format=o.format, compression=o.compression, columns=list(o.columns) if o.columns else None,
            filter=o.filter, row_groups=list(self.row_groups) if self.row_groups is not None else None,
            text_mode=o.text_mode, skips=skips,
        )  # fmt: skip


@dataclass(frozen=True)
class RecordsSplit:
    """Records held in the task itself (from `Dataset.from_records`)."""

    records: tuple[dict, ...]
    index: int = 0

    @property
    def label(self) -> str:
        return f"records[{self.index}]"

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        return iter(self.records)


@dataclass(frozen=True)
class HFSplit:
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
        table = load_hf(self.path, self.split).with_format("arrow")
        source = self.source if self.source is not None else hf_name(self.path, self.split)
        step = 8192
        for lo in range(self.start, self.stop, step):
            rows = table[lo : min(lo + step, self.stop)].to_pylist()
            for i, row in enumerate(rows, start=lo):
                try:
                    yield normalize(row, self.text_field, self.id_field, source)
                except BadRecord as e:
                    handle(record_error(self.path, str(e), row=i), self.on_error, skips)


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
            "reading Hugging Face datasets needs `datasets`: pip install 'schooner-data[hf]'"
        ) from e
    from . import _fs

    if _fs.exists(path):
        ds = datasets.load_from_disk(path)
    else:  # a hub id: needs network access (never in tests)
        ds = datasets.load_dataset(path, split=split)
    if isinstance(ds, datasets.DatasetDict):
        if split is None or split not in ds:
            raise DataError(path, f"holds splits {sorted(ds)}; pass split= naming one (got split={split!r})")
        ds = ds[split]
    return ds


@dataclass(frozen=True)
class SpillSplit:
    """Slices of intermediate spill files (after `take` or `reshard`)."""

    pieces: tuple[tuple[str, int, int], ...]
    index: int = 0

    @property
    def label(self) -> str:
        return f"spill[{self.index}]"

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        for path, start, stop in self.pieces:
            yield from read_spill(path, start, stop)


@dataclass(frozen=True)
class ReduceSplit:
    """One shuffle partition: its map-side files, reduced group by group."""

    files: tuple[str, ...]
    key_fn: Callable[[dict], Any]
    reducer: Callable[[Any, list[dict]], Any]
    label_: str
    memory_budget: int
    scratch_dir: str
    partition: int
    dedup: bool = False

    @property
    def label(self) -> str:
        return f"{self.label_}[partition {self.partition}]"

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        stats: dict[str, int] = {}
        items = sorted_items(list(self.files), self.memory_budget, self.scratch_dir, stats)
        n_out = 0
        for rec in reduce_groups(items, self.key_fn, self.reducer, self.label_, stats):
            n_out += 1
            yield rec
        lab = self.label_
        counters[f"{lab}.in"] = counters.get(f"{lab}.in", 0) + stats.get("in", 0)
        counters[f"{lab}.groups"] = counters.get(f"{lab}.groups", 0) + stats.get("groups", 0)
        counters[f"{lab}.out"] = counters.get(f"{lab}.out", 0) + n_out
        counters[f"{lab}.spilled_runs"] = counters.get(f"{lab}.spilled_runs", 0) + stats.get(
            "spilled_runs", 0
        )
        if self.dedup:
            key = "dropped.duplicate"
            counters[key] = counters.get(key, 0) + stats.get("in", 0) - n_out
