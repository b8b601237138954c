"""Parquet: column selection, row groups as split units, filters pushed down, and the record reader.

Shards schooner writes (see `_parquet_write`) store `metadata` as a typed struct column plus a JSON column
for what does not fit it; filters may name metadata fields (`("metadata.lang", "==", "en")` or
`pc.field("metadata", "lang")`), and a field a shard does not have reads as null there. Other parquet files
are read row by row, their columns normalised into records (`_arrow_rows` converts Arrow types).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pds

from . import storage
from ._arrow_rows import arrow_value_rows
from ._errors import DataError, SkipLog, handle, record_error
from ._json import loads_json
from ._records import BadRecord, normalize

RECORDS_KEY = b"schooner.records"
"""Schema metadata key marking a parquet file written by schooner: `1` (metadata as JSON text) or `2`
(metadata as a typed struct column plus `metadata_json`)."""
JSON_KEYS_KEY = b"schooner.metadata_json_keys"
"""File metadata of version-2 shards: the metadata keys some record of the file holds in `metadata_json`."""

_UNREADABLE_FIX = "check that it is a complete parquet file (not a partial copy) and rewrite it"
_OPS = {
    "=": "__eq__",
    "==": "__eq__",
    "!=": "__ne__",
    "<": "__lt__",
    ">": "__gt__",
    "<=": "__le__",
    ">=": "__ge__",
}
_FIELD_NAME = re.compile(r"FieldRef\.Name\(([^()]*)\)")
_METADATA_REF = re.compile(r"FieldRef\.Nested\(FieldRef\.Name\(metadata\) FieldRef\.Name\(([^()]*)\)")


def as_expression(filter: Any, names: list[str] | None = None) -> pds.Expression | None:
    """A pyarrow Expression from an Expression or a DNF filter: `[("lang", "==", "en")]` (AND) or a list
    of such lists (OR). A dotted name (`"metadata.lang"`) that is not a column names a nested field."""
    if filter is None or isinstance(filter, pds.Expression):
        return filter
    try:
        clauses = filter if filter and isinstance(filter[0], list) else [filter]
        ors = [_and(clause, names) for clause in clauses]
    except (TypeError, ValueError, IndexError, KeyError) as e:
        raise ValueError(
            f"filter={filter!r} is not a pyarrow Expression or a DNF list such as [('lang', '==', 'en')]: {e}"
        ) from None
    out = ors[0]
    for alternative in ors[1:]:
        out = out | alternative
    return out


def _and(clause: list, names: list[str] | None) -> pds.Expression:
    import pyarrow.compute as pc  # not at import time: it takes seconds to build its functions

    out = None
    for col, op, value in clause:
        ref = (
            pc.field(*col.split(".")) if "." in col and (names is None or col not in names) else pc.field(col)
        )
        if op in _OPS:
            e = getattr(ref, _OPS[op])(value)
        elif op in ("in", "not in"):
            e = ref.isin(list(value))
            e = ~e if op == "not in" else e
        else:
            raise ValueError(f"unknown operator {op!r} (use one of {sorted(_OPS)}, 'in', 'not in')")
        out = e if out is None else out & e
    if out is None:
        raise ValueError("an empty clause")
    return out


def _filesystem(path: str) -> tuple[Any, str]:
    """(the pyarrow FileSystem that holds `path`, the path within it)."""
    from pyarrow.fs import FSSpecHandler, LocalFileSystem, PyFileSystem

    if storage.is_local(path):
        return LocalFileSystem(), os.path.abspath(storage.local_path(path))
    fs, p = storage.url_to_fs(path)
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


def records_version(schema: pa.Schema) -> int:
    """0 for foreign files, else the version of schooner's record layout the file was written with."""
    v = (schema.metadata or {}).get(RECORDS_KEY)
    return int(v) if v in (b"1", b"2") else 0


def _json_keys(frag: pds.ParquetFileFragment) -> set[str]:
    raw = (frag.metadata.metadata or {}).get(JSON_KEYS_KEY)
    return set(loads_json(raw)) if raw else set()


def _check_filter_keys(path: str, frag: pds.ParquetFileFragment, expr: pds.Expression | None) -> None:
    if expr is None or records_version(frag.physical_schema) != 2:
        return
    hidden = sorted(set(_METADATA_REF.findall(str(expr))) & _json_keys(frag))
    if hidden:
        raise DataError(
            path,
            f"filter {expr} names metadata {hidden}, but some records of this shard hold values of another type "
            "under those keys (kept in its metadata_json column), which a pushed-down filter cannot see",
            fix="read without filter= and select records with Dataset.filter(...) instead",
        )


def _missing_field(path: str, frag: pds.ParquetFileFragment, err: Exception) -> list[str]:
    """The field path of a 'No match for FieldRef' error, or a DataError naming it."""
    msg = str(err)
    head = msg.split(" in ", 1)[0]
    parts = _FIELD_NAME.findall(head) if "No match for FieldRef" in msg else []
    if not parts:
        raise DataError(
            path, f"cannot apply the filter ({msg.splitlines()[0]})", fix="check the filter"
        ) from None
    ours = records_version(frag.physical_schema) == 2
    if ours and len(parts) == 2 and parts[0] == "metadata":
        return parts
    names = ", ".join(frag.physical_schema.names)
    raise DataError(
        path,
        f"the filter names column {'.'.join(parts)!r}, which this file does not have (columns: {names})",
        fix="name an existing column in filter=, or leave filter= out for files without it",
    ) from None


