"""Damaged WARC files written by an independent writer (warcio, one gzip member per record, as crawlers write
them): a damaged member of a large page is one named skip, never a failed task, and every bad record is listed
by its reason. Expected records come from warcio reading the undamaged file, never from the code under test."""

from __future__ import annotations

import io
import random

import pytest

pytest.importorskip("resiliparse")
pytest.importorskip("warcio")

from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from schooner.data import DataError, SkipLog, read_shards
from schooner.data.curation import ExtractConfig, warc_dataset
from schooner.data.curation._warc import iter_pages


def _html(rng: random.Random, i: int, size: int) -> bytes:
    """A page of about `size` bytes of random words: it compresses ~2x, so its gzip member is large too."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    paras, n = [], 0
    while n < size:
        p = " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(60)) + "."
        paras.append(f"<p>{p}</p>")
        n += len(p) + 7
    return f"<html><head><title>Page {i}</title></head><body><h1>Page {i}</h1>{''.join(paras)}</body></html>".encode()


def _warcio_file(bodies: list[bytes]) -> tuple[bytes, list[int]]:
    """A gzip WARC written by warcio (one member per record) and each member's start, plus the file's end."""
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    starts = []
    for i, body in enumerate(bodies):
        starts.append(buf.tell())
        http = StatusAndHeaders(
            "200 OK",
            [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body)))],
            protocol="HTTP/1.1",
        )
        rec = writer.create_warc_record(
            f"https://w.example/{i}",
            "response",
            payload=io.BytesIO(body),
            length=len(body),
            http_headers=http,
        )
        writer.write_record(rec)
    return buf.getvalue(), [*starts, buf.tell()]


def _warcio_records(data: bytes) -> list[tuple[int, str, str]]:
    """`(offset, record id, url)` of each response, as warcio reads them."""
    out = []
    it = ArchiveIterator(io.BytesIO(data))
    for rec in it:
        if rec.rec_type == "response":
            rid = rec.rec_headers.get_header("WARC-Record-ID").strip("<>")
            out.append((it.get_record_offset(), rid, rec.rec_headers.get_header("WARC-Target-URI")))
    return out


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """Six pages, page 3 of ~400 KB; 64 random bytes in the middle of page 3's compressed member."""
    rng = random.Random(29)
    bodies = [_html(rng, i, 400_000 if i == 3 else 3000) for i in range(6)]
    data, starts = _warcio_file(bodies)
    assert starts[4] - starts[3] > 150_000  # the big page's member, compressed
    expected = _warcio_records(data)  # from the undamaged file
    bad = bytearray(data)
    mid = (starts[3] + starts[4]) // 2
    bad[mid : mid + 64] = bytes(rng.randrange(256) for _ in range(64))
    path = tmp_path_factory.mktemp("warc") / "big.warc.gz"
    path.write_bytes(bytes(bad))
    return {"path": path, "starts": starts, "expected": expected, "bodies": bodies}


def test_a_damaged_member_of_a_large_page_is_one_named_skip(damaged):
    path, starts, expected = damaged["path"], damaged["starts"], damaged["expected"]
    skips, counters = SkipLog(), {}
    recs = list(iter_pages(str(path), ExtractConfig(), on_error="skip", skips=skips, counters=counters))
    want = [e for e in expected if e[2] != "https://w.example/3"]
    assert [(r["metadata"]["warc_offset"], r["id"], r["metadata"]["url"]) for r in recs] == want
    assert skips.skipped == 1
    msg = skips.examples[0]
    big_id = expected[3][1]
    assert msg.startswith(f"{path}: ")
    assert f"byte offset {starts[3]}" in msg and big_id in msg and "https://w.example/3" in msg
    assert f"reading resumes at byte offset {starts[4]}" in msg
    assert skips.reasons == {"damaged_stream": [msg]}
    with pytest.raises(DataError, match=f"byte offset {starts[3]}"):
        list(iter_pages(str(path), ExtractConfig(), on_error="raise", skips=SkipLog(), counters={}))


