"""Sharded record folders: atomic shard writers, per-shard stats, the manifest, and resumable writes."""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import zstandard

from . import _fs
from ._errors import SkipLog
from ._json import dumps_line
from ._records import check_record

WRITE_FORMATS: tuple[str, ...] = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet")
"""Formats of written shards (the shard file's extension)."""

_BUFFER = 1 << 20


def check_write_format(format: str) -> None:
    if format not in WRITE_FORMATS:
        raise ValueError(f"format must be one of {WRITE_FORMATS}, got format={format!r}")


def shard_name(index: int, num_shards: int, format: str) -> str:
    """`part-00003-of-00016.jsonl.zst`."""
    check_write_format(format)
    if not 0 <= index < num_shards:
        raise ValueError(f"shard index {index} out of range for num_shards={num_shards}")
    return f"part-{index:05d}-of-{num_shards:05d}.{format}"


class ShardWriter:
    """Writes one shard file atomically: a hidden temp file renamed into place by `close()`.

    Use as a context manager; an exception inside the block removes the temp file and no file appears
    under the final name.

    Example:
        >>> with ShardWriter("out/part-00000-of-00001.jsonl.zst") as w:  # doctest: +SKIP
        ...     w.write({"id": "a", "text": "hi", "source": "s", "metadata": {}})
    """

    def __init__(
        self,
        path: str,
        format: str | None = None,
        *,
        zstd_level: int = 3,
        row_group_size: int = 50_000,
        row_group_bytes: int = 64 << 20,
    ):
        if format is None:
            format = next(
                (f for f in sorted(WRITE_FORMATS, key=len, reverse=True) if path.endswith("." + f)), ""
            )
        check_write_format(format)
        self.path = path
        self.format = format
        self.records = 0
        self.bytes = 0
        self._zstd_level = zstd_level
        self._row_group_size = row_group_size
        self._row_group_bytes = row_group_bytes
        self._cm: Any = None
        self._closed = False

    def __enter__(self) -> ShardWriter:
        self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort(exc_type, exc, tb)

    def open(self) -> None:
        self._cm = _fs.atomic_open(self.path)
        self._raw = self._cm.__enter__()
        self._buf: list[bytes] = []
        self._buf_bytes = 0
        self._parquet = None
        if self.format == "jsonl.zst":
            self._sink = zstandard.ZstdCompressor(level=self._zstd_level).stream_writer(
                self._raw, closefd=False
            )
        elif self.format == "jsonl.gz":
            self._sink = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0)
        elif self.format == "jsonl":
            self._sink = self._raw
        else:
            from ._parquet import ParquetRecordWriter

            self._parquet = ParquetRecordWriter(
                self._raw,
                row_group_size=self._row_group_size,
                row_group_bytes=self._row_group_bytes,
                compression_level=self._zstd_level,
            )

    def write(self, rec: dict) -> None:
        """Append one record (a dict; parquet needs exactly the record layout)."""
        if self._parquet is not None:
            problem = check_record(rec)
            if problem:
                raise ValueError(f"{self.path}: record {self.records}: {problem}")
            self._parquet.write(rec)
        else:
            if type(rec) is not dict:
                raise ValueError(
                    f"{self.path}: record {self.records}: expected a dict, got {type(rec).__name__}"
                )
            try:
                line = dumps_line(rec)
            except TypeError as e:
                raise ValueError(f"{self.path}: record {self.records} (id={rec.get('id')!r}): {e}") from None
            self._buf.append(line)
            self._buf_bytes += len(line)
            if self._buf_bytes >= _BUFFER:
                self._flush()
        self.records += 1

    def write_many(self, recs: Iterable[dict]) -> None:
        for r in recs:
            self.write(r)

    def _flush(self) -> None:
        if self._buf:
            self._sink.write(b"".join(self._buf))
            self._buf = []
            self._buf_bytes = 0

    def close(self) -> None:
        """Finish the file and rename it into place."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._parquet is not None:
                self._parquet.close()
            else:
                if self.format == "jsonl" and self.records == 0:
                    # A 0-byte file is bad input for readers; an empty shard holds one blank line.
                    self._buf.append(b"\n")
                self._flush()
                if self._sink is not self._raw:
                    if isinstance(self._sink, zstandard.ZstdCompressionWriter):
                        self._sink.flush(zstandard.FLUSH_FRAME)
                    self._sink.close()
            self.bytes = self._raw.tell()
        except BaseException as e:
            self._cm.__exit__(type(e), e, e.__traceback__)
            raise
        self._cm.__exit__(None, None, None)

    def abort(self, exc_type=None, exc=None, tb=None) -> None:
        """Drop the temp file; nothing appears under the final name."""
        if self._closed:
            return
        self._closed = True
        if exc is None:
            exc_type, exc = RuntimeError, RuntimeError("shard write aborted")
        # Close the encoders before the temp file, so none of them writes to a closed file later.
        with contextlib.suppress(Exception):
            if self._parquet is not None:
                self._parquet.close()
            elif self._sink is not self._raw:
                self._sink.close()
        with contextlib.suppress(BaseException):
            self._cm.__exit__(exc_type, exc, tb)


# ---------------------------------------------------------------------------------------------- stats


def _stats_path(folder: str, name: str) -> str:
    return _fs.join(folder, _fs.STATS_DIR, name + ".json")


def write_shard_stats(folder: str, name: str, stats: Mapping[str, Any]) -> None:
    """Record a finished shard's statistics; written right after the shard is renamed into place."""
    from ._json import dumps_json

    _fs.write_bytes_atomic(_stats_path(folder, name), dumps_json(dict(stats)))


