"""Parquet: column selection, row groups as split units, filters pushed down, and the record writer."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.parquet as pq

from . import _fs
from ._errors import DataError, SkipLog, handle, record_error
from ._json import dumps_json
from ._records import BadRecord, normalize

RECORDS_KEY = b"schooner.records"
"""Schema metadata key marking a parquet file written by schooner (its `metadata` column is JSON text)."""

RECORD_SCHEMA = pa.schema(
    [("id", pa.string()), ("text", pa.string()), ("source", pa.string()), ("metadata", pa.string())],
    metadata={RECORDS_KEY: b"1"},
)

_UNREADABLE_FIX = "check that it is a complete parquet file (not a partial copy) and rewrite it"


def as_expression(filter: Any) -> pds.Expression | None:
    """A pyarrow Expression from an Expression or a DNF filter list like `[("lang", "==", "en")]`."""
    if filter is None or isinstance(filter, pds.Expression):
        return filter
    try:
        return pq.filters_to_expression(filter)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"filter={filter!r} is not a pyarrow Expression or a DNF list such as [('lang', '==', 'en')]: {e}"
        ) from None


def _filesystem(path: str):
    from pyarrow.fs import FSSpecHandler, LocalFileSystem, PyFileSystem

    if _fs.is_local(path):
        return LocalFileSystem(), os.path.abspath(path.removeprefix("file://"))

    fs, p = _fs.url_to_fs(path)
    return PyFileSystem(FSSpecHandler(fs)), p


def _fragment(path: str, row_groups: list[int] | None = None) -> pds.ParquetFileFragment:
    pafs, p = _filesystem(path)
    frag = pds.ParquetFileFormat().make_fragment(p, filesystem=pafs, row_groups=row_groups)
    frag.ensure_complete_metadata()
    return frag


def open_fragment(path: str, row_groups: list[int] | None = None) -> pds.ParquetFileFragment:
    """The parquet fragment of `path`, or a `DataError` when it is not a readable parquet file."""
    try:
        return _fragment(path, row_groups)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise DataError(path, f"not a readable parquet file ({e})", fix=_UNREADABLE_FIX) from None


def row_groups(path: str, filter: Any = None) -> list[int]:
    """The row groups of `path` that may hold rows matching `filter` (by column statistics)."""
    frag = open_fragment(path)
    expr = as_expression(filter)
    if expr is None:
        return list(range(frag.num_row_groups))
    return [f.row_groups[0].id for f in frag.split_by_row_group(expr)]


def read_parquet_records(
    path: str,
    *,
    text_field: str,
    id_field: str,
    source: str,
    columns: list[str] | None,
    filter: Any,
    row_groups: list[int] | None,
    on_error: str,
    skips: SkipLog | None,
) -> Iterator[dict]:
    """Records of (some row groups of) one parquet file; see `read_records`."""
    try:
        frag = open_fragment(path)
    except DataError as e:
        handle(e, on_error, skips)
        return
    schema = frag.physical_schema
    names = schema.names
    if text_field not in names:
        err = DataError(
            path,
            f"no column {text_field!r} (columns: {', '.join(names)})",
            fix="pass text_field=... naming the text column",
        )
        handle(err, on_error, skips)
        return
    if not (
        pa.types.is_string(schema.field(text_field).type)
        or pa.types.is_large_string(schema.field(text_field).type)
    ):
        t = schema.field(text_field).type
        handle(DataError(path, f"column {text_field!r} has type {t}, expected string"), on_error, skips)
        return
    ours = (schema.metadata or {}).get(RECORDS_KEY) == b"1" and text_field == "text" and id_field == "id"
    read_cols = None
    if columns is not None:
        missing = [c for c in columns if c not in names]
        if missing:
            raise ValueError(f"{path}: columns {missing} not in the file (columns: {', '.join(names)})")
        keep = {text_field, id_field, "source", "metadata"}
        read_cols = [c for c in names if c in set(columns) or c in keep]
    expr = as_expression(filter)
    groups = row_groups if row_groups is not None else list(range(frag.num_row_groups))
    for rg in groups:
        if not 0 <= rg < frag.num_row_groups:
            raise ValueError(f"{path}: row group {rg} out of range (the file has {frag.num_row_groups})")
        try:
            # One thread: the pipeline runs one task per CPU it reserved, and parallelism comes from splits.
            table = _fragment(path, [rg]).to_table(columns=read_cols, filter=expr, use_threads=False)
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
            handle(DataError(path, f"cannot read ({e})", row_group=rg, fix=_UNREADABLE_FIX), on_error, skips)
            continue
        if ours:
            yield from _our_rows(path, rg, table, on_error, skips)
        else:
            yield from _generic_rows(path, rg, table, text_field, id_field, source, on_error, skips)


def _our_rows(path: str, rg: int, table: pa.Table, on_error: str, skips: SkipLog | None) -> Iterator[dict]:
    cols = [table.column(c).to_pylist() for c in ("id", "text", "source", "metadata")]
    loads = orjson.loads
    for i, (rid, text, src, meta) in enumerate(zip(*cols)):
        if text is None or rid is None or src is None:
            which = "text" if text is None else "id" if rid is None else "source"
            handle(record_error(path, f"{which} is null", row_group=rg, row=i), on_error, skips)
            continue
        try:
            md = loads(meta) if meta else {}
        except orjson.JSONDecodeError as e:
            handle(record_error(path, f"metadata is not JSON ({e})", row_group=rg, row=i), on_error, skips)
            continue
        yield {"id": rid, "text": text, "source": src, "metadata": md}


def _generic_rows(
    path: str, rg: int, table: pa.Table, text_field: str, id_field: str, source: str, on_error: str,
    skips: SkipLog | None,
) -> Iterator[dict]:  # fmt: skip
    for i, row in enumerate(table.to_pylist()):
        try:
            yield normalize(row, text_field, id_field, source)
        except BadRecord as e:
            handle(record_error(path, str(e), row_group=rg, row=i), on_error, skips)


class ParquetRecordWriter:
    """Writes records to a parquet file object in row groups of at most `row_group_size` records and about
    `row_group_bytes` of text and metadata (characters, counted before encoding), whichever comes first.

    The byte bound keeps long documents from making huge row groups: a row group is the unit readers split
    work by, and the writer holds one row group in memory.
    """

    def __init__(
        self,
        f: Any,
        *,
        row_group_size: int = 50_000,
        row_group_bytes: int = 64 << 20,
        compression: str = "zstd",
        compression_level: int | None = None,
    ) -> None:
        # Dictionary encoding and min/max statistics only pay off for the short repetitive columns; on
        # long unique texts they cost write time and buy nothing.
        self._writer = pq.ParquetWriter(
            f,
            RECORD_SCHEMA,
            compression=compression,
            compression_level=compression_level,
            use_dictionary=["source"],
            write_statistics=["id", "source"],
        )
        self._rows: list[list[Any]] = [[], [], [], []]
        self._row_group_size = row_group_size
        self._row_group_bytes = row_group_bytes
        self._bytes = 0

    def write(self, rec: dict) -> None:
        ids, texts, sources, metas = self._rows
        ids.append(rec["id"])
        texts.append(rec["text"])
        sources.append(rec["source"])
        meta = dumps_json(rec["metadata"]).decode() if rec["metadata"] else ""
        metas.append(meta)
        self._bytes += len(rec["text"]) + len(meta)
        if len(ids) >= self._row_group_size or self._bytes >= self._row_group_bytes:
            self._flush()

    def _flush(self) -> None:
        if self._rows[0]:
            batch = pa.RecordBatch.from_arrays(
                [pa.array(c, pa.string()) for c in self._rows], schema=RECORD_SCHEMA
            )
            self._writer.write_batch(batch, row_group_size=len(self._rows[0]))
            self._rows = [[], [], [], []]
            self._bytes = 0

    def close(self) -> None:
        self._flush()
        self._writer.close()
