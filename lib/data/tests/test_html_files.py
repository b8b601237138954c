"""HTML files read into page records (`html_dataset`), as the WARC reader reads the same pages."""

from __future__ import annotations

import gzip
import resource

import pytest
import zstandard

from schooner.data import DataError
from schooner.data.curation import ExtractConfig, WarcPage, html_dataset, warc_dataset, write_warc

PAGE = """<!DOCTYPE html><html><head><meta charset="{charset}"><title>{title}</title></head><body>
<nav><a href="/">Home</a> | <a href="/docs">Docs</a></nav>
<div class="cookie-banner">We use cookies. <button>Accept</button></div>
<main><h1>{title}</h1><p>{body}</p><pre><code>def f(x):
    return x + 1</code></pre>
<table><tr><th>name</th><th>value</th></tr><tr><td>alpha</td><td>1</td></tr></table></main>
<footer>Copyright 2026 Example Inc. All rights reserved.</footer></body></html>"""

PAGES = {
    "index.html": ("utf-8", "Start here", "The quick brown fox jumps over the lazy dog, twice over."),
    "guide/intro.htm": (
        "windows-1252",
        "Café “intro”",
        "Prices in € and – dashes – read as a browser reads them.",
    ),
    "guide/deep/ref.html.gz": ("utf-8", "Reference", "Gzipped pages are read through their compression."),
    "guide/api.xhtml.zst": ("utf-8", "API", "Zstandard-compressed pages are read as well, naturally."),
}


def _write(folder, name, data: bytes) -> None:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".gz"):
        data = gzip.compress(data)
    elif name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)


def _html(name: str) -> bytes:
    charset, title, body = PAGES[name]
    return PAGE.format(charset=charset, title=title, body=body).encode(charset)


@pytest.fixture()
def site(tmp_path):
    folder = tmp_path / "site"
    for name in PAGES:
        _write(folder, name, _html(name))
    _write(folder, "notes.txt", b"not a page")  # not HTML: not read
    _write(folder, "bad/empty.html", b"  \n")
    _write(folder, "bad/binary.html", b"\x00\x01\x02PNG" * 20)
    (folder / "bad" / "broken.html.gz").write_bytes(b"this is not gzip")  # named .gz, not compressed
    return folder


def test_a_folder_of_pages_reads_like_the_same_pages_in_a_warc(site, tmp_path) -> None:
    m = html_dataset(str(site), base_url="https://docs.example/", files_per_task=2).write_jsonl(
        str(tmp_path / "out"), progress=False
    )
    from schooner.data import read_shards

    got = {r["metadata"]["url"]: r for r in read_shards(str(tmp_path / "out"))}
    urls = {f"https://docs.example/{n.removesuffix('.gz').removesuffix('.zst')}" for n in PAGES}
    assert set(got) == urls
    # The same pages served over HTTP and read from a WARC give the same text and title.
    warc = tmp_path / "same.warc.gz"
    write_warc(
        str(warc), [WarcPage(url=f"https://w/{n}", body=_html(n), content_type="text/html") for n in PAGES]
    )
    from_warc = {
        r["metadata"]["url"].removeprefix("https://w/"): r for r in warc_dataset(str(warc)).collect()
    }
    for name in PAGES:
        record = got[f"https://docs.example/{name.removesuffix('.gz').removesuffix('.zst')}"]
        assert (record["text"], record["metadata"]["title"]) == (
            from_warc[name]["text"],
            from_warc[name]["metadata"]["title"],
        )
        assert PAGES[name][2] in record["text"] and "cookies" not in record["text"]
    assert got["https://docs.example/guide/intro.htm"]["metadata"]["title"] == "Café “intro”"
    assert got["https://docs.example/guide/intro.htm"]["metadata"]["charset"] == "cp1252"
    # Bad pages are counted and named by file; the text file is not read.
    assert m["errors"]["skipped"] == 3 and m["counters"]["html.files"] == 7
    examples = "\n".join(m["errors"]["examples"])
    for file, reason in (
        ("empty.html", "empty page"),
        ("binary.html", "binary body"),
        ("broken.html.gz", "gzip"),
    ):
        assert any(file in e and reason in e for e in m["errors"]["examples"]), (file, examples)
    # Ids are stable: a second read gives the same ids.
    again = {
        r["metadata"]["url"]: r["id"]
        for r in html_dataset(str(site), base_url="https://docs.example/").collect()
    }
    assert again == {u: r["id"] for u, r in got.items()} and len(set(again.values())) == 4


def test_on_error_raise_names_the_file(site) -> None:
    with pytest.raises(DataError, match=r"empty\.html: HTML file: empty page"):
        html_dataset(str(site / "bad" / "empty.html"), on_error="raise").collect()


def test_a_compressed_page_is_never_inflated_past_max_bytes(tmp_path) -> None:
    """A 400 KB gzip file inflating to 400 MiB is refused after reading max_bytes + 1, not inflated whole."""
    bomb = tmp_path / "bomb.html.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        chunk = b"<p>" + b"a" * (2**20 - 3)
        for _ in range(400):
            f.write(chunk)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    m = html_dataset(str(bomb), ExtractConfig(max_bytes=2**20)).count(client="inline")  # RSS of this process
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert m == 0
    assert grown_mib < 100, f"peak RSS grew by {grown_mib:.0f} MiB"


