"""Spill files: the data format between pipeline stages (never pickle).

A spill file is a header and a sequence of frames, each a zstd-compressed block:

    header  b"SCHSPILL" + u32 length + JSON {"format": 1, "writer": "<host>-<pid>-<random>"}
    frame   u32 raw length, u32 compressed length, u32 items, u32 crc32 of the compressed bytes,
            then the compressed bytes

Two payloads: record frames hold JSON lines (one record per line, integers of any size exact); shuffle
frames hold items `(key hash, input order, record JSON)` column-wise: n u64 hashes, n u64 sequence numbers,
n u32 lengths, then the records. Whoever writes a file returns its `SpillInfo` (writer tag, frame index,
file checksum) to the driver, and readers check every frame and the file against it, so a file that is
missing, truncated, corrupt or written by someone else (another attempt, another host) is an error naming
the file, never data read silently.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import orjson
import zstandard

from . import storage
from ._json import dumps_json, dumps_line, exact

MAGIC = b"SCHSPILL"
FRAME_BYTES = 1 << 20
"""Uncompressed bytes per frame, at most (a frame is the unit read back into memory)."""
_FRAME = struct.Struct("<IIII")
_LEVEL = 1  # spill files are read once or twice; fast compression pays for itself on disk and I/O


class SpillError(RuntimeError):
    """A spill file is missing, truncated, corrupt, or not the one its writer reported."""


@dataclass
class SpillInfo:
    """What a writer reports about one spill file; readers verify the file against it.

    Attributes:
        path: The file.
        writer: The writer's unique tag, also stored in the file's header.
        frames: Per partition (0 for record files): `[offset, compressed bytes, items, crc32, raw bytes]`
            per frame.
        crc32: Checksum of all compressed frame bytes, in file order.
        size: File size in bytes.
    """

    path: str
    writer: str
    frames: dict[int, list[list[int]]] = field(default_factory=dict)
    crc32: int = 0
    size: int = 0

    def items(self, partition: int = 0) -> int:
        return sum(f[2] for f in self.frames.get(partition, ()))

    def raw_bytes(self, partition: int = 0) -> int:
        return sum(f[4] for f in self.frames.get(partition, ()))

    def to_dict(self) -> dict:
        return {"path": self.path, "writer": self.writer, "crc32": self.crc32, "size": self.size,
                "frames": {str(k): v for k, v in self.frames.items()}}  # fmt: skip

    @staticmethod
    def from_dict(d: dict) -> SpillInfo:
        frames = {int(k): [list(map(int, f)) for f in v] for k, v in d["frames"].items()}
        return SpillInfo(d["path"], d["writer"], frames, int(d["crc32"]), int(d["size"]))


class SpillWriter:
    """Writes one spill file atomically; frames may belong to different partitions.

    `durable=False` (a temporary work folder, removed when the plan ends and never reused by a rerun)
    skips the fsyncs: the file still appears under its name only once complete."""

    def __init__(self, path: str, *, durable: bool = True) -> None:
        self.info = SpillInfo(path, storage.unique_tag())
        self._cm = storage.atomic_open(path) if durable else _renamed_open(path)
        self._f: IO[bytes] = self._cm.__enter__()
        self._cctx = zstandard.ZstdCompressor(level=_LEVEL)
        header = orjson.dumps({"format": 1, "writer": self.info.writer})
        self._pos = self._write(MAGIC + struct.pack("<I", len(header)) + header)
        self._crc = 0

    def _write(self, data: bytes) -> int:
        self._f.write(data)
        return len(data)

    def add_frame(self, raw: bytes, items: int, partition: int = 0) -> None:
        if not items:
            return
        comp = self._cctx.compress(raw)
        crc = zlib.crc32(comp)
        self._crc = zlib.crc32(comp, self._crc)
        offset = self._pos
        self._pos += self._write(_FRAME.pack(len(raw), len(comp), items, crc) + comp)
        self.info.frames.setdefault(partition, []).append([offset, len(comp), items, crc, len(raw)])

    def close(self) -> SpillInfo:
        self.info.crc32, self.info.size = self._crc, self._pos
        self._cm.__exit__(None, None, None)
        return self.info

    def abort(self, exc: BaseException) -> None:
        self._cm.__exit__(type(exc), exc, exc.__traceback__)


@contextlib.contextmanager
def _renamed_open(path: str) -> Iterator[IO[bytes]]:
    """`storage.atomic_open` without the fsyncs (local paths; others go through it)."""
    if not storage.is_local(path):
        with storage.atomic_open(path) as f:
            yield f
        return
    path = storage.local_path(path)
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.tmp-{storage.unique_tag()}")  # a temporary name (`is_temp_name`)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_spill_records(path: str, records: Iterable[dict], *, durable: bool = True) -> tuple[SpillInfo, int]:
    """Write records as a record spill file; returns its info and the record count."""
    return write_lines(
        path, (record_json(rec, "a spill file", newline=True) for rec in records), durable=durable
    )


def write_lines(path: str, json_lines: Iterable[bytes], *, durable: bool = True) -> tuple[SpillInfo, int]:
    """Write records already encoded as JSON lines (`record_json(..., newline=True)`) as a record spill file;
    returns its info and the record count."""
    w = SpillWriter(path, durable=durable)
    n = 0
    try:
        lines: list[bytes] = []
        size = 0
        for line in json_lines:
            lines.append(line)
            size += len(line)
            n += 1
            if size >= FRAME_BYTES:
                w.add_frame(b"".join(lines), len(lines))
                lines, size = [], 0
        w.add_frame(b"".join(lines), len(lines))
    except BaseException as e:
        w.abort(e)
        raise
    return w.close(), n


def record_json(rec: Any, where: str, *, newline: bool = False) -> bytes:
    """A record as JSON (a line with `newline`), or a `TypeError` naming `where`, the record and the fix."""
    try:
        return dumps_line(rec) if newline else dumps_json(rec)
    except TypeError as e:
        rid = rec.get("id") if isinstance(rec, dict) else None
        raise TypeError(
            f"{where}: record id={rid!r} cannot be passed between pipeline stages ({e}); records hold JSON "
            "values (str, int, float, bool, None, lists and dicts): convert other values in a map() first"
        ) from None


# ---------------------------------------------------------------------------------------------- reading


def _check_header(f: IO[bytes], info: SpillInfo) -> None:
    head = f.read(len(MAGIC) + 4)
    if head[: len(MAGIC)] != MAGIC:
        raise SpillError(
            f"{info.path}: not a schooner spill file (it starts {head[:16]!r}); something else wrote this "
            "name in the work folder. Rerun: completed map outputs are checked and redone when damaged"
        )
    (n,) = struct.unpack("<I", head[len(MAGIC) :])
    writer = orjson.loads(f.read(n)).get("writer")
    if writer != info.writer:
        raise SpillError(
            f"{info.path}: written by {writer!r}, not by {info.writer!r} which reported it: another attempt or "
            "host wrote the same name. Rerun; work folders must not be shared by unrelated runs"
        )


def open_checked(info: SpillInfo) -> IO[bytes]:
    """The file of `info`, opened after checking that it exists, has the reported size and header."""
    try:
        size = storage.file_size(info.path)
    except FileNotFoundError:
        raise SpillError(
            f"{info.path}: missing (its writer {info.writer} reported {info.size} bytes); the work folder "
            "was cleaned or shared by another run. Rerun to redo it"
        ) from None
    if size != info.size:
        raise SpillError(
            f"{info.path}: {size} bytes, but its writer {info.writer} reported {info.size}; the file was "
            "replaced or truncated. Rerun to redo it"
        )
    f = storage.open_file(info.path, "rb")
    try:
        _check_header(f, info)
    except BaseException:
        f.close()
        raise
    return f


def read_frame(f: IO[bytes], info: SpillInfo, frame: list[int], dctx: Any) -> bytes:
    """The uncompressed bytes of one frame, checked against the writer's report."""
    offset, comp_len, items, crc = frame[:4]
    f.seek(offset)
    head = f.read(_FRAME.size)
    raw_len, clen, n, fcrc = _FRAME.unpack(head) if len(head) == _FRAME.size else (0, -1, -1, -1)
    comp = f.read(comp_len)
    if (clen, n, fcrc) != (comp_len, items, crc) or len(comp) != comp_len or zlib.crc32(comp) != crc:
        raise SpillError(
            f"{info.path}: frame at byte {offset} does not match what its writer {info.writer} reported "
            "(corrupt or replaced); rerun to redo it"
        )
    return dctx.decompress(comp, max_output_size=raw_len)


