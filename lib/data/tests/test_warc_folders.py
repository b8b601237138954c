"""A folder of WARC files is read as `html_dataset` reads a folder of pages: recursively, names matched in any
case (a Common Crawl download keeps its `crawl-data/.../warc/` tree; some tools write `*.WARC.GZ`). Files are
written by an independent writer (warcio); the expected URLs are the ones written."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("resiliparse")
pytest.importorskip("warcio")

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from schooner.data.curation import warc_dataset


def _warc(path, url: str, *, gzip: bool = True) -> None:
    body = f"<html><body><p>The page at {url} has enough words to be kept as text.</p></body></html>".encode()
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=gzip)
    http = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
    writer.write_record(
        writer.create_warc_record(
            url, "response", payload=io.BytesIO(body), length=len(body), http_headers=http
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())


def test_a_folder_is_searched_recursively_and_names_match_in_any_case(tmp_path) -> None:
    crawl = tmp_path / "crawl"
    files = {
        "top.warc.gz": "https://e.example/top",
        "UPPER.WARC.GZ": "https://e.example/upper",
        "Mixed.Warc": "https://e.example/mixed",
        "segments/1/warc/deep.warc.gz": "https://e.example/deep",
        "segments/2/warc/deeper.warc": "https://e.example/deeper",
    }
    for name, url in files.items():
        _warc(crawl / name, url, gzip=name.lower().endswith(".gz"))
    (crawl / "segments" / "1" / "index.cdx").write_text("not a WARC file\n")
    records = warc_dataset(str(crawl)).collect(client="inline")
    assert sorted(r["metadata"]["url"] for r in records) == sorted(files.values())
    # each record names its file by its path under the folder: two `crawl.warc.gz` in two subfolders differ
    by_url = {r["metadata"]["url"]: r["metadata"]["warc_file"] for r in records}
    assert by_url == {url: name for name, url in files.items()}


def test_same_file_name_in_two_subfolders_gives_two_sets_of_records(tmp_path) -> None:
    _warc(tmp_path / "day1" / "crawl.warc.gz", "https://e.example/1")
    _warc(tmp_path / "day2" / "crawl.warc.gz", "https://e.example/2")
    records = warc_dataset(str(tmp_path)).collect(client="inline")
    assert sorted(r["metadata"]["warc_file"] for r in records) == ["day1/crawl.warc.gz", "day2/crawl.warc.gz"]


def test_a_folder_without_warc_files_is_an_error_naming_it(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        warc_dataset(str(tmp_path)).collect(client="inline")


@pytest.mark.parametrize("compress", [False, True])
def test_an_arc_file_in_the_folder_is_a_named_skip_that_says_it_is_arc(tmp_path, compress):
    """ARC, the Internet Archive's format before WARC (a `filedesc://` header, one line a record), is not read:
    the skip says so and how to convert it, rather than 'Invalid WARC header'."""
    import gzip

    from schooner.data import SkipLog
    from schooner.data.curation import ExtractConfig
    from schooner.data.curation._warc import iter_pages

    http = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n<html><body><p>An old page.</p></body></html>"
    arc = (
        b"filedesc://old.arc 0.0.0.0 20050614070144 text/plain 76\n1 0 Internet Archive\n"
        b"URL IP-address Archive-date Content-type Archive-length\n\n"
        + b"http://example.com/ 93.184.216.34 20050614070159 text/html %d\n" % len(http)
        + http
        + b"\n"
    )
    path = tmp_path / ("old.arc.gz" if compress else "old.arc")
    path.write_bytes(gzip.compress(arc) if compress else arc)
    skips = SkipLog()
    assert list(iter_pages(str(path), ExtractConfig(), on_error="skip", skips=skips, counters={})) == []
    assert skips.skipped == 1 and "ARC file" in skips.examples[0] and "arc2warc" in skips.examples[0]
