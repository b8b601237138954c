"""WARC files: reading response records into page records (fastwarc), and writing them.

Reading is one task per WARC file (`warc_dataset`): each HTTP response of an HTML content type becomes a
record `{"id", "text", "source", "metadata": {"url", "title", "warc_file", "warc_offset", "warc_date",
"charset", "content_type"}}` (the id is the WARC-Record-ID, else a hash of file and offset). Bad input (a
truncated record, a Content-Length that is not an integer, a binary or empty body, a page over `max_bytes`, a
body that does not decode, an extractor failure) is a `DataError` naming the file and the record's byte
offset: raised with `on_error="raise"`, counted and skipped with `on_error="skip"`. A damaged stream (a bad
gzip member, garbage between records) is one such skip named by its offset, and reading resumes at the next
record. Other records (requests, metadata, non-HTML responses, statuses not kept) are counted, not errors.

WET files (Common Crawl's extracted text, `*.warc.wet.gz`) hold `conversion` records of plain text: each is a
record of that text as it is (stripped; `metadata.content_type` "text/plain"), counted `warc.conversions`, as
datatrove's WarcReader reads them. A file that does not start as a WARC file does (`WARC/`, after its
compression) is one skip, `not_warc`, naming the file and what it starts with.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import uuid
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from schooner.data import storage
from schooner.data._compression import INCOMPLETE, split_compression, zero_bytes
from schooner.data._errors import DataError, SkipLog, handle
from schooner.data._splits import Split

from ._html import BadPage, ExtractConfig, decode_html, extract_page
from ._html_files import files_under
from ._http import decode_body

if TYPE_CHECKING:
    from fastwarc.warc import HeaderMap

_WARC_NAME = re.compile(r"\.(warc|arc|wet)(\.gz|\.zst|\.lz4)?$", re.IGNORECASE)


def _add(counters: dict[str, int], key: str, n: int = 1) -> None:
    counters[key] = counters.get(key, 0) + n


def _warc_headers(headers: HeaderMap) -> dict[str, str]:
    """A record's WARC headers by lower-case name, the first of a repeated name kept (as fastwarc's
    case-insensitive `HeaderMap.get`, which costs ~5 us a call; one `items()` pass costs ~2 us)."""
    out: dict[str, str] = {}
    for k, v in headers.items():
        out.setdefault(k.lower(), v)
    return out


_HEAD_END = re.compile(rb"\r?\n\r?\n")


def _parse_http(block: bytes) -> tuple[int, dict[str, str], bytes]:
    # the headers end at the first empty line, a line ending in CRLF or a bare LF (RFC 9112 2.2): not at the
    # first CRLFCRLF, which may lie in the body after an LF-only header's blank line
    m = _HEAD_END.search(block)
    if m is None:
        raise BadPage("HTTP response without a header/body separator", "bad_http")
    head, body = block[: m.start()], block[m.end() :]
    # HTTP lines end at \n (\r\n): not str.splitlines(), which also breaks at \x0c, \x1c-\x1e and \x85 in values
    lines = [ln.removesuffix("\r") for ln in head.decode("latin-1").split("\n")]
    parts = lines[0].split(" ", 2) if lines else []
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise BadPage(f"not an HTTP response status line: {lines[0][:60] if lines else ''!r}", "bad_http")
    headers: dict[str, str] = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers, body


def _content_type(headers: dict[str, str]) -> tuple[str, str | None]:
    ct = headers.get("content-type", "")
    mime, _, rest = ct.partition(";")
    charset = None
    for p in rest.split(";"):
        k, _, v = p.partition("=")
        if k.strip().lower() == "charset" and v.strip():
            charset = v.strip().strip("\"'")
    return mime.strip().lower(), charset


def iter_pages(
    path: str, config: ExtractConfig, *, on_error: str, skips: SkipLog, counters: dict[str, int],
    source: str | None = None, name: str | None = None,
) -> Iterator[dict]:  # fmt: skip
    """The page records of one WARC file (plain, `.gz` per-record members, or `.zst`); `name` is the file's
    `metadata.warc_file` (default: its base name)."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    name = name or os.path.basename(path)
    src = source or "warc"
    with storage.open_file(path, "rb") as f:
        head = _head(f)
        if head is not None and head.startswith(b"filedesc://"):
            msg = ("an ARC file (the Internet Archive's format before WARC: a filedesc:// header), which is not "
                   "read; convert it to WARC (warctools' arc2warc) and read that")  # fmt: skip
            handle(DataError(path, msg, kind="arc_file"), on_error, skips)
            return
        comp = split_compression(path)[1]
        if head == b"" and comp is not None and f.read(1) == b"":  # 0 bytes: gzip and zstd see no stream
            msg = f"{zero_bytes(comp)}; {INCOMPLETE}"
            handle(DataError(path, msg, kind="damaged_stream"), on_error, skips)
            return
        if head is not None and not head.startswith(b"WARC/"):
            start = repr(head[:40]) if head else "nothing (an empty file)"
            msg = (f"not a WARC file: it starts with {start}, where a WARC file starts with 'WARC/' (after its "
                   "gzip or zstd compression); read HTML files with html_dataset, JSON lines with read_shards")  # fmt: skip
            handle(DataError(path, msg, kind="not_warc"), on_error, skips)
            return
        it = ArchiveIterator(f, record_types=WarcRecordType.any_type, parse_http=False)
        last: int | None = None  # the offset of the last record read
        last_length = 0  # its Content-Length
        restart = 0  # where the iterator started (after a damaged gzip member: the next member)
        while True:
            try:
                rec = next(it)
            except StopIteration:
                return
            except OSError as e:  # a stream that cannot be decompressed or parsed any further
                resume = _skip_damaged_member(f, path, e, last, last_length, restart, on_error, skips)
                if resume is None:
                    return
                f.seek(resume)
                it = ArchiveIterator(f, record_types=WarcRecordType.any_type, parse_http=False)
                last, restart = None, resume
                continue
            offset = last = rec.stream_pos
            last_length = rec.content_length
            conversion = rec.record_type == WarcRecordType.conversion
            if rec.record_type != WarcRecordType.response and not conversion:
                _add(counters, "warc.other_records")
                continue
            _add(counters, "warc.conversions" if conversion else "warc.responses")
            headers = _warc_headers(rec.headers)
            url = headers.get("warc-target-uri", "")
            try:
                length = headers.get("content-length")
                if length is not None and not (length.isascii() and length.strip().isdigit()):
                    rec.reader.consume()
                    raise BadPage(
                        f"WARC Content-Length {length[:40]!r} is not an integer >= 0", "bad_content_length"
                    )
                declared = -1 if length is None else int(length)
                if declared > config.max_bytes:
                    rec.reader.consume()
                    raise BadPage(
                        f"page of {declared:,} bytes is over max_bytes={config.max_bytes:,}", "over_max_bytes"
                    )
                block = rec.reader.read()
                if declared >= 0 and len(block) < declared:
                    raise BadPage(
                        f"truncated record: {len(block):,} of {declared:,} bytes", "truncated_record"
                    )
                page: tuple[str, str, str, str] | None
                if conversion:
                    page = _conversion(block, headers)
                else:
                    page = _page(block, config, counters, headers.get("warc-identified-payload-type"))
                if page is None:
                    continue
                text, title, charset, mime = page
            except BadPage as e:
                err = DataError(path, f"WARC record at byte offset {offset} ({url or 'no URL'}): {e}",
                                fix="pass on_error='skip' to skip bad pages (they are counted)", kind=e.kind)  # fmt: skip
                handle(err, on_error, skips)
                continue
            except OSError as e:  # the record's body does not decompress: a large page (fastwarc inflates
                # ~300 KB ahead, so a small record's damage shows at `next(it)` above, a large one's here)
                rid = headers.get("warc-record-id", "").strip("<>") or "no WARC-Record-ID"
                what = f"WARC record {rid} at byte offset {offset} ({url or 'no URL'})"
                resume = _skip_damaged_member(f, path, e, None, 0, offset, on_error, skips, record=what)
                if resume is None:
                    return
                f.seek(resume)
                it = ArchiveIterator(f, record_types=WarcRecordType.any_type, parse_http=False)
                last, restart = None, resume
                continue
            if len(text) < config.min_chars:
                _add(counters, "dropped.empty_text")
                continue
            rid = headers.get("warc-record-id", "").strip("<>")
            yield {
                "id": rid or hashlib.sha1(f"{name}:{offset}".encode()).hexdigest(),
                "text": text,
                "source": src,
                "metadata": {
                    "url": url, "title": title, "warc_file": name, "warc_offset": offset,
                    "warc_date": headers.get("warc-date", ""), "charset": charset, "content_type": mime,
                },
            }  # fmt: skip


