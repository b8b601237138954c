"""WET files (Common Crawl's extracted text: `conversion` records of plain text after a `warcinfo`) are read
as text records, as datatrove's WarcReader reads them; a file that is not a WARC file at all is a named skip
(`not_warc`), and an extract step that writes no page fails, saying what it read and skipped. WET files are
written by an independent writer (warcio)."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("resiliparse")
pytest.importorskip("warcio")

from warcio.warcwriter import WARCWriter

from schooner.data import DataError, SkipLog
from schooner.data.curation import ExtractConfig, warc_dataset
from schooner.data.curation._warc import iter_pages

TEXTS = [
    (
        "https://a.example/one",
        "First page title\nThe first page's extracted text, as Common Crawl keeps it.\n",
    ),
    ("https://b.example/two", "Zweite Seite\nDer Text der zweiten Seite mit Umlauten: äöü ß.\n"),
]


def _wet(path, texts=TEXTS) -> None:
    buf = io.BytesIO()
    w = WARCWriter(buf, gzip=True)
    w.write_record(
        w.create_warcinfo_record("x.warc.wet.gz", {"software": "test", "isPartOf": "CC-MAIN-test"})
    )
    for url, text in texts:
        body = text.encode("utf-8")
        rec = w.create_warc_record(url, "conversion", payload=io.BytesIO(body), length=len(body),
                                   warc_content_type="text/plain",
                                   warc_headers_dict={"WARC-Refers-To": "<urn:uuid:1>"})  # fmt: skip
        w.write_record(rec)
    path.write_bytes(buf.getvalue())


def test_a_wet_file_gives_its_text_records(tmp_path):
    _wet(tmp_path / "CC-MAIN-x-00000.warc.wet.gz")
    recs = warc_dataset(str(tmp_path)).collect(client="inline", progress=False)  # a folder: WET files found
    assert [(r["metadata"]["url"], r["text"]) for r in recs] == [(u, t.strip()) for u, t in TEXTS]
    assert all(r["metadata"]["content_type"] == "text/plain" and r["id"] for r in recs)


def test_a_file_that_is_not_a_warc_is_a_named_skip(tmp_path):
    import gzip

    for name, data in [("page.warc", b"<html><body>not a WARC</body></html>"),
                       ("notes.warc.gz", gzip.compress(b"just some text\n" * 50))]:  # fmt: skip
        skips, counters = SkipLog(), {}
        path = tmp_path / name
        path.write_bytes(data)
        assert (
            list(iter_pages(str(path), ExtractConfig(), on_error="skip", skips=skips, counters=counters))
            == []
        )
        assert skips.counts() == {"not_warc": 1}, (name, skips.to_dict())
        assert str(path) in skips.examples[0] and "not a WARC file" in skips.examples[0]
        with pytest.raises(DataError, match="not a WARC file"):
            list(iter_pages(str(path), ExtractConfig(), on_error="raise", skips=SkipLog(), counters={}))


@pytest.mark.parametrize("ext", [".gz", ".zst"])
def test_a_zero_byte_compressed_warc_is_cut_short_not_a_non_warc(tmp_path, ext):
    """0 bytes is no gzip/zstd stream (an empty one still has a header): a download cut short before its first
    byte, a `damaged_stream` to re-fetch; it was `not_warc`, "read HTML files with html_dataset"."""
    comp = {".gz": "gzip", ".zst": "zstd"}[ext]
    path = tmp_path / f"crawl.warc{ext}"
    path.write_bytes(b"")
    skips = SkipLog()
    assert list(iter_pages(str(path), ExtractConfig(), on_error="skip", skips=skips, counters={})) == []
    assert skips.counts() == {"damaged_stream": 1}, skips.to_dict()
    assert skips.examples[0] == (
        f"{path}: empty file (0 bytes), not a {comp} stream (an empty stream still has a header); the file is "
        "incomplete (an interrupted write or download): re-create or re-download it"
    )
    plain = tmp_path / "crawl.warc"  # a 0-byte plain file is still no WARC file (unchanged)
    plain.write_bytes(b"")
    skips = SkipLog()
    assert list(iter_pages(str(plain), ExtractConfig(), on_error="skip", skips=skips, counters={})) == []
    assert skips.counts() == {"not_warc": 1}, skips.to_dict()


def test_an_extract_step_that_writes_no_page_fails_naming_what_it_skipped(tmp_path):
    from schooner.cluster import StepRunner
    from schooner.data.curation.steps import extract_warc

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "page.warc").write_bytes(b"<html><body>not a WARC</body></html>")
    step = extract_warc("data/pages", str(tmp_path / "in"))
    result = StepRunner(prefix=str(tmp_path / "out")).run([step], raise_on_failure=False)
    assert not result.ok
    err = str(result[step].error)
    assert "no page" in err and "not_warc" in err and "page.warc" in err, err


def test_a_large_warc_is_split_into_shards_for_the_steps_after_it(tmp_path):
    """One WARC of large pages is several output shards (records in order, as one shard would hold them),
    so the rules step after it runs on several workers; small WARC files stay one shard each."""
    from schooner.cluster import StepRunner
    from schooner.data import read_shards
    from schooner.data.curation import WarcPage, write_warc
    from schooner.data.curation.steps import extract_warc, quality_rules

    words = [
        "the",
        "river",
        "runs",
        "under",
        "the",
        "old",
        "stone",
        "bridge",
        "and",
        "the",
        "town",
        "sleeps",
        "beside",
        "it",
    ]
    pages = []
    for i in range(12):
        body = " ".join(words[(i + j) % len(words)] + str(j % 97) for j in range(6000))
        pages.append(
            WarcPage(f"https://big.example/{i}", f"<html><body><p>{body}</p></body></html>".encode())
        )
    (tmp_path / "in").mkdir()
    write_warc(str(tmp_path / "in" / "big.warc.gz"), pages)
    small = [WarcPage(f"https://s.example/{i}", b"<html><body><p>" + b"A small page. " * 20 + b"</p></body></html>")
             for i in range(3)]  # fmt: skip
    write_warc(str(tmp_path / "in" / "small.warc.gz"), small)
    text = extract_warc("data/pages", str(tmp_path / "in"), max_shard_bytes=150_000)
    one = extract_warc("data/pages-one", str(tmp_path / "in"), max_shard_bytes=None)
    rules = quality_rules("attributes/rules", text, rules=("c4",))
    result = StepRunner(prefix=str(tmp_path / "out")).run([text, one, rules])
    assert result.ok
    split, whole = result[text].output_path, result[one].output_path
    from schooner.data._folders import list_shards

    assert len(list_shards(whole)) == 2  # one per WARC file
    assert len(list_shards(split)) >= 4  # ~500 KB of records over 150 KB shards
    assert [r["id"] for r in read_shards(split)] == [r["id"] for r in read_shards(whole)]
    assert len(list_shards(result[rules].output_path)) == len(list_shards(split))
