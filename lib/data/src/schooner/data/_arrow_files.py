"""Arrow IPC files (`.arrow`): what Hugging Face `save_to_disk` writes, read as records without `datasets`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

import pyarrow as pa
import pyarrow.ipc as ipc

from . import storage
from ._arrow_rows import arrow_value_rows
from ._errors import DataError, SkipLog, handle, record_error
from ._records import BadRecord, normalize

_FIX = "check that it is a complete Arrow IPC file (not a partial copy) and write it again"


def _batches(f: IO[Any]) -> Iterator[pa.RecordBatch]:
    """Record batches of an Arrow stream (what `datasets` writes) or an Arrow file (with a footer)."""
    head = f.read(6)
    f.seek(0)
    if head == b"ARROW1":
        reader = ipc.open_file(f)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
    else:
        yield from ipc.open_stream(f)


def read_arrow_records(
    path: str, text_field: str | None, id_field: str, source: str, on_error: str, skips: SkipLog | None
) -> Iterator[dict]:
    """Records of one Arrow IPC file, rows normalised like foreign parquet rows (see `read_records`)."""
    row = 0
    with storage.open_file(path, "rb") as f:
        try:
            batches = _batches(f)
            for batch in batches:
                if text_field is not None and text_field not in batch.schema.names:
                    raise DataError(
                        path, f"no column {text_field!r} (columns: {', '.join(batch.schema.names)})",
                        fix="pass text_field=... naming the text column",
                    )  # fmt: skip
                for rec in arrow_value_rows(batch, path, row):
                    try:
                        yield normalize(rec, text_field, id_field, source)
                    except BadRecord as e:
                        handle(record_error(path, str(e), row=row), on_error, skips)
                    row += 1
        except (pa.ArrowInvalid, OSError) as e:
            handle(
                DataError(path, f"not a readable Arrow IPC file ({e}) after row {row}", fix=_FIX),
                on_error,
                skips,
            )