def _head(f: Any) -> bytes | None:
    """The first bytes of the file's content (after gzip or zstd compression), None where they cannot be
    read (a damaged first gzip member: left to the reader, which names the damage; lz4); the file is left
    at 0."""
    head = f.read(2**16)
    f.seek(0)
    try:
        if head.startswith(b"\x1f\x8b"):
            return zlib.decompressobj(31).decompress(head, 64)
        if head.startswith(b"\x28\xb5\x2f\xfd"):
            import zstandard

            return zstandard.ZstdDecompressor().decompressobj().decompress(head)[:64]
    except Exception:  # zlib.error, zstandard's ZstdError: a damaged start, which the reader names
        return None
    if head.startswith(b"\x04\x22\x4d\x18"):
        return None
    return head[:64]


def _conversion(block: bytes, headers: dict[str, str]) -> tuple[str, str, str, str]:
    """`(text, title, charset, content type)` of a WET `conversion` record: its plain text as it is."""
    _, charset = _content_type({"content-type": headers.get("content-type", "")})
    text, used, _ = decode_html(block, charset or "utf-8")
    if not text.strip():
        raise BadPage("empty conversion record", "empty_body")
    return text.strip(), "", used, "text/plain"


def _skip_damaged_member(
    f: Any, path: str, error: OSError, last: int | None, last_length: int, restart: int, on_error: str,
    skips: SkipLog, *, record: str | None = None,
) -> int | None:  # fmt: skip
    """A WARC stream that fails after the record at `last` (None: no record since `restart`; `record` names
    the record whose body failed there), named and counted as one skip (`damaged_stream`); returns where
    reading resumes (None: nowhere). A gzip file is a series of gzip
    members (one per record, as crawlers write them): the damaged member starts where the last good one ends,
    and reading resumes at the next member that inflates to a whole WARC record. In a plain file the damage
    starts where the last record ends by its Content-Length, and reading resumes at the next `WARC/1.x` line
    that opens a record header. Other files (zstd, lz4) are lost from there."""
    try:
        f.seek(0)
        magic = f.read(4)
        if magic.startswith(b"\x1f\x8b"):
            bad = restart if last is None else _member_end(f, last)
            padded = _after_zeros(f, bad)
            if padded > bad:
                # zero bytes after a member are padding (a file padded to a block size), as gzip and Python's
                # gzip module read them (and the JSON-lines reader): not damage, when the end of the file or
                # the next member follows them
                f.seek(padded)
                after = f.read(len(_GZIP_MAGIC))
                if not after:
                    return None
                if after == _GZIP_MAGIC:
                    return padded
            resume, what = _next_member(f, bad + 1), "gzip member"
        elif magic not in (b"\x28\xb5\x2f\xfd", b"\x04\x22\x4d\x18"):  # zstd, lz4 frames
            bad = restart if last is None else _record_end(f, last, last_length)
            resume, what = _next_record(f, bad + 1 if bad == restart else bad), "WARC data"
        else:
            bad = None
    except OSError:  # a stream that cannot seek (or read again)
        bad = None
    if bad is None:
        after = (
            f"after the record at byte offset {last}" if last is not None else f"from byte offset {restart}"
        )
        msg = f"unreadable WARC stream {after} ({error}); the rest of the file is lost"
    else:
        rest = f"reading resumes at byte offset {resume}" if resume is not None else "to the end of the file"
        msg = f"{what} at byte offset {bad} is unreadable ({error}); {rest}"
    if record is not None:
        msg = f"{record}: {msg}"
    handle(DataError(path, msg, kind="damaged_stream"), on_error, skips)
    return None if bad is None else resume


