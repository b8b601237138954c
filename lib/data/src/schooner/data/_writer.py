"""Sharded record folders: atomic shard writers, per-shard stats, the manifest, and resumable writes."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import IO, Any, Protocol

import zstandard

from . import storage
from ._errors import SkipLog
from ._fingerprint import fingerprint, records_digest
from ._folders import MANIFEST, STATS_DIR, finish_folder
from ._json import dumps_json, dumps_line
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


class _ByteSink(Protocol):
    """Where a JSONL shard's bytes go: the file itself, or a gzip/zstd encoder in front of it."""

    def write(self, data: bytes, /) -> int: ...

    def close(self) -> None: ...


class _HashingFile:
    """A write-only file that keeps the sha256 and size of everything written through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        self.sha.update(data)
        self.size += len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        return self.raw.write(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False


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
        self.sha256 = ""
        self._zstd_level = zstd_level
        self._row_group_size = row_group_size
        self._row_group_bytes = row_group_bytes
        self._cm: Any = None
        self._closed = False

    def __enter__(self) -> ShardWriter:
        self.open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort(exc_type, exc, tb)

    def open(self) -> None:
        self._cm = storage.atomic_open(self.path)
        self._raw = _HashingFile(self._cm.__enter__())
        self._buf: list[bytes] = []
        self._buf_bytes = 0
        self._parquet = None
        self._sink: _ByteSink
        if self.format == "jsonl.zst":
            self._sink = zstandard.ZstdCompressor(level=self._zstd_level).stream_writer(
                self._raw,  # type: ignore[arg-type]  # the stub asks for IO[bytes]; it calls write/flush only
                closefd=False,
            )
        elif self.format == "jsonl.gz":
            self._sink = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0)
        elif self.format == "jsonl":
            self._sink = self._raw
        else:
            from ._parquet_write import ParquetRecordWriter

            self._parquet = ParquetRecordWriter(
                self._raw,
                self.path,
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
            self._parquet.write(rec, self.records)
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
            self.bytes = self._raw.size
            self.sha256 = self._raw.sha.hexdigest()
        except BaseException as e:
            self._cm.__exit__(type(e), e, e.__traceback__)
            raise
        self._cm.__exit__(None, None, None)

    def abort(
        self,
        exc_type: type[BaseException] | None = None,
        exc: BaseException | None = None,
        tb: TracebackType | None = None,
    ) -> None:
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
    return storage.join(folder, STATS_DIR, name + ".json")


def write_shard_stats(folder: str, name: str, stats: Mapping[str, Any]) -> None:
    """Record a finished shard's statistics; written right after the shard is renamed into place."""
    storage.write_bytes(_stats_path(folder, name), dumps_json(dict(stats)))


def finished_shard(folder: str, name: str, plan: str | None) -> dict | None:
    """The stats of shard `name` in `folder` when the shard is finished AND was written by `plan` (the
    fingerprint of what produced it), else None: a shard of another plan is rewritten, never reused, and
    nothing is reused when the plan has no fingerprint."""
    if plan is None:
        return None
    path = storage.join(folder, name)
    stats_path = _stats_path(folder, name)
    if not (storage.exists(path) and storage.exists(stats_path)):
        return None
    try:
        stats = storage.read_json(stats_path)
    except ValueError:
        return None
    if stats.get("plan") != plan or storage.file_size(path) != stats.get("bytes"):
        return None
    return stats


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
    """Write `manifest.json` (last, atomically) from the shards' stats; returns the manifest. Afterwards the
    folder holds only what the manifest lists: older shards, temp files and work folders are removed.

    Layout: `{"format", "num_shards", "records", "bytes", "shards": [{"path", "records", "bytes",
    "sha256"}], "counters", "errors": {"skipped", "examples"}}` plus `extra`. No timestamps: equal inputs
    give equal manifests. `counters`/`errors` of earlier pipeline stages are added to the shards' own.
    """
    shards: list[dict] = []
    counters = merge_counters({}, counters or {})
    errors = _copy_log(errors)
    for name in names:
        st = storage.read_json(_stats_path(folder, name))
        shards.append(
            {"path": name, "records": st["records"], "bytes": st["bytes"], "sha256": st.get("sha256")}
        )
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
    storage.write_bytes(storage.join(folder, MANIFEST), dumps_json(manifest) + b"\n")
    finish_folder(folder, list(names))
    return manifest


def _copy_log(log: SkipLog | None) -> SkipLog:
    out = SkipLog()
    if log is not None:
        out.merge(log)
    return out


def read_manifest(folder: str) -> dict | None:
    """The manifest of a finished record folder, or None when there is none (unfinished or foreign)."""
    path = storage.join(folder, MANIFEST)
    return storage.read_json(path) if storage.exists(path) else None


def start_write(folder: str, *, skip_existing: bool) -> None:
    """Prepare `folder`: the old manifest goes first, so a half-rewritten folder never looks finished
    (finished shards stay for `skip_existing` to reuse when their plan matches)."""
    storage.makedirs(folder)
    storage.remove(storage.join(folder, MANIFEST))


