"""HTTP bodies as a WARC stores them, decoded to what the server sent: `Transfer-Encoding: chunked`, then
`Content-Encoding` gzip, deflate (zlib or raw, both sent by servers), br and zstd (fastwarc's readers).

Every decoder stops at `max_bytes + 1` bytes out, so a decompression bomb (a small body that inflates to
gigabytes) is refused as over the limit without being inflated; any other encoding is refused by name.
"""

from __future__ import annotations

import io
import re
import zlib
from collections.abc import Callable

from ._html import BadPage

_IDENTITY = ("", "identity", "none")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")


class _NotChunked(Exception):
    """A body declared chunked that does not start with a chunk size: stored de-chunked already."""


class _Undecodable(Exception):
    """What is wrong with a coded body (`decode_body` names the header and coding)."""


def decode_body(headers: dict[str, str], body: bytes, max_bytes: int, counters: dict[str, int]) -> bytes:
    """The body with its transfer codings, then its content codings, undone (the last applied first). A body
    declared chunked that does not start with a chunk size was stored de-chunked (as warcio reads it): kept
    as it is and counted (`extract.not_chunked`).

    Raises:
        BadPage: a body that does not decode, decodes past `max_bytes`, or uses an unsupported coding.
    """
    for header in ("transfer-encoding", "content-encoding"):
        for coding in reversed([c.strip().lower() for c in headers.get(header, "").split(",")]):
            if coding in _IDENTITY:
                continue
            decode = _DECODERS.get(coding)
            if decode is None:
                raise BadPage(f"unsupported {header.title()}: {coding}", "unsupported_encoding")
            try:
                body = decode(body, max_bytes)
            except _NotChunked:
                counters["extract.not_chunked"] = counters.get("extract.not_chunked", 0) + 1
            except _Undecodable as e:
                raise BadPage(f"body declared {header.title()}: {coding} {e}", "bad_encoding") from None
            if len(body) > max_bytes:
                raise BadPage(f"body declared {header.title()}: {coding} decodes past max_bytes={max_bytes:,}; "
                              "not decoded further", "over_max_bytes")  # fmt: skip
    return body


def _zlib(body: bytes, limit: int, wbits: int) -> bytes:
    """Inflate at most `limit + 1` bytes; gzip members after the first are inflated too (within the limit)."""
    out: list[bytes] = []
    size, rest = 0, body
    while True:
        d = zlib.decompressobj(wbits)
        try:
            chunk = d.decompress(rest, limit + 1 - size)
        except zlib.error as e:
            raise _Undecodable(f"does not decompress ({e})") from None
        out.append(chunk)
        size += len(chunk)
        if size > limit:
            break
        if not d.eof:
            raise _Undecodable(f"is truncated ({size:,} bytes decoded)")
        rest = d.unused_data
        if wbits != 31 or not rest.startswith(b"\x1f\x8b"):
            break  # bytes after a deflate stream or the last gzip member are ignored, as gzip readers do
    return b"".join(out)


def _gzip(body: bytes, limit: int) -> bytes:
    return _zlib(body, limit, 31)


def _deflate(body: bytes, limit: int) -> bytes:
    """RFC 9110's deflate is zlib-wrapped; many servers send raw deflate: a body without a zlib header is raw."""
    zlib_header = len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0
    return _zlib(body, limit, 15 if zlib_header else -15)


def _fastwarc(reader: str) -> Callable[[bytes, int], bytes]:
    def decode(body: bytes, limit: int) -> bytes:
        import fastwarc.stream_io

        out: list[bytes] = []
        size = 0
        try:
            r = getattr(fastwarc.stream_io, reader)(io.BytesIO(body))
            while size <= limit:
                chunk = r.read(min(2**20, limit + 1 - size))
                if not chunk:
                    break
                out.append(chunk)
                size += len(chunk)
        except OSError as e:
            raise _Undecodable(f"does not decompress ({e})") from None
        if body and not out:  # a stream header that ends at once, then garbage (no checksum to catch it)
            raise _Undecodable(f"does not decompress ({len(body):,} bytes decode to nothing)")
        return b"".join(out)

    return decode


def _dechunk(body: bytes, limit: int) -> bytes:
    """`Transfer-Encoding: chunked` undone (chunk extensions and trailers dropped); a body cut before its last
    chunk keeps what arrived."""
    out: list[bytes] = []
    size = pos = 0
    while pos < len(body) and size <= limit:
        eol = body.find(b"\n", pos)
        line = body[pos : eol if eol >= 0 else len(body)].split(b";", 1)[0].strip()
        if not _HEX.fullmatch(line):
            if pos == 0:
                raise _NotChunked
            raise _Undecodable(f"has no chunk size at byte {pos:,} ({bytes(line[:20])!r})")
        n = int(line, 16)
        if n == 0 or eol < 0:
            break
        out.append(body[eol + 1 : eol + 1 + n])
        size += n
        pos = eol + 1 + n
        if body.startswith(b"\r\n", pos):
            pos += 2
        elif body.startswith(b"\n", pos):
            pos += 1
        elif pos < len(body):
            raise _Undecodable(f"has a chunk at byte {eol + 1:,} that is not {n:,} bytes")
    return b"".join(out)


_DECODERS: dict[str, Callable[[bytes, int], bytes]] = {
    "chunked": _dechunk, "gzip": _gzip, "x-gzip": _gzip, "deflate": _deflate,
    "br": _fastwarc("BrotliReader"), "zstd": _fastwarc("ZstdReader"),
}  # fmt: skip
