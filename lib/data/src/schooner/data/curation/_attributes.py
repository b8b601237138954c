"""Attribute folders: what a curation operator computed about each record, kept apart from the records.

An attribute folder is a record folder co-partitioned with its source: shard `i` holds, in the same order,
one record per source record, `{"id": <source id>, "text": "", "source": "attributes", "metadata":
{<attribute>: <value>, ...}}` (Dolma's layout; compute once, filter many ways). Attributes that mark parts
of a text are spans, `[[start, end, ...], ...]` in characters of the source text. `read_with_attributes`
zips a source shard with the matching shards of any number of attribute folders, checking every id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from schooner.data import storage
from schooner.data._dataset import Dataset
from schooner.data._errors import DataError, SkipLog
from schooner.data._folders import list_shards
from schooner.data._readers import read_records
from schooner.data._splits import Split

ATTRIBUTES_SOURCE = "attributes"
"""The `source` of attribute records."""


def attribute_record(rec: dict, attrs: dict) -> dict:
    """The attribute record of source record `rec`."""
    return {"id": rec["id"], "text": "", "source": ATTRIBUTES_SOURCE, "metadata": attrs}


@dataclass(frozen=True)
class _PerRecord:
    fn: Callable[[dict], dict]

    def __call__(self, rec: dict) -> dict:
        return attribute_record(rec, self.fn(rec))

    @property
    def __name__(self) -> str:
        return getattr(self.fn, "__name__", type(self.fn).__name__)


@dataclass(frozen=True)
class _PerShard:
    fn: Callable[[Iterator[dict]], Iterator[dict]]

    def __call__(self, records: Iterator[dict]) -> Iterator[dict]:
        held: list[dict] = []

        def feed() -> Iterator[dict]:
            for r in records:
                held.append(r)
                yield r

        for attrs in self.fn(feed()):
            if not held:
                raise ValueError(f"{self.__name__} yielded more attribute dicts than it was given records")
            yield attribute_record(held.pop(0), attrs)
        if held:
            raise ValueError(f"{self.__name__} yielded {len(held)} fewer attribute dicts than records")

    @property
    def __name__(self) -> str:
        return getattr(self.fn, "__name__", type(self.fn).__name__)


def attribute_dataset(
    source: str | Sequence[str], *, per_record: Callable[[dict], dict] | None = None,
    per_shard: Callable[[Iterator[dict]], Iterator[dict]] | None = None, locate: bool = False,
    on_error: str = "raise",
) -> Dataset:  # fmt: skip
    """A `Dataset` of the attribute records of `source`, one output shard per source shard (write it with
    `write_jsonl` and no `num_shards`). Give `per_record(record) -> attrs`, or `per_shard(records) ->
    attrs...` (same count and order; for batching or a model loaded once per shard)."""
    if (per_record is None) == (per_shard is None):
        raise ValueError("attribute_dataset: pass exactly one of per_record= or per_shard=")
    ds = Dataset.from_files(source, split_row_groups=False, locate=locate, on_error=on_error)
    if per_record is not None:
        return ds.map(_PerRecord(per_record), name="attributes")
    return ds.map_shard(_PerShard(per_shard), name="attributes")  # type: ignore[arg-type]


def check_copartitioned(source: str, folder: str) -> list[str]:
    """The shards of attribute `folder`, checked to pair one-to-one with `source`'s shards."""
    src, att = list_shards(source), list_shards(folder)
    if len(src) != len(att):
        raise DataError(
            folder,
            f"holds {len(att)} attribute shards for a source of {len(src)} shards ({source}); it was computed "
            "from another folder: recompute the attributes from this source",
        )
    return att


@dataclass(frozen=True)
class ZipSplit(Split):
    """Source shard `index` with the matching shard of every attribute folder: each record gets
    `"_attrs"` (the attributes merged, later folders winning on a shared name)."""

    path: str
    attribute_paths: tuple[str, ...]
    index: int
    locate: bool = False

    @property
    def label(self) -> str:
        return self.path

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        readers = [read_records(p) for p in self.attribute_paths]
        for i, rec in enumerate(read_records(self.path)):
            merged: dict[str, Any] = {}
            for p, it in zip(self.attribute_paths, readers):
                att = next(it, None)
                if att is None:
                    raise DataError(
                        p,
                        f"ends at record {i}, but its source {self.path} goes on: the attributes were computed "
                        "from other records (another source, or an earlier version of this one); recompute "
                        "them from this source",
                    )
                if att["id"] != rec["id"]:
                    raise DataError(
                        p,
                        f"record {i} has id {att['id']!r} where source {self.path} has {rec['id']!r}: the "
                        "attributes were computed from other records (another source, or an earlier version of "
                        "this one); recompute them from this source",
                    )
                merged.update(att["metadata"])
            rec["_attrs"] = merged
            if self.locate:
                rec["_loc"] = [self.index, i]
            yield rec
        for p, it in zip(self.attribute_paths, readers):
            if next(it, None) is not None:
                raise DataError(
                    p,
                    f"has more records than its source {self.path}: the attributes were computed from other "
                    "records (another source, or an earlier version of this one); recompute them from this source",
                )

    def token(self) -> Any:
        files = [self.path, *self.attribute_paths]
        return ["zip", files, [storage.file_identity(f) for f in files], self.index, self.locate]


def with_attributes(source: str, attribute_folders: Sequence[str], *, locate: bool = False) -> Dataset:
    """A `Dataset` of `source`'s records, each with `"_attrs"` from the co-partitioned `attribute_folders`."""
    folders = list(attribute_folders)

    def splits() -> list[Split]:
        shards = list_shards(source)
        attrs = [check_copartitioned(source, f) for f in folders]
        return [ZipSplit(s, tuple(a[i] for a in attrs), i, locate) for i, s in enumerate(shards)]

    return Dataset(splits, describe=f"with_attributes({source!r}, {folders!r})")


def iter_attributes(folder: str, keys: Sequence[str] | None = None) -> Iterator[dict]:
    """The attribute dicts of a folder, in order (only `keys` when given)."""
    for shard in list_shards(folder):
        for rec in read_records(shard):
            m = rec["metadata"]
            yield m if keys is None else {k: m.get(k) for k in keys}