def write_shard(
    folder: str, name: str, records: Iterable[dict], *, counters: Mapping[str, int] | None = None,
    errors: SkipLog | None = None, plan: str | None = None, **writer_kw: Any,
) -> dict:  # fmt: skip
    """Write one shard of `folder` atomically, then its stats (with `plan`, the fingerprint of what wrote
    it, and the file's sha256); returns the stats."""
    format = next(f for f in sorted(WRITE_FORMATS, key=len, reverse=True) if name.endswith("." + f))
    w = ShardWriter(storage.join(folder, name), format, **writer_kw)
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
        "sha256": w.sha256,
        "plan": plan,
        "counters": dict(counters or {}),
        "errors": (errors or SkipLog()).to_dict(),
    }
    write_shard_stats(folder, name, stats)
    return stats


def plan_shards(
    num_shards: int | None,
    shard_bytes: int | None,
    sizes: Sequence[int],
    *,
    max_shard_bytes: int | None = None,
) -> int:
    """How many output shards: `num_shards`, or enough that each holds about `shard_bytes` of the items'
    `sizes` (at least one), or one per input when neither is given (`sizes` then has one entry per input),
    and with `max_shard_bytes` (`sizes` one entry per input) at least one per input and more where they
    hold more than `max_shard_bytes` in all.

    Raises:
        ValueError: both or invalid values given.
    """
    if num_shards is not None and shard_bytes is not None:
        raise ValueError(f"pass num_shards or shard_bytes, not both (got {num_shards=}, {shard_bytes=})")
    for name, v in (("num_shards", num_shards), ("shard_bytes", shard_bytes)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {name}={v!r}")
    if num_shards is not None:
        return num_shards
    if shard_bytes is not None:
        return max(1, math.ceil(sum(sizes) / shard_bytes))
    if max_shard_bytes is not None:
        return max(1, len(sizes), math.ceil(sum(sizes) / max_shard_bytes))
    return max(1, len(sizes))


def write_records(
    records: Iterable[dict],
    path: str,
    *,
    format: str = "jsonl.zst",
    num_shards: int | None = None,
    shard_bytes: int | None = None,
    skip_existing: bool = False,
    counters: Mapping[str, int] | None = None,
    extra_manifest: Mapping[str, Any] | None = None,
    **writer_kw: Any,
) -> dict:
    """Write records as a record folder of contiguous shards plus `manifest.json`.

    Args:
        records: Records (materialised first: for large data use `Dataset.write_jsonl`/`write_parquet`).
        path: The output folder (local or fsspec URL).
        format: One of `WRITE_FORMATS`.
        num_shards: How many shards to split the records into (contiguously, in order; default 1).
        shard_bytes: Instead of `num_shards`: about this many bytes of JSON records per shard.
        skip_existing: Keep shards an interrupted earlier write of the SAME records finished (each shard's
            stats hold a fingerprint of its records and settings; a shard that differs is rewritten).
        counters: Counters to put in the manifest.
        extra_manifest: More manifest fields.
        **writer_kw: `ShardWriter` options (`zstd_level`, `row_group_size`, `row_group_bytes`).

    Returns:
        The manifest (also written to `path/manifest.json`).

    Example:
        >>> write_records([make_record("hi", source="s")], "/tmp/out", format="jsonl.zst")["records"]  # doctest: +SKIP
        1
    """
    check_write_format(format)
    start_write(
        path, skip_existing=skip_existing
    )  # first: a write that fails never leaves a "finished" folder
    records = list(records)
    if shard_bytes is not None:
        sizes = [len(dumps_json(r)) for r in records]
        bounds = _byte_bounds(sizes, plan_shards(None, shard_bytes, sizes))
    else:
        n_shards = plan_shards(num_shards or 1, None, [])
        bounds = [i * len(records) // n_shards for i in range(n_shards + 1)]
    names = [shard_name(i, len(bounds) - 1, format) for i in range(len(bounds) - 1)]
    settings = [format, len(names), sorted(writer_kw.items())]
    for i, name in enumerate(names):
        part = records[bounds[i] : bounds[i + 1]]
        # The shard's plan: its records and the settings, so a later `skip_existing` write reuses it only
        # for the same data (a crash, a deleted shard), never for other records.
        digest = records_digest(part)
        plan = (
            None
            if digest is None
            else fingerprint(settings, i, digest, dict(counters or {}) if i == 0 else {})
        )
        if skip_existing and finished_shard(path, name, plan) is not None:
            continue
        write_shard(path, name, part, counters=counters if i == 0 else None, plan=plan, **writer_kw)
    return write_manifest(path, names, format, extra_manifest)


def _byte_bounds(sizes: list[int], n_shards: int) -> list[int]:
    """Contiguous cut points splitting items of `sizes` into `n_shards` parts of about equal bytes."""
    total = sum(sizes)
    bounds, acc, k = [0], 0, 1
    for i, s in enumerate(sizes):
        acc += s
        while k < n_shards and acc >= k * total / n_shards:
            bounds.append(i + 1)
            k += 1
    while len(bounds) < n_shards:
        bounds.append(len(sizes))
    bounds.append(len(sizes))
    return bounds
