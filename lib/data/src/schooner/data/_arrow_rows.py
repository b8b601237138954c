"""Arrow tables (foreign parquet, Arrow IPC and Hugging Face files) as rows of JSON values.

Records hold JSON values only, so Arrow types JSON has no value for are converted when they are read,
and what cannot be converted fails there, naming the file, the column and the row (never later, at
write time, under the name of an output shard):

| Arrow type | record value |
|---|---|
| string, integers, floats, bool, null, list, struct | the same value |
| map | an object (string keys) or a list of `[key, value]` pairs |
| dictionary-encoded | the decoded value |
| timestamp | ISO 8601 text at the column's precision, e.g. `2024-01-02T03:04:05.123456` (`+0000` with a zone) |
| date, time | `2024-01-02`, `03:04:05.120000` |
| decimal | an int when the scale is 0 (any size), else its exact decimal text `"123.4500"` |
| binary, duration, interval, others | an error (`columns=` leaves such columns out) |
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pyarrow as pa

from ._errors import DataError

_UNSUPPORTED_FIX = (
    "leave the column out with columns=[...] naming the ones to read, or convert it to text first"
)


def _convert(arr: pa.Array | pa.ChunkedArray, path: str, column: str, where: dict) -> Any:
    """An Arrow array whose `to_pylist()` is JSON values, or a ready Python list."""
    import pyarrow.compute as pc  # only for the types it converts; importing it takes seconds

    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode() if isinstance(arr, pa.Array) else pa.chunked_array(
            [c.dictionary_decode() for c in arr.chunks], t.value_type)  # fmt: skip
        return _convert(arr, path, column, where)
    if pa.types.is_timestamp(t):
        return pc.strftime(arr, format="%Y-%m-%dT%H:%M:%S%z" if t.tz else "%Y-%m-%dT%H:%M:%S")
    if pa.types.is_date(t):
        return pc.strftime(arr, format="%Y-%m-%d")
    if pa.types.is_time(t):
        return pc.cast(arr, pa.string())
    if pa.types.is_decimal(t):
        if t.scale == 0:
            return [None if v is None else int(v) for v in arr.to_pylist()]
        return pc.cast(arr, pa.string())
    if _flat_unsupported(t):
        raise DataError(path, f"column {column!r} has type {t}, which a record cannot hold (records are JSON)",
                        fix=_UNSUPPORTED_FIX, **where)  # fmt: skip
    if pa.types.is_nested(t) and _has_special(t):
        return [_walk(v, path, column, where, i) for i, v in enumerate(arr.to_pylist())]
    return arr


def _flat_unsupported(t: pa.DataType) -> bool:
    return (
        pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
        or pa.types.is_duration(t) or pa.types.is_interval(t) or pa.types.is_union(t)
        or getattr(pa.types, "is_binary_view", lambda _: False)(t) or isinstance(t, pa.ExtensionType)
    )  # fmt: skip


def _has_special(t: pa.DataType) -> bool:
    """Whether a nested type holds, at any depth, a type `to_pylist` returns as a non-JSON Python value."""
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_special(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_special(t.value_type)
    return not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
                or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_null(t))  # fmt: skip


def _walk(v: Any, path: str, column: str, where: dict, row: int) -> Any:
    t = type(v)
    if v is None or t in (str, int, float, bool):
        return v
    if t is dict:
        return {k: _walk(x, path, column, where, row) for k, x in v.items()}
    if t is list:
        if v and all(type(x) is tuple and len(x) == 2 for x in v):  # a map: [(key, value), ...]
            if all(type(k) is str for k, _ in v):
                return {k: _walk(x, path, column, where, row) for k, x in v}
            return [[_walk(k, path, column, where, row), _walk(x, path, column, where, row)] for k, x in v]
        return [_walk(x, path, column, where, row) for x in v]
    if t is tuple:
        return [_walk(x, path, column, where, row) for x in v]
    if isinstance(v, datetime.datetime):
        return v.isoformat()
    if isinstance(v, datetime.date | datetime.time):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() and v.as_tuple().exponent == 0 else str(v)
    raise DataError(path, f"column {column!r} holds a {t.__name__} value, which a record cannot hold (records "
                    "are JSON)", fix=_UNSUPPORTED_FIX, row=row, **where)  # fmt: skip


def arrow_value_rows(
    table: pa.Table | pa.RecordBatch, path: str, row_offset: int = 0, row_group: int | None = None
) -> list[dict]:
    """The rows of `table` as dicts of JSON values (see the module docstring for the conversions).

    Raises:
        DataError: a column of a type records cannot hold, naming `path`, the column and the row group.
    """
    where = {} if row_group is None else {"row_group": row_group}
    names = table.schema.names
    columns = [_convert(table.column(i), path, names[i], where) for i in range(len(names))]
    if all(isinstance(c, pa.Array | pa.ChunkedArray) for c in columns):
        if isinstance(table, pa.RecordBatch):
            return pa.RecordBatch.from_arrays([c if isinstance(c, pa.Array) else c.combine_chunks()
                                               for c in columns], names=names).to_pylist()  # fmt: skip
        return pa.Table.from_arrays(columns, names=names).to_pylist()
    lists = [c if isinstance(c, list) else c.to_pylist() for c in columns]
    return [dict(zip(names, vals)) for vals in zip(*lists)]