def decode_lines(raw: bytes) -> list[dict]:
    lines = raw.split(b"\n")
    lines.pop()
    loads = orjson.loads
    return [exact(loads(x), x) for x in lines]


def read_spill_records(info: SpillInfo, start: int = 0, stop: int | None = None) -> Iterator[dict]:
    """Records `start:stop` of a record spill file (frames outside the range are not decompressed)."""
    frames = info.frames.get(0, [])
    if not frames:
        return
    dctx = zstandard.ZstdDecompressor()
    with open_checked(info) as f:
        pos = 0
        for frame in frames:
            end = pos + frame[2]
            if end > start and (stop is None or pos < stop):
                recs = decode_lines(read_frame(f, info, frame, dctx))
                lo = max(0, start - pos)
                hi = len(recs) if stop is None else min(len(recs), stop - pos)
                yield from recs[lo:hi]
            pos = end
            if stop is not None and pos >= stop:
                return


# ------------------------------------------------------------------------------------- shuffle frames


def encode_items(hashes: list[int], seqs: list[int], payloads: list[bytes]) -> bytes:
    """Shuffle items column-wise: u64 hashes, u64 sequence numbers, u32 lengths, then the payloads."""
    n = len(payloads)
    lens = np.fromiter(map(len, payloads), dtype="<u4", count=n)
    return (
        np.asarray(hashes, dtype="<u8").tobytes()
        + np.asarray(seqs, dtype="<u8").tobytes()
        + lens.tobytes()
        + b"".join(payloads)
    )


def decode_items(raw: bytes, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, memoryview]:
    """(hashes u64, seqs u64, payload offsets int64 [n + 1], payload bytes) of one shuffle frame."""
    hashes = np.frombuffer(raw, dtype="<u8", count=n)
    seqs = np.frombuffer(raw, dtype="<u8", count=n, offset=8 * n)
    lens = np.frombuffer(raw, dtype="<u4", count=n, offset=16 * n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return hashes, seqs, offsets, memoryview(raw)[20 * n :]
