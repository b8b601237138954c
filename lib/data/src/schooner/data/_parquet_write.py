"""Writing records as parquet, with `metadata` as typed columns.

A shard's schema is `id`, `text`, `source` (strings), `metadata` (a struct) and `metadata_json` (a string).
The struct's fields are chosen from the shard's first row group: every metadata key whose values there all
have one JSON type (bool, 64-bit int, float, string, a list of one such type, or an object of such fields
with the same keys) becomes a typed field, so readers can filter on it with statistics
(`("metadata.lang", "==", "en")`). Everything else goes to `metadata_json`, one JSON object per record
(null when empty): keys first seen in later row groups, values of another type than the field's, explicit
nulls, integers beyond 64 bits. Reading merges the two, so every record comes back exactly as written.
Shards may therefore have different struct fields; the keys any record of a shard keeps in JSON are listed
in the file metadata (`schooner.metadata_json_keys`), and filters naming such a key are refused for that
shard rather than silently missing its JSON values.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ._json import dumps_json
from ._parquet import JSON_KEYS_KEY, RECORDS_KEY

MAX_TYPED_KEYS = 256
"""At most this many metadata keys become typed fields (the most frequent); the rest stay JSON."""
_I64 = (-(2**63), 2**63)
_BASE = [("id", pa.string()), ("text", pa.string()), ("source", pa.string())]


def signature(v: Any) -> Any:
    """The JSON type of a value as a hashable description, or None when it cannot be a typed field."""
    t = type(v)
    if t is bool:
        return "bool"
    if t is int:
        return "int" if _I64[0] <= v < _I64[1] else None
    if t is float:
        return "float"
    if t is str:
        return "str"
    if t is list:
        if not v:
            return ("list", "?")
        first = signature(v[0])
        if first is None or any(signature(x) != first for x in v[1:]):
            return None
        return ("list", first)
    if t is dict:
        if not v or any(type(k) is not str or not k for k in v):
            return None
        items = []
        for k in sorted(v):
            s = signature(v[k])
            if s is None:
                return None
            items.append((k, s))
        return ("dict", tuple(items))
    return None


def arrow_type(sig: Any) -> pa.DataType:
    if sig == "bool":
        return pa.bool_()
    if sig == "int":
        return pa.int64()
    if sig == "float":
        return pa.float64()
    if sig == "str":
        return pa.string()
    if sig == "?":
        return pa.null()
    if sig[0] == "list":
        return pa.list_(arrow_type(sig[1]))
    return pa.struct([pa.field(k, arrow_type(s)) for k, s in sig[1]])


def _merge(a: Any, b: Any) -> Any:
    """The common signature of two values' signatures (an empty list fits any list), or None."""
    if a == b:
        return a
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] == "list":
        if a[1] == "?":
            return b
        if b[1] == "?":
            return a
    return None


def infer_fields(metas: list[dict]) -> dict[str, Any]:
    """Typed fields (key -> signature) for a shard whose first row group holds `metas`."""
    sigs: dict[str, Any] = {}
    bad: set[str] = set()
    seen: Counter[str] = Counter()
    for md in metas:
        for k, v in md.items():
            if k in bad:
                continue
            seen[k] += 1
            s = signature(v)
            prev = sigs.get(k, s) if k in sigs else s
            merged = _merge(prev, s) if s is not None and prev is not None else None
            if merged is None:
                bad.add(k)
                sigs.pop(k, None)
            else:
                sigs[k] = merged
    if not sigs:
        return {}
    keep = sorted(sigs, key=lambda k: (-seen[k], k))[:MAX_TYPED_KEYS]
    return {k: sigs[k] for k in sorted(keep)}


def _fits(v: Any, sig: Any) -> bool:
    s = signature(v)
    return s is not None and (s == sig or _merge(s, sig) == sig)


