"""Marks: the few records a global operation (a deduplication) has something to say about, keyed by their
place in the source (`[file index, record index]`; ids need not be unique), turned into a co-partitioned
attribute folder where every other record gets the default attributes."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import zstandard

from schooner.data import storage
from schooner.data._errors import SkipLog
from schooner.data._execute import Sink, Stats
from schooner.data._splits import Split

from ._attributes import attribute_dataset, attribute_record


def loc_key(loc: list[int]) -> str:
    """`"file:record"`, the key of a mark."""
    return f"{loc[0]}:{loc[1]}"


def save_marks(folder: str, name: str, marks: dict[str, dict]) -> str:
    """Write marks (loc key -> attributes) as one zstd-compressed JSON file in `folder`, named by a hash of
    its content; returns its path. Other marks never share a path, so a process (or a reused worker) that
    loaded marks once never serves them for other marks written later into the same folder."""
    data = zstandard.ZstdCompressor(level=3).compress(orjson.dumps(marks, option=orjson.OPT_SORT_KEYS))
    path = storage.join(folder, f"{name}-marks-{hashlib.sha256(data).hexdigest()[:32]}.json.zst")
    storage.write_bytes(path, data)
    return path


@functools.lru_cache(maxsize=8)
def load_marks(path: str) -> dict[str, Any]:
    """Marks written by `save_marks` (loaded once per process: a path names one content)."""
    with storage.open_file(path, "rb") as f:
        return orjson.loads(zstandard.ZstdDecompressor().decompressobj().decompress(f.read()))


@dataclass(frozen=True)
class MarkLookup:
    """Per record (read with `locate=True`): its marks, else `default`."""

    path: str
    default: tuple[tuple[str, Any], ...]
    name: str = "marks"

    @property
    def __name__(self) -> str:
        return self.name

    def __call__(self, rec: dict) -> dict:
        got = load_marks(self.path).get(loc_key(rec["_loc"]))
        return dict(self.default) if got is None else {**dict(self.default), **got}


def write_marks_as_attributes(
    source: str, output: str, marks: dict[str, dict], default: dict[str, Any], *, name: str, work: str,
    **execution: Any,
) -> dict:  # fmt: skip
    """Save `marks` under `work` and write the attribute folder of `source` to `output`."""
    path = save_marks(work, name, marks)
    lookup = MarkLookup(path, tuple(sorted(default.items())), name)
    return attribute_dataset(source, per_record=lookup, locate=True).write_jsonl(output, **execution)


def read_arrow(path: str) -> Any:
    """The table of an Arrow IPC file (memory-mapped when local)."""
    import pyarrow as pa

    if storage.is_local(path):
        return pa.ipc.open_file(pa.memory_map(storage.local_path(path))).read_all()
    return pa.ipc.open_file(pa.BufferReader(storage.read_bytes(path))).read_all()


@dataclass(frozen=True)
class MarkedIdsSplit(Split):
    """The attribute records of one source shard from the `id` column (UTF-8 bytes, lone surrogates kept) of
    an Arrow file written from it (the source is not read again): `default` attributes, updated by `marks` (`(row, attributes)`, by row)."""

    path: str
    marks: tuple[tuple[int, dict], ...]
    default: tuple[tuple[str, Any], ...]
    index: int = 0
    reads_input = False

    @property
    def label(self) -> str:
        return self.path

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        marks = dict(self.marks)
        default = dict(self.default)
        for row, rid in enumerate(read_arrow(self.path)["id"].to_pylist()):
            m = marks.get(row)
            attrs = dict(default) if m is None else {**default, **m}
            yield attribute_record({"id": rid.decode("utf-8", "surrogatepass")}, attrs)

    def token(self) -> Any:
        digest = hashlib.sha256(orjson.dumps([list(self.marks), list(self.default)])).hexdigest()
        return ["marked_ids", self.path, self.index, digest]


@dataclass(frozen=True)
class CollectSink(Sink):
    """Hand a task's records back in its result (`items`): for the few records of a verification."""

    def consume(self, records: Iterator[dict], index: int, stats: Stats) -> dict:
        items = list(records)
        return {"records": len(items), "bytes": 0, "items": items}
