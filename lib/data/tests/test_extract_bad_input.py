"""Extraction of hostile or mislabelled web bytes (review r17): charsets decoded as browsers decode them (the
WHATWG Encoding Standard), byte-order marks, HTTP transfer and content encodings, decompression bombs, bad WARC
lengths. Bodies are built here from the text the page should show, with Python's codec of the right WHATWG
encoding; expected text is that text, never the code's output."""

from __future__ import annotations

import gzip
import re

import pytest

pytest.importorskip("resiliparse")

from schooner.data.curation._html import decode_html

# text that only the WHATWG decoder of each label decodes (cp1252 punctuation in 0x80-0x9F, NEC/IBM rows of
# cp932, UHC syllables of cp949, a 4-byte gb18030 character)
FRENCH = "Le café “crème” coûte 3 € – c’est"
JAPANESE = "①②③ 髙橋さんの日本語"
KOREAN = "한국어 똠방각하"
CHINESE = "中文网页 䶮 €"
WHATWG_CASES = [
    (FRENCH, "cp1252", ["iso-8859-1", "ISO-8859-1", "latin1", "us-ascii", "ascii", "windows-1252"]),
    (JAPANESE, "cp932", ["shift_jis", "Shift_JIS", "sjis", "x-sjis", "windows-31j"]),
    (KOREAN, "cp949", ["euc-kr", "EUC-KR", "ks_c_5601-1987"]),
    (CHINESE, "gb18030", ["gb2312", "gbk", "GB2312"]),
]


def _page(text: str) -> str:
    return f"<html><head><title>t</title></head><body><p>{text}</p></body></html>"


@pytest.mark.parametrize(("text", "codec", "labels"), WHATWG_CASES, ids=[c[1] for c in WHATWG_CASES])
def test_declared_charset_labels_decode_as_the_whatwg_encoding(text, codec, labels):
    body = _page(text).encode(codec)
    for label in labels:
        html, used, fell_back = decode_html(body, label)  # HTTP header
        assert (text in html, used, fell_back) == (True, codec, False), label
        meta = f'<html><head><meta charset="{label}"><title>t</title></head><body><p>{text}</p></body></html>'
        html, used, _ = decode_html(meta.encode(codec), None)  # <meta charset>
        assert (text in html, used) == (True, codec), label


def test_detected_encoding_is_mapped_to_the_whatwg_encoding():
    # uchardet names this page Shift_JIS; its ① and 髙 are only in cp932 (WHATWG's Shift_JIS decoder)
    text = (
        "日本語のテキストです。これは日本のウェブページの本文で、ひらがなとカタカナと漢字が含まれています。"
        * 10
    )
    html, used, _ = decode_html(_page(text + JAPANESE).encode("cp932"), None)
    assert (text + JAPANESE in html, used) == (True, "cp932")
    # a UHC page uchardet detects (as CP949); mapped to its WHATWG name's decoder, not to utf-8
    text = "한국어 웹 페이지의 본문입니다. 이것은 한국어 텍스트이며 여러 문장이 포함되어 있습니다. " * 10
    html, used, _ = decode_html(_page(text + KOREAN).encode("cp949"), None)
    assert (text + KOREAN in html, used) == (True, "cp949")


def test_a_header_charset_that_fails_and_a_meta_charset_that_works_counts_as_a_fallback():
    body = f'<html><head><meta charset="windows-1252"></head><body><p>{FRENCH}</p></body></html>'.encode(
        "cp1252"
    )
    html, used, fell_back = decode_html(body, "utf-8")
    assert (FRENCH in html, used, fell_back) == (True, "cp1252", True)


@pytest.mark.parametrize(
    ("bom", "codec", "name"),
    [(b"\xef\xbb\xbf", "utf-8", "utf-8"), (b"\xff\xfe", "utf-16-le", "utf-16-le"),
     (b"\xfe\xff", "utf-16-be", "utf-16-be")],
)  # fmt: skip
def test_a_byte_order_mark_overrides_any_declared_charset(bom, codec, name):
    text = FRENCH + " " + KOREAN
    body = bom + _page(text).encode(codec)
    for declared in ("iso-8859-1", "shift_jis", None):
        html, used, _ = decode_html(body, declared)
        assert (html.startswith("<html>"), text in html, used) == (True, True, name), declared
    meta = bom + f'<html><head><meta charset="iso-8859-1"></head><body>{text}</body></html>'.encode(codec)
    assert decode_html(meta, None)[1] == name