class ParquetRecordWriter:
    """Writes records to a parquet file object in row groups of at most `row_group_size` records and about
    `row_group_bytes` of text and metadata (characters, counted before encoding), whichever comes first.

    The byte bound keeps long documents from making huge row groups: a row group is the unit readers split
    work by, and the writer holds one row group in memory.
    """

    def __init__(
        self,
        f: Any,
        path: str,
        *,
        row_group_size: int = 50_000,
        row_group_bytes: int = 64 << 20,
        compression: str = "zstd",
        compression_level: int | None = None,
    ) -> None:
        self._f, self.path = f, path
        self._compression, self._level = compression, compression_level
        self._writer: pq.ParquetWriter | None = None
        self._fields: dict[str, Any] = {}
        self._schema: pa.Schema | None = None
        self._rows: list[dict] = []
        self._first = 0
        self._row_group_size = row_group_size
        self._row_group_bytes = row_group_bytes
        self._bytes = 0
        self._json_keys: set[str] = set()

    def write(self, rec: dict, index: int) -> None:
        self._rows.append(rec)
        self._bytes += len(rec["text"]) + 16 * len(rec["metadata"])
        if len(self._rows) >= self._row_group_size or self._bytes >= self._row_group_bytes:
            self._flush()

    def _open(self) -> tuple[pq.ParquetWriter, pa.Schema]:
        self._fields = infer_fields([r["metadata"] for r in self._rows])
        cols = list(_BASE)
        if self._fields:
            cols.append(
                ("metadata", pa.struct([pa.field(k, arrow_type(s)) for k, s in self._fields.items()]))
            )
        cols.append(("metadata_json", pa.string()))
        schema = pa.schema(cols, metadata={RECORDS_KEY: b"2"})
        typed = [f"metadata.{k}" for k, s in self._fields.items() if not isinstance(s, tuple)]
        # Dictionary encoding and min/max statistics pay off for short repetitive columns (source, metadata
        # attributes), not for long unique texts, where they cost write time and buy nothing.
        writer = pq.ParquetWriter(
            self._f,
            schema,
            compression=self._compression,
            compression_level=self._level,
            use_dictionary=["source", *[k for k in typed if self._fields[k[9:]] == "str"]],
            write_statistics=["id", "source", *typed],
        )
        self._writer, self._schema = writer, schema
        return writer, schema

    def _opened(self) -> tuple[pq.ParquetWriter, pa.Schema]:
        """The writer and its schema, opening the file (schema from the rows buffered so far) on first use."""
        if self._writer is None or self._schema is None:
            return self._open()
        return self._writer, self._schema

    def _flush(self) -> None:
        writer, schema = self._opened()
        if not self._rows:
            return
        rows, self._rows, self._bytes = self._rows, [], 0
        typed: dict[str, list] = {k: [] for k in self._fields}
        overflow: list[str | None] = []
        for i, rec in enumerate(rows):
            rest = {}
            for k, v in rec["metadata"].items():
                sig = self._fields.get(k)
                if sig is not None and v is not None and _fits(v, sig):
                    typed[k].append(v)
                else:
                    rest[k] = v
            for k in self._fields:
                if len(typed[k]) <= i:
                    typed[k].append(None)
            if rest:
                self._json_keys.update(rest)
                try:
                    overflow.append(dumps_json(rest).decode())
                except TypeError as e:
                    raise ValueError(
                        f"{self.path}: record {self._first + i} (id={rec['id']!r}): metadata cannot be written "
                        f"as JSON ({e}); keep JSON values (str, int, float, bool, None, lists, dicts) in metadata"
                    ) from None
            else:
                overflow.append(None)
        arrays = [pa.array([r[c] for r in rows], pa.string()) for c in ("id", "text", "source")]
        if self._fields:
            children = [pa.array(typed[k], arrow_type(s)) for k, s in self._fields.items()]
            arrays.append(pa.StructArray.from_arrays(children, fields=list(schema.field("metadata").type)))
        arrays.append(pa.array(overflow, pa.string()))
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        writer.write_batch(batch, row_group_size=len(rows))
        self._first += len(rows)

    def close(self) -> None:
        self._flush()
        writer, _ = self._opened()
        if self._json_keys:
            writer.add_key_value_metadata({JSON_KEYS_KEY: dumps_json(sorted(self._json_keys))})
        writer.close()