def _record_end(f: Any, start: int, length: int) -> int:
    """Where the plain WARC record at `start` ends by its Content-Length (its two closing CRLFs included)."""
    f.seek(start)
    head = f.read(2**16)
    i = head.find(b"\r\n\r\n")
    return start + i + 4 + length + 4 if i >= 0 else start


_RECORD_START = re.compile(
    rb"(?:^|(?<=\n))WARC/1\.[01]\r\n(?:[!-9;-~]+:[^\r\n]*\r\n)*?WARC-Type:", re.IGNORECASE
)


def _next_record(f: Any, pos: int) -> int | None:
    """The offset of the first line at or after `pos` that opens a WARC record header (None: none)."""
    while True:
        f.seek(pos)
        buf = f.read(2**20)
        m = _RECORD_START.search(buf) if pos == 0 else _RECORD_START.search(b"\n" + buf, 1)
        if m:
            return pos + m.start() - (0 if pos == 0 else 1)
        if len(buf) < 2**20:
            return None
        pos += len(buf) - 2**12  # a header cut by the buffer's end is found in the next one


# WHATWG MIME Sniffing, "identifying a resource with an unknown MIME type": the HTML patterns after
# leading whitespace, each followed by whitespace or ">" (the spec: a space or ">"; the comment opener by anything)
_HTML_START = re.compile(
    rb"<(?:(?:!DOCTYPE HTML|HTML|HEAD|SCRIPT|IFRAME|H1|DIV|FONT|TABLE|A|STYLE|TITLE|B|BODY|BR|P)[ \t\n\x0c\r>]|!--)",
    re.IGNORECASE,
)