def finished_shard(folder: str, name: str) -> dict | None:
    """The stats of shard `name` in `folder` when both the shard and its stats exist, else None."""
    path = _fs.join(folder, name)
    stats_path = _stats_path(folder, name)
    if not (_fs.exists(path) and _fs.exists(stats_path)):
        return None
    return _fs.read_json(stats_path)


def merge_counters(into: dict[str, int], other: Mapping[str, int]) -> dict[str, int]:
    for k, v in other.items():
        into[k] = into.get(k, 0) + int(v)
    return into


def write_manifest(
    folder: str,
    names: Sequence[str],
    format: str,
    extra: Mapping[str, Any] | None = None,
    *,
    counters: Mapping[str, int] | None = None,
    errors: SkipLog | None = None,
) -> dict:
    """Write `manifest.json` (last, atomically) from the shards' stats; returns the manifest.

    Layout: `{"format", "shards": [{"path", "records", "bytes"}], "records", "bytes", "counters",
    "errors": {"skipped", "examples"}}` plus `extra`. No timestamps: equal inputs give equal manifests.
    `counters`/`errors` of earlier pipeline stages are added to the shards' own.
    """
    from ._json import dumps_json

    shards: list[dict] = []
    counters = merge_counters({}, counters or {})
    errors = _copy_log(errors)
    for name in names:
        st = _fs.read_json(_stats_path(folder, name))
        shards.append({"path": name, "records": st["records"], "bytes": st["bytes"]})
        merge_counters(counters, st.get("counters", {}))
        errors.merge(st.get("errors", {}))
    manifest = {
        "format": format,
        "num_shards": len(names),
        "records": sum(s["records"] for s in shards),
        "bytes": sum(s["bytes"] for s in shards),
        "shards": shards,
        "counters": dict(sorted(counters.items())),
        "errors": errors.to_dict(),
        **(dict(extra) if extra else {}),
    }
    _fs.write_bytes_atomic(_fs.join(folder, _fs.MANIFEST), dumps_json(manifest) + b"\n")
    _fs.remove_temp_files(folder)
    return manifest


def _copy_log(log: SkipLog | None) -> SkipLog:
    out = SkipLog()
    if log is not None:
        out.merge(log)
    return out


def read_manifest(folder: str) -> dict | None:
    """The manifest of a finished record folder, or None when there is none (unfinished or foreign)."""
    path = _fs.join(folder, _fs.MANIFEST)
    return _fs.read_json(path) if _fs.exists(path) else None


def start_write(folder: str, *, skip_existing: bool) -> None:
    """Prepare `folder`: a fresh write removes an old manifest first, so a half-rewritten folder never
    looks finished."""
    _fs.makedirs(folder)
    if not skip_existing:
        path = _fs.join(folder, _fs.MANIFEST)
        if _fs.exists(path):
            fs, p = _fs.url_to_fs(path)
            fs.rm(p)


def write_shard(
    folder: str, name: str, records: Iterable[dict], *, counters: Mapping[str, int] | None = None,
    errors: SkipLog | None = None, **writer_kw: Any,
) -> dict:  # fmt: skip
    """Write one shard of `folder` atomically, then its stats; returns the stats."""
    format = next(f for f in sorted(WRITE_FORMATS, key=len, reverse=True) if name.endswith("." + f))
    w = ShardWriter(_fs.join(folder, name), format, **writer_kw)
    w.open()
    try:
        w.write_many(records)
    except BaseException as e:
        w.abort(type(e), e, e.__traceback__)
        raise
    # The shard is renamed into place first and its stats second: a crash between the two leaves a
    # shard without stats, which `finished_shard` treats as unfinished, so a resumed write redoes it.
    w.close()
    stats = {
        "records": w.records,
        "bytes": w.bytes,
        "counters": dict(counters or {}),
        "errors": (errors or SkipLog()).to_dict(),
    }
    write_shard_stats(folder, name, stats)
    return stats


def write_records(
    records: Iterable[dict],
    path: str,
    *,
    format: str = "jsonl.zst",
    num_shards: int = 1,
    skip_existing: bool = False,
    counters: Mapping[str, int] | None = None,
    extra_manifest: Mapping[str, Any] | None = None,
) -> dict:
    """Write records as a record folder of `num_shards` contiguous shards plus `manifest.json`.

    Args:
        records: Records (a sequence, or any iterable, which is materialised when `num_shards > 1`).
        path: The output folder (local or fsspec URL).
        format: One of `WRITE_FORMATS`.
        num_shards: How many shards to split the records into (contiguously, in order).
        skip_existing: Keep shards already finished by an interrupted earlier write of the same data.
        counters: Counters to put in the manifest.
        extra_manifest: More manifest fields.

    Returns:
        The manifest (also written to `path/manifest.json`).

    Example:
        >>> write_records([make_record("hi", source="s")], "/tmp/out", format="jsonl.zst")["records"]  # doctest: +SKIP
        1
    """
    check_write_format(format)
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards must be an integer >= 1, got num_shards={num_shards!r}")
    start_write(path, skip_existing=skip_existing)
    if num_shards > 1 and not isinstance(records, Sequence):
        records = list(records)
    names = [shard_name(i, num_shards, format) for i in range(num_shards)]
    for i, name in enumerate(names):
        if skip_existing and finished_shard(path, name) is not None:
            continue
        if num_shards == 1:
            part: Iterable[dict] = records
        else:
            n = len(records)  # type: ignore[arg-type]
            part = records[i * n // num_shards : (i + 1) * n // num_shards]  # type: ignore[index]
        write_shard(path, name, part, counters=counters if i == 0 else None)
    return write_manifest(path, names, format, extra_manifest)
