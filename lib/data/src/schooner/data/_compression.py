"""Streaming decompression that notices truncated gzip/zstd streams (zstandard's reader does not)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import IO, Protocol

import zstandard

CHUNK = 1 << 18
"""Bytes read from the file per step (a compressed chunk can decode to several times as many)."""

_COMPRESSIONS = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd"}


class _Decompressor(Protocol):
    """What zlib's and zstandard's decompression objects have in common (and all this module uses)."""

    def decompress(self, data: bytes, /) -> bytes: ...

    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...


class StreamError(Exception):
    """A compressed stream is truncated or corrupt; readers add the file and line to the message."""


def split_compression(name: str) -> tuple[str, str | None]:
    """`("x.jsonl", "zstd")` for `"x.jsonl.zst"`; `(name, None)` when uncompressed."""
    low = name.lower()
    for ext, comp in _COMPRESSIONS.items():
        if low.endswith(ext):
            return name[: -len(ext)], comp
    return name, None


INCOMPLETE = "the file is incomplete (an interrupted write or download): re-create or re-download it"
"""The fix for a compressed file cut short (0 bytes, or ending inside a frame), as every reader gives it."""


def zero_bytes(compression: str) -> str:
    """Why a 0-byte compressed file is no stream: it was cut short before its first byte (the message every
    reader of compressed input gives; an empty file is a legitimate empty shard only uncompressed)."""
    return f"empty file (0 bytes), not a {compression} stream (an empty stream still has a header)"


def iter_decompressed(f: IO[bytes], compression: str | None) -> Iterator[bytes]:
    """Yield the decompressed bytes of `f` in chunks, across concatenated frames/members.

    Raises:
        StreamError: the stream ends inside a frame (truncated) or holds invalid compressed data.
    """
    if compression is None:
        while chunk := f.read(CHUNK):
            yield chunk
        return
    new: Callable[[], _Decompressor]
    if compression == "gzip":
        new = lambda: zlib.decompressobj(wbits=31)  # noqa: E731
        errors: tuple[type[BaseException], ...] = (zlib.error,)
    elif compression == "zstd":
        dctx = zstandard.ZstdDecompressor()
        new = dctx.decompressobj
        errors = (zstandard.ZstdError,)
    else:
        raise ValueError(f"unknown compression {compression!r}; use None, 'gzip' or 'zstd'")
    d = new()
    started = False
    while raw := f.read(CHUNK):
        while raw:
            if started and d.eof:
                if compression == "gzip":
                    # zero bytes after a member are padding (a file padded to a block size), as gzip and
                    # Python's gzip module read them
                    raw = raw.lstrip(b"\x00")
                    if not raw:
                        break
                d = new()
            try:
                out = d.decompress(raw)
            except errors as e:
                raise StreamError(f"corrupt {compression} data ({e})") from None
            started = True
            if out:
                yield out
            raw = d.unused_data if d.eof else b""
    if not started:
        raise StreamError(zero_bytes(compression))
    if not d.eof:
        raise StreamError(f"truncated {compression} stream (the file ends inside a compressed frame)")