def _html_start(body: bytes) -> int:
    """Where the body's first non-whitespace byte is, after a UTF-8 byte-order mark."""
    start = 3 if body.startswith(b"\xef\xbb\xbf") else 0
    head = body[start : start + 512]
    return start + len(head) - len(head.lstrip(b" \t\n\x0c\r"))


_GZIP_MAGIC = b"\x1f\x8b\x08"


def _member_end(f: Any, start: int) -> int:
    """Where the gzip member starting at `start` ends (`start` itself when it does not inflate to its end);
    inflated 64 KiB at a time, the output dropped."""
    f.seek(start)
    d, read = zlib.decompressobj(31), 0
    try:
        while not d.eof:
            data = f.read(2**20)
            if not data:
                d.flush()
                break
            read += len(data)
            while data and not d.eof:
                d.decompress(data, 2**16)
                data = d.unconsumed_tail
    except zlib.error:
        return start
    return start + read - len(d.unused_data) if d.eof else start


def _after_zeros(f: Any, pos: int) -> int:
    """Where the run of zero bytes starting at `pos` ends (`pos` itself when none starts there)."""
    while True:
        f.seek(pos)
        buf = f.read(2**16)
        n = len(buf) - len(buf.lstrip(b"\x00"))
        pos += n
        if n < len(buf) or not buf:
            return pos


def _next_member(f: Any, pos: int) -> int | None:
    """The offset of the first gzip member at or after `pos` that inflates to the whole of a WARC record (None:
    none; a cut member is part of the damage, as is a member stored verbatim inside a damaged one)."""
    while True:
        f.seek(pos)
        buf = f.read(2**20)
        i = buf.find(_GZIP_MAGIC)
        while i >= 0:
            f.seek(pos + i)
            try:
                head = zlib.decompressobj(31).decompress(f.read(2**16), 5)
                if head == b"WARC/" and _member_end(f, pos + i) > pos + i:
                    return pos + i
            except zlib.error:
                pass
            i = buf.find(_GZIP_MAGIC, i + 1)
        if len(buf) < 2**20:
            return None
        pos += len(buf) - len(_GZIP_MAGIC) + 1


def _page(
    block: bytes, config: ExtractConfig, counters: dict[str, int], identified: str | None = None
) -> tuple[str, str, str, str] | None:
    """`(text, title, charset, content type)` of an HTTP response, None when its status or content type is not
    kept. The content type is the WARC-Identified-Payload-Type (Common Crawl's, sniffed from the bytes) when
    the record has one, else the HTTP Content-Type, else HTML sniffed from the body (`warc.sniffed_html`)."""
    status, headers, body = _parse_http(block)
    if status not in config.keep_status:
        _add(counters, "warc.skipped_status")
        return None
    mime, charset = _content_type(headers)
    decoded = False
    if identified and identified.strip():
        mime = identified.partition(";")[0].strip().lower()
    elif not mime:  # sniffed from what the server sent, its codings undone
        body, decoded = decode_body(headers, body, config.max_bytes, counters), True
        if _HTML_START.match(body, _html_start(body)):
            mime = "text/html"
            _add(counters, "warc.sniffed_html")
    if mime not in config.content_types:
        _add(counters, "warc.skipped_content_type")
        return None
    if not decoded:
        body = decode_body(headers, body, config.max_bytes, counters)
    if not body or body.isspace():  # not `body.strip()`, which copies the page
        raise BadPage("empty body", "empty_body")
    if len(body) > config.max_bytes:
        raise BadPage(f"page of {len(body):,} bytes is over max_bytes={config.max_bytes:,}", "over_max_bytes")
    html, used, fell_back = decode_html(body, charset)
    if fell_back:
        _add(counters, "extract.charset_fallback")
    return *extract_page(html, config), used, mime


