"""Reading ONE file of any supported format as records, with bad input named by file and line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Literal

import orjson

from . import storage
from ._compression import StreamError, iter_decompressed, split_compression
from ._errors import DataError, OnError, SkipLog, check_on_error, handle, record_error
from ._json import exact
from ._records import BadRecord, content_id, normalize

Format = Literal["jsonl", "json", "parquet", "arrow", "text"]
FORMATS: tuple[str, ...] = ("jsonl", "json", "parquet", "arrow", "text")

_TRUNCATED_FIX = "the file is incomplete (an interrupted write or copy); rewrite or re-download it"


def detect_format(path: str) -> tuple[str, str | None]:
    """The (format, compression) of a file from its name, e.g. `("jsonl", "zstd")` for `x.jsonl.zst`.

    Raises:
        ValueError: an unknown extension, naming the file and the fix.
    """
    base, comp = split_compression(os.path.basename(path.rstrip("/")))
    low = base.lower()
    if low.endswith((".jsonl", ".ndjson")):
        return "jsonl", comp
    if low.endswith(".json"):
        return "json", comp
    if low.endswith(".parquet") and comp is None:
        return "parquet", None
    if low.endswith(".arrow") and comp is None:
        return "arrow", None
    if low.endswith((".txt", ".text", ".md")):
        return "text", comp
    raise ValueError(
        f"{path}: cannot tell the format from the file name; name it *.jsonl[.gz|.zst], *.json, *.parquet, "
        f"*.arrow or *.txt, or pass format= (one of {', '.join(FORMATS)})"
    )


def file_stem(path: str) -> str:
    """`part-00001` for `.../part-00001.jsonl.zst`: the default `source` of rows that name none."""
    name = os.path.basename(path.rstrip("/"))
    name, _ = split_compression(name)
    return name.split(".", 1)[0] or name


TextMode = Literal["file", "lines"]
"""How a text file becomes records: `"file"` (one record per file) or `"lines"` (one per non-empty line)."""


def check_text_mode(text_mode: str) -> TextMode:
    """`text_mode`, checked to be one of the `TextMode` choices."""
    if text_mode == "file":
        return "file"
    if text_mode == "lines":
        return "lines"
    raise ValueError(f"text_mode must be 'file' or 'lines', got text_mode={text_mode!r}")


def read_records(
    path: str,
    *,
    text_field: str | None = "text",
    id_field: str = "id",
    on_error: OnError = "raise",
    source: str | None = None,
    format: str | None = None,
    compression: str | None = None,
    columns: list[str] | None = None,
    filter: Any = None,
    row_groups: list[int] | None = None,
    text_mode: TextMode = "file",
    skips: SkipLog | None = None,
) -> Iterator[dict]:
    """Yield the records of ONE file (jsonl/json plain, .gz or .zst; parquet; Arrow IPC; text), normalised.

    A file holding no records (a 0-byte `.jsonl`, a valid but empty `.gz`/`.zst` stream, a parquet file
    without rows) yields nothing; a compressed file that is not a complete stream (including a 0-byte
    `.gz`/`.zst`) is bad input. Integers of any size come back exact; Arrow types JSON has no value for are
    converted (timestamps to ISO text, ...) or rejected here, naming the file, column and row.

    Args:
        path: A local path or fsspec URL of one file.
        text_field: The field (or parquet column) holding the text; None: rows need no text (other content,
            such as chat `messages`): see `normalize`.
        id_field: The field holding the id; missing ids become `content_id(text, source)`.
        on_error: `"raise"` stops at the first bad record with a `DataError` naming file and line;
            `"skip"` counts it in `skips` (or the process-wide log) and goes on.
        source: The `source` of rows that carry none (default: the file's stem).
        format: Override the format detected from the file name.
        compression: With `format=`, the compression ('gzip', 'zstd' or None).
        columns: Parquet only: the columns to read (the text/id columns are always read).
        filter: Parquet only: a `pyarrow.compute.Expression` or DNF list like `[("lang", "==", "en")]`,
            pushed down to the reader (row groups whose statistics exclude it are not decoded).
        row_groups: Parquet only: read just these row groups (the split unit of parquet inputs).
        text_mode: Text files: `"file"` (one record per file) or `"lines"` (one per non-empty line).
        skips: Where skipped bad input is counted.

    Example:
        >>> for rec in read_records("data/part-00000-of-00002.jsonl.zst"):  # doctest: +SKIP
        ...     print(rec["id"], len(rec["text"]))
    """
    check_on_error(on_error)
    if storage.is_local(path) and os.path.isdir(storage.local_path(path)):
        raise IsADirectoryError(
            f"{path} is a folder; read_records reads one file: use read_shards({path!r}) or "
            f"loop over list_shards({path!r})"
        )
    if format is None:
        fmt, comp = detect_format(path)
    else:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got format={format!r}")
        fmt, comp = format, compression
    default_source = source if source is not None else file_stem(path)
    if fmt == "arrow":
        from ._arrow_files import read_arrow_records

        yield from read_arrow_records(path, text_field, id_field, default_source, on_error, skips)
    elif fmt == "parquet":
        from ._parquet import read_parquet_records

        yield from read_parquet_records(
            path, text_field=text_field, id_field=id_field, source=default_source, columns=columns,
            filter=filter, row_groups=row_groups, on_error=on_error, skips=skips,
        )  # fmt: skip
    elif fmt == "text":
        yield from _read_text(path, comp, default_source, text_mode, on_error, skips)
    else:
        yield from _read_json_lines(path, fmt, comp, text_field, id_field, default_source, on_error, skips)


def read_shards(path_or_glob: str, **kwargs: Any) -> Iterator[dict]:
    """Yield the records of every shard of a record folder (in manifest order), or of every file a glob
    matches (sorted); `kwargs` are those of `read_records`.

    Example:
        >>> n = sum(1 for _ in read_shards("out/docs"))  # doctest: +SKIP
    """
    from ._folders import list_shards

    for shard in list_shards(path_or_glob):
        yield from read_records(shard, **kwargs)


def _utf8_reason(line: bytes) -> str | None:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"invalid UTF-8 at byte {e.start} of the line ({e.reason})"
    return None


def _read_json_lines(
    path: str, fmt: str, comp: str | None, text_field: str | None, id_field: str, source: str, on_error: str,
    skips: SkipLog | None,
) -> Iterator[dict]:  # fmt: skip
    loads = orjson.loads
    decode_error = orjson.JSONDecodeError
    lineno = 0
    pending: list[bytes] = []  # the start of a line longer than the chunks read so far

    with storage.open_file(path, "rb") as f:
        chunks = iter_decompressed(f, comp)
        try:
            first = _without_bom(chunks)
            if fmt == "json" and first.lstrip()[:1] == b"[":
                yield from _read_json_array(
                    path, first, chunks, text_field, id_field, source, on_error, skips
                )
                return
            if fmt == "json" and _one_document(first):
                yield from _read_json_document(
                    path, first, chunks, text_field, id_field, source, on_error, skips
                )
                return
            for chunk in _chain(first, chunks):
                cut = chunk.rfind(b"\n")
                if cut < 0:
                    pending.append(chunk)
                    continue
                data = b"".join([*pending, chunk[: cut + 1]]) if pending else chunk[: cut + 1]
                pending = [chunk[cut + 1 :]] if cut + 1 < len(chunk) else []
                lines = data.split(b"\n")
                lines.pop()
                for line in lines:
                    lineno += 1
                    if not line or line.isspace():
                        continue
                    try:
                        obj = loads(line)
                        yield normalize(exact(obj, line), text_field, id_field, source)
                    except decode_error as e:
                        reason = _utf8_reason(line) or f"malformed JSON ({e})"
                        handle(record_error(path, reason, line=lineno), on_error, skips)
                    except BadRecord as e:
                        handle(record_error(path, str(e), line=lineno), on_error, skips)
        except StreamError as e:
            handle(
                DataError(  # "after line 0" said nothing: no line was read
                    path,
                    f"{e} after line {lineno}" if lineno else str(e),
                    line=lineno + 1,
                    fix=_TRUNCATED_FIX,
                ),
                on_error,
                skips,
            )
            return
    rest = b"".join(pending)
    if rest and not rest.isspace():
        lineno += 1
        try:
            yield normalize(exact(loads(rest), rest), text_field, id_field, source)
        except decode_error as e:
            reason = _utf8_reason(rest) or f"malformed JSON ({e})"
            handle(record_error(path, reason, line=lineno), on_error, skips)
        except BadRecord as e:
            handle(record_error(path, str(e), line=lineno), on_error, skips)


_BOM = b"\xef\xbb\xbf"


def _without_bom(chunks: Iterator[bytes]) -> bytes:
    """The first chunk of a stream (at least 3 bytes unless the stream is shorter), without the UTF-8 byte
    order mark some tools write at the start of a file: it is not data (Python's `utf-8-sig`, pyarrow's JSON
    reader)."""
    first = next(chunks, b"")
    while len(first) < len(_BOM) and _BOM.startswith(first):
        more = next(chunks, b"")
        if not more:
            break
        first += more
    return first[len(_BOM) :] if first.startswith(_BOM) else first


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest


def _one_document(first: bytes) -> bool:
    """Whether a `.json` stream starting with `first` is one (pretty-printed) JSON object rather than JSON
    lines: it opens with `{` and its first line is not a JSON value on its own."""
    head = first.lstrip()
    if head[:1] != b"{":
        return False
    nl = head.find(b"\n")
    if nl < 0:
        return False  # one long first line: JSON lines (or one object on one line, the same to read)
    try:
        orjson.loads(head[:nl])
    except orjson.JSONDecodeError:
        return True
    return False


def _read_json_document(
    path: str, first: bytes, chunks: Iterator[bytes], text_field: str | None, id_field: str, source: str,
    on_error: str, skips: SkipLog | None,
) -> Iterator[dict]:  # fmt: skip
    """A `.json` file holding one object (as `json.load` reads it): one record."""
    data = first + b"".join(chunks)
    try:
        obj = exact(orjson.loads(data), data)
    except orjson.JSONDecodeError as e:
        reason = _utf8_reason(data) or f"malformed JSON ({e.msg})"
        handle(record_error(path, reason, line=getattr(e, "lineno", None)), on_error, skips)
        return
    try:
        yield normalize(obj, text_field, id_field, source)
    except BadRecord as e:
        handle(record_error(path, f"the file's one JSON object: {e}"), on_error, skips)


def _read_json_array(
    path: str, first: bytes, chunks: Iterator[bytes], text_field: str | None, id_field: str, source: str,
    on_error: str, skips: SkipLog | None,
) -> Iterator[dict]:  # fmt: skip
    data = first + b"".join(chunks)
    try:
        rows = orjson.loads(data)
        rows = exact(rows, data)
    except orjson.JSONDecodeError as e:
        reason = _utf8_reason(data) or f"malformed JSON ({e.msg})"
        handle(DataError(path, reason, line=getattr(e, "lineno", None)), on_error, skips)
        return
    if not isinstance(rows, list):
        handle(
            DataError(path, f"expected a JSON array of records, got {type(rows).__name__}"), on_error, skips
        )
        return
    for i, row in enumerate(rows):
        try:
            yield normalize(row, text_field, id_field, source)
        except BadRecord as e:
            handle(record_error(path, f"array element {i}: {e}"), on_error, skips)


def _read_text(
    path: str, comp: str | None, source: str, text_mode: str, on_error: str, skips: SkipLog | None
) -> Iterator[dict]:
    check_text_mode(text_mode)
    name = os.path.basename(path.rstrip("/"))
    with storage.open_file(path, "rb") as f:
        try:
            chunks = iter_decompressed(f, comp)
            data = _without_bom(chunks) + b"".join(chunks)
        except StreamError as e:
            handle(DataError(path, str(e), line=None, fix=_TRUNCATED_FIX), on_error, skips)
            return
    if text_mode == "file":
        if not data:
            return  # an empty file holds no text, so no record
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            handle(record_error(path, f"invalid UTF-8 ({e.reason})", line=line), on_error, skips)
            return
        yield {
            "id": content_id(text, source, name),
            "text": text,
            "source": source,
            "metadata": {"file": name},
        }
        return
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        raw = raw.rstrip(b"\r")
        if not raw or raw.isspace():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            reason = f"invalid UTF-8 at byte {e.start} of the line ({e.reason})"
            handle(record_error(path, reason, line=lineno), on_error, skips)
            continue
        meta = {"file": name, "line": lineno}
        yield {
            "id": content_id(text, source, f"{name}:{lineno}"),
            "text": text,
            "source": source,
            "metadata": meta,
        }