def test_a_warc_task_with_a_damaged_large_page_succeeds_and_reports_it(damaged, tmp_path, local_client):
    out = tmp_path / "pages"
    manifest = warc_dataset(str(damaged["path"])).write_jsonl(str(out), client=local_client, progress=False)
    got = [(r["metadata"]["warc_offset"], r["id"]) for r in read_shards(str(out))]
    assert got == [(o, rid) for o, rid, url in damaged["expected"] if url != "https://w.example/3"]
    errors = manifest["errors"]
    assert errors["skipped"] == 1
    [msg] = errors["reasons"]["damaged_stream"]
    assert (
        "big.warc.gz" in msg
        and damaged["expected"][3][1] in msg
        and f"byte offset {damaged['starts'][3]}" in msg
    )


def test_every_bad_record_is_listed_by_its_reason(tmp_path, local_client):
    """13 bad records of two reasons (more than the 5 examples a log keeps) and a damaged member: the
    manifest lists every one of them under its reason, each naming the file and its byte offset."""
    rng = random.Random(3)
    bodies = []
    kinds = []
    for i in range(24):
        if i % 3 == 1:
            bodies.append(b"\x00\x01binary" * 50)
            kinds.append("binary_body")
        elif i % 6 == 2:
            bodies.append(b"   \r\n ")
            kinds.append("empty_body")
        else:
            bodies.append(_html(rng, i, 2000 if i != 9 else 350_000))
            kinds.append("ok")
    data, starts = _warcio_file(bodies)
    bad = bytearray(data)
    mid = (starts[9] + starts[10]) // 2
    bad[mid : mid + 64] = bytes(rng.randrange(256) for _ in range(64))
    kinds[9] = "damaged_stream"
    path = tmp_path / "many.warc.gz"
    path.write_bytes(bytes(bad))
    manifest = warc_dataset(str(path)).write_jsonl(str(tmp_path / "out"), client=local_client, progress=False)
    errors = manifest["errors"]
    want = {k: [starts[i] for i, kk in enumerate(kinds) if kk == k] for k in set(kinds) - {"ok"}}
    assert errors["skipped"] == sum(map(len, want.values())) == 13 > len(errors["examples"])
    assert sorted(errors["reasons"]) == sorted(want)
    for kind, offsets in want.items():
        msgs = errors["reasons"][kind]
        assert len(msgs) == len(offsets), kind
        for msg, off in zip(msgs, offsets, strict=True):
            assert msg.startswith(f"{path}: ") and f"byte offset {off}" in msg, (kind, msg)
    kept = [r["metadata"]["warc_offset"] for r in read_shards(str(tmp_path / "out"))]
    assert kept == [starts[i] for i, k in enumerate(kinds) if k == "ok"]


@pytest.mark.parametrize("where", ["after", "between"])
def test_zero_padding_in_a_gzip_warc_is_not_damage(tmp_path, where):
    """Zero bytes after a gzip member are padding (gzip and Python's gzip module read past them), not a damaged
    member: every record is read, no skip, and on_error='raise' reads the file."""
    import gzip

    rng = random.Random(3)
    data, starts = _warcio_file([_html(rng, i, 3000) for i in range(2)])
    pad = b"\0" * 64
    padded = data + pad if where == "after" else data[: starts[1]] + pad + data[starts[1] :]
    expected = _warcio_records(gzip.decompress(padded))  # the reference: Python's gzip, then warcio
    assert len(expected) == 2
    path = tmp_path / "x.warc.gz"
    path.write_bytes(padded)
    skips, counters = SkipLog(), {}
    recs = list(iter_pages(str(path), ExtractConfig(), on_error="skip", skips=skips, counters=counters))
    assert [(r["id"], r["metadata"]["url"]) for r in recs] == [(e[1], e[2]) for e in expected]
    assert skips.skipped == 0, skips.reasons
    recs = list(iter_pages(str(path), ExtractConfig(), on_error="raise", skips=SkipLog(), counters={}))
    assert len(recs) == 2