def _long_page(n: int) -> bytes:
    paras = "".join(
        f"<p>Paragraph number {i} of the saved page, with words {i * 7919 % 10007} to count as content.</p>"
        for i in range(n)
    )
    return f"<html><head><title>T</title></head><body><article>{paras}</article></body></html>".encode()


@pytest.mark.parametrize("suffix", [".zst", ".gz"])
def test_a_page_of_concatenated_frames_is_read_whole(tmp_path, suffix) -> None:
    """A page compressed as two zstd frames (or gzip members), as `zstd -d` / `gunzip` read it: both
    halves. The zstd reader stopped at the first frame: 20 of the 40 paragraphs, with no skip."""
    page = _long_page(40)
    pack = zstandard.ZstdCompressor().compress if suffix == ".zst" else gzip.compress
    half = len(page) // 2
    (tmp_path / f"a.html{suffix}").write_bytes(pack(page[:half]) + pack(page[half:]))
    (tmp_path / "plain.html").write_bytes(page)
    got = {
        r["metadata"]["file"].rsplit("/", 1)[-1]: r["text"]
        for r in html_dataset(str(tmp_path)).collect(client="inline", progress=False)
    }
    assert got[f"a.html{suffix}"].count("Paragraph number") == 40
    assert got[f"a.html{suffix}"] == got["plain.html"]


@pytest.mark.parametrize("suffix", [".zst", ".gz"])
def test_a_truncated_compressed_page_is_named_not_read_in_part(tmp_path, suffix) -> None:
    """A page whose compressed file was cut short (an interrupted download) is a `damaged_stream` skip
    naming the file; a .zst one became a record of its first part (3,138 of 6,000 paragraphs), uncounted,
    or an "empty page" when cut inside the first block."""
    pack = zstandard.ZstdCompressor().compress if suffix == ".zst" else gzip.compress
    for name, n in (("big", 6000), ("small", 40)):
        data = pack(_long_page(n))
        (tmp_path / f"{name}.html{suffix}").write_bytes(data[: len(data) * 2 // 3])
    m = html_dataset(str(tmp_path)).write_jsonl(str(tmp_path / "out"), progress=False)
    assert m["records"] == 0
    assert {k: len(v) for k, v in m["errors"]["reasons"].items()} == {"damaged_stream": 2}
    with pytest.raises(DataError, match=rf"big\.html\{suffix}: HTML file: .*(truncated|ended before)"):
        html_dataset(str(tmp_path / f"big.html{suffix}"), on_error="raise").collect(client="inline")


@pytest.mark.parametrize("suffix", [".zst", ".gz"])
def test_a_truncated_compressed_page_says_truncated_and_to_re_create_or_re_download_it(
    tmp_path, suffix
) -> None:
    """As a WARC file's message does: a .gz page cut short said `does not decompress as gzip (Compressed file
    ended before ...)` with only `pass on_error='skip'`; the fix is a whole copy of the file."""
    pack = zstandard.ZstdCompressor().compress if suffix == ".zst" else gzip.compress
    data = pack(_long_page(40))
    (tmp_path / f"cut.html{suffix}").write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(DataError) as info:
        html_dataset(str(tmp_path / f"cut.html{suffix}"), on_error="raise").collect(client="inline")
    message = str(info.value)
    assert f"cut.html{suffix}: HTML file: truncated {'gzip' if suffix == '.gz' else 'zstd'} stream" in message
    assert "the file is incomplete (an interrupted write or download): re-create or re-download it" in message
    assert "on_error='skip'" in message, message  # still: skip such pages, counted


@pytest.mark.parametrize("suffix", [".zst", ".gz"])
def test_a_zero_byte_compressed_page_is_cut_short_not_an_empty_page(tmp_path, suffix) -> None:
    """0 bytes is no gzip or zstd stream (an empty one still has a header): a file cut short before its
    first byte, a `damaged_stream` skip as a .zst one was; a 0-byte .gz one was an "empty page" (`empty_body`).
    A whole empty stream is an empty page, as a 0-byte plain file is."""
    pack = zstandard.ZstdCompressor().compress if suffix == ".zst" else gzip.compress
    (tmp_path / f"zero.html{suffix}").write_bytes(b"")
    (tmp_path / f"empty.html{suffix}").write_bytes(pack(b""))
    (tmp_path / "plain.html").write_bytes(b"")
    m = html_dataset(str(tmp_path)).write_jsonl(str(tmp_path / "out"), progress=False)
    reasons = m["errors"]["reasons"]
    assert {k: len(v) for k, v in reasons.items()} == {"damaged_stream": 1, "empty_body": 2}, reasons
    [message] = reasons["damaged_stream"]
    assert f"zero.html{suffix}: HTML file: " in message and "empty file (0 bytes)" in message, message
    with pytest.raises(
        DataError, match=rf"zero\.html\{suffix}: HTML file: .*0 bytes.*not a (gzip|zstd) stream"
    ):
        html_dataset(str(tmp_path / f"zero.html{suffix}"), on_error="raise").collect(client="inline")