@dataclass(frozen=True)
class WarcSplit(Split):
    """One WARC file, extracted to page records."""

    path: str
    config: ExtractConfig
    on_error: str = "skip"
    source: str | None = None
    name: str | None = None
    """`metadata.warc_file`: the path under the folder read (None: the file's base name)."""

    @property
    def label(self) -> str:
        return self.path

    def iterate(self, skips: SkipLog, counters: dict[str, int]) -> Iterator[dict]:
        return iter_pages(self.path, self.config, on_error=self.on_error, skips=skips, counters=counters,
                          source=self.source, name=self.name)  # fmt: skip

    def token(self) -> Any:
        c = self.config
        named = [self.name] if self.name and self.name != os.path.basename(self.path) else []
        return ["warc", self.path, storage.file_identity(self.path), c.extractor, c.main_content,
                list(c.content_types), c.max_bytes, c.min_chars, list(c.keep_status), self.on_error, self.source,
                *named]  # fmt: skip


def _warc_files(path: str) -> list[tuple[str, str]]:
    """(file, path relative to `path`) of the WARC files under a folder (recursively, names in any case),
    sorted."""
    return files_under(path, _WARC_NAME)


def warc_dataset(
    paths: str | Sequence[str], config: ExtractConfig | None = None, *, on_error: str = "skip",
    source: str | None = None,
) -> Any:  # fmt: skip
    """A `Dataset` of the page records of WARC files (paths, globs, folders searched recursively for
    `*.warc`, `*.warc.gz`, `*.warc.zst`, WET files `*.warc.wet.gz`, names in any case; one task per file). A record's
    `metadata.warc_file` is the file's path under the folder (a file given directly: its name)."""
    from schooner.data._dataset import Dataset
    from schooner.data._errors import check_on_error
    from schooner.data._folders import expand_paths

    check_on_error(on_error)
    config = config or ExtractConfig()
    plist = [paths] if isinstance(paths, str) else list(paths)

    def splits() -> list[Split]:
        files: list[tuple[str, str | None]] = []
        for p in plist:
            if storage.isdir(p):  # a folder: its WARC files (a crawl folder also holds other files)
                found = _warc_files(p)
                if not found:
                    raise FileNotFoundError(
                        f"folder {p} holds no WARC files (*.warc, *.warc.gz, *.warc.zst, *.wet.gz, searched "
                        "recursively)"
                    )
                files.extend(found)
            else:
                files.extend((f, None) for f in expand_paths(p))
        return [WarcSplit(f, config, on_error, source, name) for f, name in files]

    return Dataset(splits, describe=f"warc({plist!r}, extractor={config.extractor!r})")


# ------------------------------------------------------------------------------------------------ writing


@dataclass(frozen=True)
class WarcPage:
    """One HTTP response to write into a WARC file."""

    url: str
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    status: int = 200
    date: str = "2024-01-01T00:00:00Z"
    extra_headers: tuple[tuple[str, str], ...] = ()


def warc_response(page: WarcPage) -> bytes:
    """One uncompressed WARC/1.1 response record (fastwarc's writer, block digest included; the record id
    is derived from the URL and body, so equal pages give equal bytes)."""
    from fastwarc.warc import WarcRecord, WarcRecordType

    reason = {200: "OK", 404: "Not Found", 301: "Moved Permanently", 500: "Internal Server Error"}
    head = [f"HTTP/1.1 {page.status} {reason.get(page.status, 'Status')}", f"Content-Type: {page.content_type}",
            f"Content-Length: {len(page.body)}", *(f"{k}: {v}" for k, v in page.extra_headers)]  # fmt: skip
    http = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + page.body
    rid = uuid.uuid5(uuid.NAMESPACE_URL, page.url + hashlib.sha1(page.body).hexdigest())
    rec = WarcRecord()
    rec.init_headers(WarcRecordType.response, f"uuid:{rid}".encode(), content_length=len(http))
    rec.headers["WARC-Date"] = page.date
    rec.headers["WARC-Target-URI"] = page.url
    rec.headers["Content-Type"] = "application/http; msgtype=response"
    rec.set_bytes_content(http)
    buf = io.BytesIO()
    rec.write(buf, checksum_data=True)
    return buf.getvalue()


def write_warc(path: str, pages: Iterable[WarcPage], *, compress: bool = True) -> int:
    """Write a WARC file of response records (gzip: one member per record, as crawlers write them),
    atomically; returns the number of records."""
    n = 0
    with storage.atomic_open(path) as f:
        for page in pages:
            data = warc_response(page)
            f.write(gzip.compress(data, mtime=0) if compress else data)
            n += 1
    return n