def _extend(schema: pa.Schema, key: str) -> pa.Schema:
    """`schema` with a null-typed `metadata.key`: a field a shard does not have reads as null."""
    i = schema.get_field_index("metadata")
    if i < 0:
        return schema.append(pa.field("metadata", pa.struct([pa.field(key, pa.null())])))
    struct = schema.field(i).type
    fields = [struct.field(j) for j in range(struct.num_fields)] + [pa.field(key, pa.null())]
    return schema.set(i, pa.field("metadata", pa.struct(fields)))


def _with_schema(path: str, frag: pds.ParquetFileFragment, run: Callable[[pa.Schema], Any]) -> Any:
    """`run(schema)`, widening the schema with each metadata field the filter names but the file lacks."""
    schema = frag.physical_schema
    for _ in range(64):
        try:
            return run(schema)
        except pa.ArrowInvalid as e:
            if "No match for FieldRef" not in str(e):
                raise
            schema = _extend(schema, _missing_field(path, frag, e)[1])
    raise DataError(path, "the filter names too many fields this file does not have")


def row_groups(path: str, filter: Any = None) -> list[int]:
    """The row groups of `path` that may hold rows matching `filter` (by column statistics)."""
    frag = open_fragment(path)
    expr = as_expression(filter, frag.physical_schema.names)
    if expr is None:
        return list(range(frag.num_row_groups))
    _check_filter_keys(path, frag, expr)
    split = _with_schema(path, frag, lambda s: frag.split_by_row_group(expr, schema=s))
    return [f.row_groups[0].id for f in split]


def _is_text_type(t: pa.DataType) -> bool:
    """Whether a column of type `t` holds text: string, large_string, string_view, or a dictionary of them
    (what pandas writes for a categorical column)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def read_parquet_records(
    path: str,
    *,
    text_field: str | None,
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
    if text_field is not None and text_field not in names:
        err = DataError(
            path,
            f"no column {text_field!r} (columns: {', '.join(names)})",
            fix="pass text_field=... naming the text column",
        )
        handle(err, on_error, skips)
        return
    t = schema.field(text_field).type if text_field is not None else None
    if t is not None and not _is_text_type(t):
        handle(DataError(path, f"column {text_field!r} has type {t}, expected string"), on_error, skips)
        return
    # our own layout always holds its text: read fast however text_field says the text is optional
    version = records_version(schema) if (text_field or "text", id_field) == ("text", "id") else 0
    read_cols = None
    if columns is not None:
        missing = [c for c in columns if c not in names]
        if missing:
            raise ValueError(f"{path}: columns {missing} not in the file (columns: {', '.join(names)})")
        keep = {text_field or "text", id_field, "source", "metadata", "metadata_json"}
        read_cols = [c for c in names if c in set(columns) or c in keep]
    expr = as_expression(filter, names)
    _check_filter_keys(path, frag, expr)
    groups = row_groups if row_groups is not None else list(range(frag.num_row_groups))
    for rg in groups:
        if not 0 <= rg < frag.num_row_groups:
            raise ValueError(f"{path}: row group {rg} out of range (the file has {frag.num_row_groups})")
        try:
            piece = _fragment(path, [rg])
            table = _with_schema(path, frag, functools.partial(_read_piece, piece, read_cols, expr))
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
            handle(DataError(path, f"cannot read ({e})", row_group=rg, fix=_UNREADABLE_FIX), on_error, skips)
            continue
        if version:
            yield from _our_rows(path, rg, table, version, on_error, skips)
        else:
            yield from _generic_rows(path, rg, table, text_field, id_field, source, on_error, skips)


def _read_piece(
    piece: pds.ParquetFileFragment, columns: list[str] | None, expr: Any, schema: pa.Schema
) -> Any:
    """A fragment's table with `schema`, read on one thread: the pipeline runs one task per CPU it reserved,
    and parallelism comes from splits."""
    return piece.to_table(schema=schema, columns=columns, filter=expr, use_threads=False)


def _our_rows(
    path: str, rg: int, table: pa.Table, version: int, on_error: str, skips: SkipLog | None
) -> Iterator[dict]:
    ids, texts, sources = (table.column(c).to_pylist() for c in ("id", "text", "source"))
    n = len(ids)
    names = table.schema.names
    typed = table.column("metadata").to_pylist() if version == 2 and "metadata" in names else [None] * n
    js_col = "metadata_json" if version == 2 else "metadata"
    js = table.column(js_col).to_pylist() if js_col in names else [None] * n
    for i in range(n):
        rid, text, src = ids[i], texts[i], sources[i]
        if text is None or rid is None or src is None:
            which = "text" if text is None else "id" if rid is None else "source"
            handle(record_error(path, f"{which} is null", row_group=rg, row=i), on_error, skips)
            continue
        t = typed[i]
        md = {k: v for k, v in t.items() if v is not None} if t else {}
        if raw := js[i]:
            try:
                md.update(loads_json(raw))
            except ValueError as e:
                handle(
                    record_error(path, f"{js_col} is not JSON ({e})", row_group=rg, row=i), on_error, skips
                )
                continue
        yield {"id": rid, "text": text, "source": src, "metadata": md}


def _generic_rows(
    path: str, rg: int, table: pa.Table, text_field: str | None, id_field: str, source: str, on_error: str,
    skips: SkipLog | None,
) -> Iterator[dict]:  # fmt: skip
    # A column records cannot hold is a schema problem, not a bad record: it raises whatever on_error says.
    for i, row in enumerate(arrow_value_rows(table, path, row_group=rg)):
        try:
            yield normalize(row, text_field, id_field, source)
        except BadRecord as e:
            handle(record_error(path, str(e), row_group=rg, row=i), on_error, skips)