# ------------------------------------------------------------------ WARC bodies: HTTP encodings, lengths


def _records(path, config=None, on_error="skip"):
    from schooner.data import SkipLog
    from schooner.data.curation import ExtractConfig
    from schooner.data.curation._warc import iter_pages

    skips, counters = SkipLog(), {}
    recs = list(
        iter_pages(str(path), config or ExtractConfig(), on_error=on_error, skips=skips, counters=counters)
    )
    return recs, skips, counters


def _warc(tmp_path, pages, name="x.warc.gz"):
    from schooner.data.curation import WarcPage, write_warc

    path = tmp_path / name
    write_warc(str(path), [WarcPage(url, body, extra_headers=tuple(h)) for url, body, h in pages])
    return path


HTML = _page("Encoded bodies decode to this paragraph, " + FRENCH + ".").encode("utf-8")
TEXT = "Encoded bodies decode to this paragraph, " + FRENCH + "."


def _chunked(data: bytes, size: int) -> bytes:
    parts = [data[i : i + size] for i in range(0, len(data), size)]
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_transfer_and_content_encodings_are_decoded(tmp_path):
    import zlib

    import zstandard

    brotli = pytest.importorskip("brotli")
    raw_deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    cases = {
        "gzip": (gzip.compress(HTML), [("Content-Encoding", "gzip")]),
        "deflate-zlib": (zlib.compress(HTML), [("Content-Encoding", "deflate")]),
        "deflate-raw": (raw_deflate.compress(HTML) + raw_deflate.flush(), [("Content-Encoding", "deflate")]),
        "br": (brotli.compress(HTML), [("Content-Encoding", "br")]),
        "zstd": (zstandard.ZstdCompressor().compress(HTML), [("Content-Encoding", "zstd")]),
        "chunked": (_chunked(HTML, 37), [("Transfer-Encoding", "chunked")]),
        "chunked-stored-dechunked": (HTML, [("Transfer-Encoding", "chunked")]),
        "chunked-gzip": (_chunked(gzip.compress(HTML), 50),
                         [("Transfer-Encoding", "chunked"), ("Content-Encoding", "gzip")]),
    }  # fmt: skip
    path = _warc(tmp_path, [(f"https://e.example/{k}", body, h) for k, (body, h) in cases.items()])
    recs, skips, counters = _records(path)
    assert (skips.skipped, counters.get("extract.not_chunked")) == (0, 1), skips.examples
    assert {r["metadata"]["url"].rsplit("/", 1)[1]: r["text"] for r in recs} == {k: TEXT for k in cases}


