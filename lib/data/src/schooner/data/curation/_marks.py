"""Marks: the few records a global operation (a deduplication) has something to say about, keyed by their
place in the source (`[file index, record index]`; ids need not be unique), turned into a co-partitioned
attribute folder where every other record gets the default attributes."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import orjson
import zstandard

from schooner.data import storage

from ._attributes import attribute_dataset


def loc_key(loc: list[int]) -> str:
    """`"file:record"`, the key of a mark."""
    return f"{loc[0]}:{loc[1]}"


def save_marks(path: str, marks: dict[str, dict]) -> None:
    """Write marks (loc key -> attributes) as one zstd-compressed JSON file."""
    data = zstandard.ZstdCompressor(level=3).compress(orjson.dumps(marks, option=orjson.OPT_SORT_KEYS))
    storage.write_bytes(path, data)


@functools.lru_cache(maxsize=8)
def load_marks(path: str) -> dict[str, Any]:
    """Marks written by `save_marks` (loaded once per process)."""
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
    path = storage.join(work, f"{name}-marks.json.zst")
    save_marks(path, marks)
    lookup = MarkLookup(path, tuple(sorted(default.items())), name)
    return attribute_dataset(source, per_record=lookup, locate=True).write_jsonl(output, **execution)


class UnionFind:
    """Connected components over hashable nodes (path halving, union by size)."""

    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}
        self.size: dict[Any, int] = {}

    def find(self, x: Any) -> Any:
        p = self.parent
        if x not in p:
            p[x] = x
            self.size[x] = 1
            return x
        while p[x] != x:
            p[x] = p[p[x]]
            x = p[x]
        return x

    def union(self, a: Any, b: Any) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.size[ra] < self.size[rb]:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.size[ra] += self.size[rb]

    def components(self) -> dict[Any, list[Any]]:
        """root -> members (sorted), for every node seen."""
        out: dict[Any, list[Any]] = {}
        for x in self.parent:
            out.setdefault(self.find(x), []).append(x)
        return {r: sorted(m) for r, m in out.items()}
