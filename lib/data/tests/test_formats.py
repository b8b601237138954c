"""Round trips through every format and compression, format detection, parquet splits/filters, fsspec."""

from __future__ import annotations

import datetime
import decimal
import gzip
import json
import os
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schooner.data import (
    WRITE_FORMATS,
    DataError,
    Dataset,
    ShardWriter,
    SkipLog,
    content_id,
    detect_format,
    list_shards,
    read_manifest,
    read_records,
    write_records,
)

from .conftest import make_records

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # any size: integers beyond 64 bits round-trip too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    max_leaves=12,
)
records_st = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.text(max_size=12),
            "text": st.text(),
            "source": st.text(max_size=8),
            "metadata": st.dictionaries(st.text(max_size=8), json_values, max_size=4),
        }
    ),
    max_size=12,
)


_BIG = [
    {"id": "b", "text": "t", "source": "s", "metadata": {"big": 2**70 + 1, "neg": -(2**65), "l": [2**64]}}
]


@pytest.mark.parametrize("fmt", WRITE_FORMATS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=records_st, num_shards=st.integers(1, 3))
@example(records=_BIG, num_shards=1)
def test_round_trip_every_format(fmt: str, records: list[dict], num_shards: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out")
        manifest = write_records(records, out, format=fmt, num_shards=num_shards)
        shards = list_shards(out)
        assert [os.path.basename(s) for s in shards] == [
            f"part-{i:05d}-of-{num_shards:05d}.{fmt}" for i in range(num_shards)
        ]
        back = [r for s in shards for r in read_records(s)]
        assert back == records
        assert manifest["records"] == len(records)
        assert manifest["bytes"] == sum(os.path.getsize(s) for s in shards)
        assert read_manifest(out) == manifest


@settings(max_examples=25, deadline=None)
@given(text=st.text(min_size=1), comp=st.sampled_from(["", ".gz", ".zst"]))
def test_text_file_round_trip(text: str, comp: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "doc.txt" + comp)
        raw = text.encode("utf-8")
        if comp == ".gz":
            raw = gzip.compress(raw, mtime=0)
        elif comp == ".zst":
            raw = zstandard.ZstdCompressor().compress(raw)
        with open(path, "wb") as f:
            f.write(raw)
        (rec,) = read_records(path, source="docs")
        assert rec == {
            "id": content_id(text, "docs", "doc.txt" + comp),
            "text": text,
            "source": "docs",
            "metadata": {"file": "doc.txt" + comp},
        }


def test_text_lines_mode(tmp_path) -> None:
    path = tmp_path / "lines.txt"
    path.write_bytes("first line\r\n\n  \nsecond ✓\nthird".encode())
    recs = list(read_records(str(path), text_mode="lines", source="s"))
    assert [(r["text"], r["metadata"]["line"]) for r in recs] == [
        ("first line", 1),
        ("second ✓", 4),
        ("third", 5),
    ]
    assert len({r["id"] for r in recs}) == 3


def test_foreign_layouts_are_normalised(tmp_path) -> None:
    path = tmp_path / "rows.jsonl"
    rows = [
        {"body": "hello", "doc_id": 7, "lang": "en"},
        {"body": "hi", "source": "web", "metadata": {"a": 1}, "x": [1]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    recs = list(read_records(str(path), text_field="body", id_field="doc_id"))
    assert recs[0] == {"id": "7", "text": "hello", "source": "rows", "metadata": {"lang": "en"}}
    assert recs[1] == {
        "id": content_id("hi", "web"),
        "text": "hi",
        "source": "web",
        "metadata": {"a": 1, "x": [1]},
    }


def test_json_array_file(tmp_path) -> None:
    path = tmp_path / "arr.json"
    path.write_text(json.dumps([{"text": "a", "id": "1"}, {"text": "b", "id": "2"}]))
    assert [r["text"] for r in read_records(str(path))] == ["a", "b"]
    lines = tmp_path / "lines.json"
    lines.write_text('{"text": "a"}\n{"text": "b"}\n')
    assert [r["text"] for r in read_records(str(lines))] == ["a", "b"]


def test_concatenated_frames_and_members(tmp_path) -> None:
    z = tmp_path / "two.jsonl.zst"
    c = zstandard.ZstdCompressor()
    z.write_bytes(c.compress(b'{"text": "a"}\n') + c.compress(b'{"text": "b"}\n'))
    assert [r["text"] for r in read_records(str(z))] == ["a", "b"]
    g = tmp_path / "two.jsonl.gz"
    g.write_bytes(gzip.compress(b'{"text": "a"}\n') + gzip.compress(b'{"text": "b"}'))
    assert [r["text"] for r in read_records(str(g))] == ["a", "b"]


def test_detect_format() -> None:
    assert detect_format("a/b.jsonl.zst") == ("jsonl", "zstd")
    assert detect_format("b.JSONL.GZ") == ("jsonl", "gzip")
    assert detect_format("b.parquet") == ("parquet", None)
    assert detect_format("b.md") == ("text", None)
    with pytest.raises(ValueError, match=r"b\.csv: cannot tell the format from the file name"):
        detect_format("b.csv")


def test_writes_are_deterministic(tmp_path) -> None:
    recs = make_records(500)
    for fmt in WRITE_FORMATS:
        write_records(recs, str(tmp_path / "a" / fmt), format=fmt, num_shards=2)
        write_records(recs, str(tmp_path / "b" / fmt), format=fmt, num_shards=2)
        for name in os.listdir(tmp_path / "a" / fmt):
            if name.startswith("part-") or name == "manifest.json":
                assert (tmp_path / "a" / fmt / name).read_bytes() == (
                    tmp_path / "b" / fmt / name
                ).read_bytes(), name


def test_parquet_columns_row_groups_and_filter_pushdown(tmp_path) -> None:
    from schooner.data._parquet import row_groups

    n = 1000
    table = pa.table(
        {
            "doc": [f"text {i}" for i in range(n)],
            "key": list(range(n)),
            "lang": ["en" if i % 2 else "de" for i in range(n)],
        }
    )
    path = str(tmp_path / "t.parquet")
    pq.write_table(table, path, row_group_size=100)
    assert row_groups(path) == list(range(10))
    # Statistics prune the row groups that cannot match: key >= 750 lives in row groups 7, 8 and 9.
    assert row_groups(path, [("key", ">=", 750)]) == [7, 8, 9]
    recs = list(
        read_records(
            path, text_field="doc", id_field="key", filter=[("key", ">=", 750), ("lang", "==", "en")]
        )
    )
    assert [int(r["id"]) for r in recs] == [i for i in range(750, n) if i % 2]
    rg3 = list(read_records(path, text_field="doc", row_groups=[3], columns=["doc"]))
    assert [r["text"] for r in rg3] == [f"text {i}" for i in range(300, 400)]
    assert all(r["metadata"] == {} for r in rg3)  # only the chosen columns were read
    with pytest.raises(ValueError, match=r"columns \['nope'\] not in the file"):
        list(read_records(path, text_field="doc", columns=["nope"]))


def test_parquet_written_shards_split_by_row_group(tmp_path) -> None:
    from schooner.data._parquet import row_groups

    recs = make_records(250)
    with ShardWriter(str(tmp_path / "x.parquet"), row_group_size=100) as w:
        w.write_many(recs)
    assert row_groups(str(tmp_path / "x.parquet")) == [0, 1, 2]
    assert [r for g in (0, 1, 2) for r in read_records(str(tmp_path / "x.parquet"), row_groups=[g])] == recs


def test_parquet_row_groups_are_bounded_by_bytes_too(tmp_path) -> None:
    from schooner.cluster import LocalClient

    # 40 documents of 10,000 characters with a 25,000-character bound: a row group closes once it holds
    # 25,000 or more, so every 3 documents, whatever the record bound.
    recs = [
        {"id": str(i), "text": chr(97 + i % 26) * 10_000, "source": "s", "metadata": {}} for i in range(40)
    ]
    with ShardWriter(str(tmp_path / "x.parquet"), row_group_size=1000, row_group_bytes=25_000) as w:
        w.write_many(recs)
    meta = pq.ParquetFile(tmp_path / "x.parquet").metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [3] * 13 + [1]
    ds = Dataset.from_records(recs, num_shards=1)
    ds.write_parquet(
        str(tmp_path / "out"), row_group_bytes=25_000, client=LocalClient(max_workers=1), progress=False
    )
    back = Dataset.from_files(str(tmp_path / "out"))
    assert back.count(client=LocalClient(max_workers=1), progress=False) == 40
    assert len(back._splits_fn()) == 14  # one split per row group
    with pytest.raises(ValueError, match="row_group_bytes"):
        ds.write_parquet(str(tmp_path / "bad"), row_group_bytes=0)


def test_fsspec_memory_and_globs(tmp_path) -> None:
    recs = make_records(30)
    url = "memory://schooner-test/formats"
    write_records(recs, url, format="jsonl.gz", num_shards=3)
    shards = list_shards(url)
    assert shards == [f"{url}/part-{i:05d}-of-00003.jsonl.gz" for i in range(3)]
    assert [r for s in shards for r in read_records(s)] == recs
    assert list_shards("memory://schooner-test/formats/*-of-00003.jsonl.gz") == shards
    for i in range(3):
        (tmp_path / f"f{i}.jsonl").write_text(json.dumps({"text": str(i)}) + "\n")
    (tmp_path / "skip.bin").write_bytes(b"x")
    assert list_shards(str(tmp_path / "f*.jsonl")) == [str(tmp_path / f"f{i}.jsonl") for i in range(3)]
    assert list_shards(str(tmp_path)) == [str(tmp_path / f"f{i}.jsonl") for i in range(3)]
    with pytest.raises(FileNotFoundError, match="no files match"):
        list_shards(str(tmp_path / "*.parquet"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list_shards(str(tmp_path / "missing"))


def test_writer_rejects_bad_records(tmp_path) -> None:
    parquet_error = r"x\.parquet: record 0: a record has exactly the fields"
    with pytest.raises(ValueError, match=parquet_error), ShardWriter(str(tmp_path / "x.parquet")) as w:
        w.write({"text": "a"})
    json_error = r"x\.jsonl: record 1 \(id='b'\): not JSON-serialisable"
    with pytest.raises(ValueError, match=json_error), ShardWriter(str(tmp_path / "x.jsonl")) as w:
        w.write({"id": "a", "text": "a"})
        w.write({"id": "b", "text": "b", "metadata": {"x": {1, 2}}})
    assert os.listdir(tmp_path) == []  # nothing half-written, no temp files
    with pytest.raises(FileNotFoundError):
        list(read_records(str(tmp_path / "missing.jsonl")))


def test_read_shards_and_folder_errors(tmp_path) -> None:
    from schooner.data import read_shards

    recs = make_records(20)
    write_records(recs, str(tmp_path / "o"), format="jsonl.zst", num_shards=3)
    assert list(read_shards(str(tmp_path / "o"))) == recs
    assert list(read_shards(str(tmp_path / "o" / "part-0000[12]-*"))) == recs[6:]
    with pytest.raises(
        IsADirectoryError, match=r"o is a folder; read_records reads one file: use read_shards\("
    ):
        list(read_records(str(tmp_path / "o")))


@settings(max_examples=20, deadline=None)
@given(
    stamps=st.lists(
        st.datetimes(min_value=datetime.datetime(1900, 1, 1)) | st.none(), min_size=1, max_size=8
    ),
    amounts=st.lists(st.decimals(min_value=-(10**12), max_value=10**12, places=3), min_size=1, max_size=8),
    counts=st.lists(st.integers(-(2**100), 2**100), min_size=1, max_size=8),
)
def test_arrow_types_of_foreign_parquet_round_trip_as_json_values(stamps, amounts, counts) -> None:
    # Expected values are derived here from the Python values, independently of the reader's conversion.
    n = min(len(stamps), len(amounts), len(counts))
    table = pa.table({
        "text": [f"row {i}" for i in range(n)],
        "at": pa.array(stamps[:n], pa.timestamp("us")),
        "amount": pa.array(amounts[:n], pa.decimal128(16, 3)),
        "count": pa.array([decimal.Decimal(c) for c in counts[:n]], pa.decimal256(40, 0)),
    })  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        pq.write_table(table, os.path.join(d, "t.parquet"))
        recs = list(read_records(os.path.join(d, "t.parquet")))
        want = [
            {
                "at": None if t is None else f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond:06d}",
                "amount": f"{a + 0:.3f}",
                "count": c,
            }
            for t, a, c in zip(stamps[:n], amounts[:n], counts[:n])
        ]
        assert [r["metadata"] for r in recs] == want
        # and they survive a rewrite in every format
        for fmt in WRITE_FORMATS:
            write_records(recs, os.path.join(d, fmt), format=fmt)
            assert [r for s in list_shards(os.path.join(d, fmt)) for r in read_records(s)] == recs


@pytest.mark.parametrize(
    ("name", "compress"),
    [("a.jsonl", None), ("a.jsonl.gz", gzip.compress), ("a.jsonl.zst", zstandard.ZstdCompressor().compress),
     ("a.json", None)],
)  # fmt: skip
def test_utf8_byte_order_mark_is_not_data(tmp_path, name, compress) -> None:
    """A file written with a UTF-8 byte order mark (Windows tools, PowerShell's `Out-File`) holds the same
    records as without it, as pyarrow's JSON reader (Hugging Face datasets' json loader) reads it; the first
    record was a `DataError` ("BOM is not supported"), and `on_error='skip'` dropped it."""
    import io

    import pyarrow.json as pj

    body = b'{"id": "a", "text": "caf\xc3\xa9"}\r\n{"id": "b", "text": "y"}\r\n'
    if name.endswith(".json"):
        body = b'[{"id": "a", "text": "caf\xc3\xa9"}, {"id": "b", "text": "y"}]'
    data = b"\xef\xbb\xbf" + body
    (tmp_path / name).write_bytes(compress(data) if compress else data)
    skips = SkipLog()
    got = [(r["id"], r["text"]) for r in read_records(str(tmp_path / name), on_error="skip", skips=skips)]
    if not name.endswith(".json"):
        assert got == [(r["id"], r["text"]) for r in pj.read_json(io.BytesIO(data)).to_pylist()]
    assert got == [("a", "café"), ("b", "y")] and skips.skipped == 0


def test_utf8_byte_order_mark_of_text_files(tmp_path) -> None:
    """Text files: the mark is not text (Python's `utf-8-sig`), in either text mode."""
    data = "\ufeffhello\r\nworld\n".encode()
    (tmp_path / "a.txt").write_bytes(data)
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(data))
    want = data.decode("utf-8-sig")
    assert [r["text"] for r in read_records(str(tmp_path / "a.txt"))] == [want]
    assert [r["text"] for r in read_records(str(tmp_path / "b.txt.gz"), text_mode="lines")] == want.split(
        "\r\n"
    )[:1] + ["world"]


@pytest.mark.parametrize(
    "text_type",
    ["large_string", "string_view", "dictionary"],  # pandas categoricals are dictionary columns
)
def test_parquet_text_column_of_any_arrow_string_type(tmp_path, text_type) -> None:
    """A text column of another Arrow string type is text: its rows are what pyarrow reads (the reference),
    a null text one skipped record. It was a `DataError` "expected string" for the whole file, every row
    lost under `on_error='skip'` and counted as 1."""
    texts = ["first text", None, "third text"]
    col = pa.array(texts, pa.large_string() if text_type == "large_string" else pa.string())
    if text_type == "string_view":
        col = col.cast(pa.string_view())
    elif text_type == "dictionary":
        col = col.dictionary_encode()
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": col}), tmp_path / "a.parquet")
    assert pq.read_schema(tmp_path / "a.parquet").field("text").type == col.type
    ref = pq.read_table(tmp_path / "a.parquet").to_pylist()
    skips = SkipLog()
    got = [
        (r["id"], r["text"]) for r in read_records(str(tmp_path / "a.parquet"), on_error="skip", skips=skips)
    ]
    assert got == [(r["id"], r["text"]) for r in ref if r["text"] is not None]
    assert skips.skipped == 1 and "row 1" in skips.examples[0]


def test_gzip_zero_padding_is_not_damage(tmp_path) -> None:
    """Zero bytes after a gzip member (a file padded to a block size, by dd or a tape) are padding, as
    Python's gzip module and GNU gzip read them: the same records, no skip. They were a `DataError`
    "corrupt gzip data" (on_error='skip': a bogus skip), in text files too."""
    data = b'{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n'
    padded = gzip.compress(data[:25]) + b"\x00" * 100 + gzip.compress(data[25:]) + b"\x00" * (1 << 19)
    (tmp_path / "p.jsonl.gz").write_bytes(padded)
    assert gzip.decompress(padded) == data  # the reference
    skips = SkipLog()
    got = [
        (r["id"], r["text"]) for r in read_records(str(tmp_path / "p.jsonl.gz"), on_error="skip", skips=skips)
    ]
    assert got == [("a", "x"), ("b", "y")] and skips.skipped == 0
    (tmp_path / "t.txt.gz").write_bytes(gzip.compress(b"some text\n") + b"\x00" * 10)
    assert [r["text"] for r in read_records(str(tmp_path / "t.txt.gz"))] == ["some text\n"]
    # other bytes after a member are still damage, named
    (tmp_path / "g.jsonl.gz").write_bytes(gzip.compress(data) + b"\x00\x00garbage")
    with pytest.raises(DataError, match=r"g\.jsonl\.gz, line 3: corrupt gzip data"):
        list(read_records(str(tmp_path / "g.jsonl.gz")))


def test_pretty_printed_json_object_file(tmp_path) -> None:
    """A `.json` file holding one pretty-printed object is one record, as `json.load` reads it; it was
    "line 1: malformed JSON" (and under on_error='skip' one bogus skip per line, no record). An object
    that nests its records (SQuAD's `{"data": [...]}`) is one error saying so, not one per line."""
    rec = {"id": "a", "text": "one pretty record", "lang": "en"}
    (tmp_path / "one.json").write_text(json.dumps(rec, indent=2))
    (tmp_path / "one.json.gz").write_bytes(gzip.compress(json.dumps(rec, indent=4).encode()))
    for name in ("one.json", "one.json.gz"):
        got = list(read_records(str(tmp_path / name)))
        assert [(r["id"], r["text"], r["metadata"]) for r in got] == [
            ("a", "one pretty record", {"lang": "en"})
        ]
    nested = {"version": "1.1", "data": [{"title": "t", "paragraphs": []}]}
    (tmp_path / "squad.json").write_text(json.dumps(nested, indent=2))
    skips = SkipLog()
    assert list(read_records(str(tmp_path / "squad.json"), on_error="skip", skips=skips)) == []
    assert skips.skipped == 1
    assert (
        "squad.json" in skips.examples[0] and "no 'text' field (fields: data, version)" in skips.examples[0]
    )
    (tmp_path / "broken.json").write_text('{\n  "id": "a",\n  "text": "x"\n')
    with pytest.raises(DataError, match=r"broken\.json, line 4: malformed JSON"):
        list(read_records(str(tmp_path / "broken.json")))


def test_a_folder_lists_upper_case_names_and_subfolders_but_never_hidden_ones(tmp_path) -> None:
    """Extensions match in any case and subfolders are read (as warc_dataset/html_dataset read theirs); hidden
    files and folders (a step's `.schooner/` metadata) never are. Expected records are written here, one a
    file, so each file's records are known without the reader."""
    from schooner.data import read_shards

    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "sub2").mkdir()
    (d / ".schooner").mkdir()

    def rec(name: str) -> dict:
        return {"id": name, "text": f"text of {name}", "source": "t"}

    for rel in ["a.jsonl", "B.JSONL", "sub/c.jsonl", ".schooner/history.jsonl", ".hidden.jsonl"]:
        (d / rel).write_text(json.dumps(rec(rel)) + "\n")
    (d / "G2.JSONL.GZ").write_bytes(gzip.compress((json.dumps(rec("G2.JSONL.GZ")) + "\n").encode()))
    pq.write_table(
        pa.table({"id": ["sub2/P.PARQUET"], "text": ["text of sub2/P.PARQUET"]}), d / "sub2" / "P.PARQUET"
    )
    (d / ".schooner" / "status.json").write_text('{"status": "SUCCESS"}')
    want = sorted(["a.jsonl", "B.JSONL", "G2.JSONL.GZ", "sub/c.jsonl", "sub2/P.PARQUET"])
    listed = [os.path.relpath(p, d) for p in list_shards(str(d))]
    assert sorted(listed) == want
    assert sorted(r["id"] for r in read_shards(str(d))) == want
    assert sorted(r["id"] for r in Dataset.from_files(str(d)).collect(client="inline")) == want
    # a folder holding only subfolders is read too
    only = tmp_path / "only"
    (only / "x").mkdir(parents=True)
    (only / "x" / "r.jsonl").write_text(json.dumps(rec("x/r.jsonl")) + "\n")
    assert [r["id"] for r in read_shards(str(only))] == ["x/r.jsonl"]
    # a folder with only hidden data still holds none
    hid = tmp_path / "hid"
    (hid / ".schooner").mkdir(parents=True)
    (hid / ".schooner" / "starts.jsonl").write_text(json.dumps(rec("s")) + "\n")
    with pytest.raises(FileNotFoundError, match="holds no data files"):
        list_shards(str(hid))


def test_rows_without_text_are_read_with_text_field_none(tmp_path) -> None:
    """`text_field=None`: rows that hold other content (a chat file's `messages`, a preference file's
    `prompt`/`chosen`/`rejected`) are records with `text` "" (or the row's own string `text`) and their other
    fields in `metadata`; a row without an id gets the content id of the whole row, so rows stay apart."""
    rows = [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "yo"}]},
        {"messages": [{"role": "user", "content": "hi"}], "id": 3, "text": "user: hi"},
        {"prompt": "p", "chosen": "a", "rejected": "b", "text": None},
    ]
    jsonl = tmp_path / "chats.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"chats.jsonl, line 1: no 'text' field"):
        list(read_records(str(jsonl)))
    recs = list(read_records(str(jsonl), text_field=None))
    assert [r["text"] for r in recs] == ["", "", "user: hi", ""]
    assert recs[0]["metadata"] == {"messages": rows[0]["messages"]} and recs[2]["id"] == "3"
    assert recs[3]["metadata"] == {"prompt": "p", "chosen": "a", "rejected": "b"}
    assert len({r["id"] for r in recs}) == 4 and recs[0]["id"] != content_id("", "chats")
    assert [r["id"] for r in read_records(str(jsonl), text_field=None)] == [r["id"] for r in recs]
    with pytest.raises(DataError, match=r"line 1: field 'text' must be a string"):
        jsonl.write_text(json.dumps({"messages": [], "text": 5}) + "\n")
        list(read_records(str(jsonl), text_field=None))
    table = pa.table({"messages": [json.dumps(rows[0]["messages"])] * 2, "n": [1, 2]})
    pq.write_table(table, tmp_path / "chats.parquet")
    with pytest.raises(DataError, match=r"no column 'text'"):
        list(read_records(str(tmp_path / "chats.parquet")))
    recs = list(read_records(str(tmp_path / "chats.parquet"), text_field=None))
    assert [(r["text"], r["metadata"]["n"]) for r in recs] == [("", 1), ("", 2)] and recs[0]["id"] != recs[1][
        "id"
    ]