BROKEN = {
    "compress": (HTML, "Content-Encoding", "compress", "unsupported Content-Encoding: compress"),
    "chunked-gzip": (
        _chunked(HTML, 20),
        "Transfer-Encoding",
        "gzip, chunked",
        "Transfer-Encoding: gzip does not decompress",
    ),
    "bad-br": (HTML, "Content-Encoding", "br", "br does not decompress"),
    # brotli's header of an empty last block, then garbage: no error from the decoder, and no output
    "empty-br": (b";" + HTML, "Content-Encoding", "br", "br does not decompress"),
    "bad-zstd": (HTML, "Content-Encoding", "zstd", "zstd does not decompress"),
    "cut-gzip": (gzip.compress(HTML)[:-30], "Content-Encoding", "gzip", "gzip is truncated"),
    "bad-chunk": (
        b"5\r\n<html>zz\r\n0\r\n\r\n",
        "Transfer-Encoding",
        "chunked",
        "chunked has a chunk at byte 3 that is not 5 bytes",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_unsupported_or_broken_encodings_are_named_skips(tmp_path, case):
    body, header, value, reason = BROKEN[case]
    path = _warc(
        tmp_path, [(f"https://e.example/{case}", body, [(header, value)]), ("https://e.example/ok", HTML, [])]
    )
    recs, skips, _ = _records(path)
    assert [r["metadata"]["url"] for r in recs] == ["https://e.example/ok"]
    assert skips.skipped == 1
    assert re.search(
        rf"x\.warc\.gz: WARC record at byte offset 0 \(https://e\.example/{case}\): .*{reason}",
        skips.examples[0],
    )


def test_a_gzip_bomb_is_refused_without_inflating_it(tmp_path):
    """A 128 MiB page gzipped to ~130 KB: refused as over max_bytes (1 MiB) while the reader's peak RSS (its own
    process, measured by the kernel) grows by far less than the page."""
    import subprocess
    import sys
    import zlib

    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    zeros = b"\0" * 2**20
    bomb = (
        comp.compress(b"<html><body><p>") + b"".join(comp.compress(zeros) for _ in range(128)) + comp.flush()
    )
    path = _warc(tmp_path, [("https://bomb.example/", bomb, [("Content-Encoding", "gzip")]),
                            ("https://e.example/ok", HTML, [])])  # fmt: skip
    script = f"""
import resource, resiliparse.extract.html2text, resiliparse.parse.html, fastwarc
from schooner.data import SkipLog
from schooner.data.curation import ExtractConfig
from schooner.data.curation._warc import iter_pages
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
skips = SkipLog()
recs = list(iter_pages({str(path)!r}, ExtractConfig(max_bytes=2**20), on_error="skip", skips=skips, counters={{}}))
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(len(recs), skips.skipped, grew // 1024)
print(skips.examples[0])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    counts, example = out.splitlines()
    n, skipped, grew_mib = map(int, counts.split())
    assert (n, skipped) == (1, 1)
    assert "https://bomb.example/" in example and "max_bytes=1,048,576" in example
    assert grew_mib < 32, f"peak RSS grew {grew_mib} MiB reading a bomb of 128 MiB"


@pytest.mark.parametrize("on_error", ["skip", "raise"])
@pytest.mark.parametrize("bad", [b"abc", b"-"], ids=["suffix", "negative"])
def test_a_non_integer_warc_content_length_is_named(tmp_path, on_error, bad):
    from schooner.data import DataError
    from schooner.data.curation import WarcPage
    from schooner.data.curation._warc import warc_response

    recs = [warc_response(WarcPage(f"https://e.example/{i}", HTML)) for i in range(3)]
    n = recs[1].split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0]
    recs[1] = recs[1].replace(
        b"Content-Length: " + n, b"Content-Length: " + (n + bad if bad == b"abc" else bad + n), 1
    )
    path = tmp_path / "badlen.warc"
    path.write_bytes(b"".join(recs))
    if on_error == "raise":
        with pytest.raises(DataError, match=r"badlen\.warc: WARC record at byte offset \d+ .*Content-Length"):
            _records(path, on_error="raise")
        return
    got, skips, _ = _records(path)
    assert (
        skips.skipped >= 1 and "is not an integer" in skips.examples[0]
    )  # then defect 5: the stream is lost
    assert f"byte offset {len(recs[0])} (https://e.example/1)" in skips.examples[0]
    assert "https://e.example/0" in [r["metadata"]["url"] for r in got]


# ------------------------------------------------------------------ damaged gzip members


def _members(n: int) -> list[bytes]:
    from schooner.data.curation import WarcPage
    from schooner.data.curation._warc import warc_response

    pages = [_page(f"Paragraph number {i} with some words in it to keep.").encode() for i in range(n)]
    return [
        gzip.compress(warc_response(WarcPage(f"https://s.example/{i}", p)), mtime=0)
        for i, p in enumerate(pages)
    ]


@pytest.mark.parametrize("damage", ["corrupt", "cut"])
def test_a_damaged_gzip_member_is_a_named_skip_and_reading_resumes_at_the_next_member(tmp_path, damage):
    from schooner.data import DataError

    members = _members(10)
    bad = bytearray(members[4])
    if damage == "corrupt":
        bad[40:60] = b"\0" * 20
    else:
        bad = bad[: len(bad) // 2]
    parts = [*members[:4], bytes(bad), *members[5:]]
    path = tmp_path / "x.warc.gz"
    path.write_bytes(b"".join(parts))
    starts = [sum(map(len, parts[:i])) for i in range(len(parts))]
    recs, skips, _ = _records(path)
    assert [r["metadata"]["url"] for r in recs] == [
        f"https://s.example/{i}" for i in (0, 1, 2, 3, 5, 6, 7, 8, 9)
    ]
    assert [r["metadata"]["warc_offset"] for r in recs] == starts[:4] + starts[5:]
    assert skips.skipped == 1
    assert f"x.warc.gz: gzip member at byte offset {starts[4]} is unreadable" in skips.examples[0]
    assert f"reading resumes at byte offset {starts[5]}" in skips.examples[0]
    with pytest.raises(DataError, match=f"gzip member at byte offset {starts[4]} is unreadable"):
        _records(path, on_error="raise")


def test_a_damaged_last_gzip_member_is_named_with_its_offset(tmp_path):
    members = _members(3)
    bad = bytearray(members[2])
    bad[40:60] = b"\0" * 20
    path = tmp_path / "x.warc.gz"
    path.write_bytes(b"".join(members[:2]) + bytes(bad))
    recs, skips, _ = _records(path)
    assert len(recs) == 2 and skips.skipped == 1
    assert (
        f"gzip member at byte offset {len(members[0]) + len(members[1])} is unreadable" in skips.examples[0]
    )
    assert "to the end of the file" in skips.examples[0]


def test_garbage_between_gzip_members_is_a_named_skip_and_no_record_is_lost(tmp_path):
    members = _members(6)
    parts = [*members[:3], b"this is not a gzip member\r\n" * 3, *members[3:]]
    path = tmp_path / "x.warc.gz"
    path.write_bytes(b"".join(parts))
    starts = [sum(map(len, parts[:i])) for i in range(len(parts))]
    recs, skips, _ = _records(path)
    assert [r["metadata"]["warc_offset"] for r in recs] == starts[:3] + starts[4:]
    assert skips.skipped == 1
    assert f"gzip member at byte offset {starts[3]} is unreadable" in skips.examples[0]
    assert f"reading resumes at byte offset {starts[4]}" in skips.examples[0]


def test_http_header_lines_split_only_at_newlines(tmp_path):
    # \x0c, \x1c and \x85 (latin-1 of cp1252's "…") are line breaks to str.splitlines, not to HTTP
    pages = [(f"https://e.example/{i}", HTML, [("X-Note", f"see{c}Content-Encoding: gzip")]) for i, c in
             enumerate("\x0c\x1c\x85")]  # fmt: skip
    recs, skips, _ = _records(_warc(tmp_path, pages))
    assert (skips.skipped, [r["text"] for r in recs]) == (0, [TEXT] * 3), skips.examples


def _with_warc_header(record: bytes, name: str, value: str) -> bytes:
    """A WARC record with one more WARC header (the block, and so its digest, unchanged)."""
    head, sep, block = record.partition(b"\r\n\r\n")
    return head + f"\r\n{name}: {value}".encode() + sep + block


def test_content_type_from_warc_identified_payload_type_else_sniffed_from_the_body(tmp_path):
    from schooner.data.curation import WarcPage
    from schooner.data.curation._warc import warc_response

    pdf = b"%PDF-1.4 not html at all\n" * 20
    records = [
        warc_response(WarcPage("https://e.example/undeclared", b"\n  " + HTML, content_type="")),
        warc_response(WarcPage("https://e.example/undeclared-doctype", b"<!DOCTYPE html>" + HTML, content_type="")),
        warc_response(WarcPage("https://e.example/undeclared-pdf", pdf, content_type="")),
        warc_response(WarcPage("https://e.example/undeclared-gzip", gzip.compress(HTML), content_type="",
                               extra_headers=(("Content-Encoding", "gzip"),))),
        _with_warc_header(
            warc_response(WarcPage("https://e.example/octet", HTML, content_type="application/octet-stream")),
            "WARC-Identified-Payload-Type", "text/html",
        ),
        _with_warc_header(
            warc_response(WarcPage("https://e.example/pdf-said-html", pdf, content_type="text/html")),
            "WARC-Identified-Payload-Type", "application/pdf",
        ),
    ]  # fmt: skip
    path = tmp_path / "t.warc"
    path.write_bytes(b"".join(records))
    recs, skips, counters = _records(path)
    assert skips.skipped == 0, skips.examples
    got = {r["metadata"]["url"].rsplit("/", 1)[1]: (r["text"], r["metadata"]["content_type"]) for r in recs}
    assert got == {
        k: (TEXT, "text/html") for k in ("undeclared", "undeclared-doctype", "undeclared-gzip", "octet")
    }
    assert (counters["warc.skipped_content_type"], counters["warc.sniffed_html"]) == (2, 3)


@pytest.mark.parametrize("damage", ["garbage", "length-short", "length-long"])
def test_damage_in_a_plain_warc_is_a_named_skip_and_reading_resumes_at_the_next_record(tmp_path, damage):
    from schooner.data.curation import WarcPage
    from schooner.data.curation._warc import warc_response

    pages = [_page(f"Paragraph number {i} with some words in it to keep.").encode() for i in range(8)]
    recs = [warc_response(WarcPage(f"https://s.example/{i}", p)) for i, p in enumerate(pages)]
    n = int(re.search(rb"Content-Length: (\d+)\r\n", recs[3]).group(1))
    if damage == "garbage":  # between records 3 and 4
        parts = [*recs[:4], b"this is not a warc record\r\n\r\n", *recs[4:]]
        kept, bad, resume = [0, 1, 2, 3, 4, 5, 6, 7], 4, 5
    else:  # record 3 declares 50 bytes too few (junk before record 4) or too many (into record 4's header)
        wrong = str(n - 50 if damage == "length-short" else n + 50).encode()
        parts = [
            *recs[:3],
            recs[3].replace(b"Content-Length: %d" % n, b"Content-Length: " + wrong, 1),
            *recs[4:],
        ]
        kept, bad, resume = (
            ([0, 1, 2, 3, 4, 5, 6, 7], None, 4)
            if damage == "length-short"
            else ([0, 1, 2, 3, 5, 6, 7], None, 5)
        )
    path = tmp_path / "x.warc"
    path.write_bytes(b"".join(parts))
    starts = [sum(map(len, parts[:i])) for i in range(len(parts))]
    got, skips, _ = _records(path)
    # record 3 itself is read with the length it declares: cut short, or with the next record's header
    assert [r["metadata"]["url"] for r in got if r["metadata"]["url"] != "https://s.example/3"] == [
        f"https://s.example/{i}" for i in kept if i != 3
    ]
    assert skips.skipped == 1, skips.examples
    if bad is not None:
        assert f"x.warc: WARC data at byte offset {starts[bad]} is unreadable" in skips.examples[0]
    assert f"reading resumes at byte offset {starts[resume]}" in skips.examples[0]


def test_http_headers_ending_in_bare_newlines_end_at_the_first_blank_line(tmp_path):
    """HTTP headers written with bare LF line ends (some tools write them so) end at their first blank line
    (RFC 9112 §2.2: a recipient may take a bare LF as a line terminator), even when the body, a page saved
    on Windows, holds a CRLF blank line further on: the page's text is all its paragraphs (written here)."""
    import io

    from warcio.warcwriter import WARCWriter

    paras = [
        "First paragraph of a page saved with Windows line ends.",
        "Second paragraph, after a blank line.",
    ]
    body = (
        "<html><body>\r\n<p>" + paras[0] + "</p>\r\n\r\n<p>" + paras[1] + "</p>\r\n</body></html>"
    ).encode()
    http = b"HTTP/1.1 200 OK\nContent-Type: text/html; charset=utf-8\n\n" + body
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=False)
    rec = writer.create_warc_record(
        "https://e.example/lf", "warcinfo", payload=io.BytesIO(http), length=len(http),
        warc_content_type="application/http; msgtype=response",
    )  # fmt: skip
    rec.rec_headers.replace_header("WARC-Type", "response")
    writer.write_record(rec)
    path = tmp_path / "lf.warc"
    path.write_bytes(buf.getvalue())
    recs, skips, _ = _records(path)
    assert skips.skipped == 0, skips.examples
    assert [r["text"] for r in recs] == ["\n\n".join(paras)]
