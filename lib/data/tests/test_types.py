"""Types and sizes: integers beyond 64 bits, Arrow types of foreign parquet, typed metadata columns with
filters on them, errors that name the file, and output shard counts independent of the input."""

from __future__ import annotations

import datetime
import decimal
import gzip
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from schooner.data import (
    WRITE_FORMATS,
    DataError,
    Dataset,
    ShardWriter,
    list_shards,
    read_records,
    read_shards,
    write_records,
)

from .conftest import make_records

BIG = {"big": 2**70 + 1, "neg": -(2**64) - 3, "edge": 2**64, "list": [2**65, 1, -(2**63) - 1], "f": 1e21}


@pytest.mark.parametrize("fmt", WRITE_FORMATS)
def test_integers_beyond_64_bits_round_trip(tmp_path, fmt: str) -> None:
    recs = make_records(30)
    for r in recs:
        r["metadata"].update(BIG)
    write_records(recs, str(tmp_path / "o"), format=fmt, num_shards=2)
    back = list(read_shards(str(tmp_path / "o")))
    assert back == recs
    assert all(type(r["metadata"]["big"]) is int and type(r["metadata"]["f"]) is float for r in back)
    # Through the pipeline's spill files and shuffle too.
    ds = Dataset.from_files(str(tmp_path / "o")).reshard(3).deduplicate("id")
    assert sorted(ds.collect(client="inline"), key=lambda r: r["id"]) == recs


def test_big_integers_in_foreign_jsonl(tmp_path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "a", "n": 1180591620717411303425}\n{"text": "b", "n": 7}\n')
    assert [r["metadata"]["n"] for r in read_records(str(path))] == [2**70 + 1, 7]


def test_foreign_parquet_arrow_types_are_converted_at_read_time(tmp_path) -> None:
    ts = datetime.datetime(2024, 1, 2, 3, 4, 5, 123456)
    table = pa.table({
        "text": ["a", "b"],
        "when": pa.array([ts, None], pa.timestamp("us")),
        "when_utc": pa.array([1704164645123456789, 0], pa.timestamp("ns", tz="UTC")),
        "day": pa.array([datetime.date(2024, 1, 2), datetime.date(1970, 1, 1)], pa.date32()),
        "price": pa.array([decimal.Decimal("123.4500"), decimal.Decimal("-1")], pa.decimal128(10, 4)),
        "count": pa.array([decimal.Decimal(2**100), decimal.Decimal(3)], pa.decimal256(40, 0)),
        "nested": pa.array([{"at": ts}, {"at": None}], pa.struct([("at", pa.timestamp("us"))])),
        "cat": pa.array(["x", "y"]).dictionary_encode(),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "t.parquet")
    recs = list(read_records(str(tmp_path / "t.parquet")))
    assert recs[0]["metadata"] == {
        "when": "2024-01-02T03:04:05.123456", "when_utc": "2024-01-02T03:04:05.123456789+0000", "day": "2024-01-02",
        "price": "123.4500", "count": 2**100, "nested": {"at": "2024-01-02T03:04:05.123456"}, "cat": "x",
    }  # fmt: skip
    assert recs[1]["metadata"]["when"] is None and recs[1]["metadata"]["price"] == "-1.0000"
    # Such records write anywhere, and come back the same.
    out = Dataset.from_files(str(tmp_path / "t.parquet")).write_jsonl(str(tmp_path / "o"), client="inline")
    assert out["records"] == 2 and list(read_shards(str(tmp_path / "o"))) == recs


def test_columns_records_cannot_hold_fail_at_read_naming_file_and_column(tmp_path) -> None:
    pq.write_table(pa.table({"text": ["a", "b"], "blob": [b"\x00\x01", b"x"]}), tmp_path / "b.parquet")
    path = str(tmp_path / "b.parquet")
    with pytest.raises(
        DataError, match=rf"^{path}, row group 0: column 'blob' has type binary, .*columns=\["
    ):
        list(read_records(path))
    assert [r["metadata"] for r in read_records(path, columns=["text"])] == [{}, {}]
    pq.write_table(pa.table({"text": ["a"], "d": pa.array([5], pa.duration("s"))}), tmp_path / "d.parquet")
    with pytest.raises(DataError, match="column 'd' has type duration"):
        Dataset.from_files(str(tmp_path / "d.parquet")).write_parquet(str(tmp_path / "o"), client="inline")


def test_parquet_writer_errors_name_the_shard_and_record(tmp_path) -> None:
    path = str(tmp_path / "x.parquet")
    error = r"x\.parquet: record 1 \(id='b'\): metadata cannot be written as JSON"
    with pytest.raises(ValueError, match=error), ShardWriter(path, row_group_size=1) as w:
        w.write({"id": "a", "text": "a", "source": "s", "metadata": {}})
        w.write({"id": "b", "text": "b", "source": "s", "metadata": {"x": {1, 2}}})
    assert os.listdir(tmp_path) == []


def test_metadata_is_stored_as_typed_columns_with_statistics(tmp_path) -> None:
    recs = [
        {"id": str(i), "text": f"doc {i}", "source": "s",
         "metadata": {"lang": "en" if i < 500 else "de", "score": i / 10, "tags": [str(i % 3)]}}
        for i in range(1000)
    ]  # fmt: skip
    write_records(recs, str(tmp_path / "o"), format="parquet", row_group_size=250)
    path = list_shards(str(tmp_path / "o"))[0]
    schema = pq.read_schema(path)
    assert schema.field("metadata").type == pa.struct(
        [("lang", pa.string()), ("score", pa.float64()), ("tags", pa.list_(pa.string()))]
    )
    meta = pq.ParquetFile(path).metadata
    lang = next(
        i for i in range(meta.num_columns) if meta.row_group(0).column(i).path_in_schema == "metadata.lang"
    )
    stats = [meta.row_group(g).column(lang).statistics for g in range(4)]
    assert [(s.min, s.max) for s in stats] == [("en", "en"), ("en", "en"), ("de", "de"), ("de", "de")]
    ds = Dataset.from_files(
        str(tmp_path / "o"), filter=[("metadata.lang", "==", "de"), ("metadata.score", ">", 90)]
    )
    assert [s.row_groups for s in ds._splits_fn()] == [(3,)]  # lang prunes groups 0-1, score group 2
    assert [r["id"] for r in ds.collect(client="inline")] == [str(i) for i in range(901, 1000)]


def test_heterogeneous_metadata_round_trips_exactly(tmp_path) -> None:
    metas = [
        {"a": 1, "b": "x", "c": [1, 2], "d": {"k": 1.5}},
        {"a": 2, "b": None, "c": [], "e": True},  # an explicit null, an empty list, a new key
        {"a": "three", "c": [1, "mixed"], "d": {"k": 1.5, "extra": 1}},  # other types than the first rows'
        {},
        {"a": 2**80, "f": [[1], [2, 3]], "": 0},
    ]
    recs = [{"id": str(i), "text": "t", "source": "s", "metadata": m} for i, m in enumerate(metas * 40)]
    write_records(recs, str(tmp_path / "o"), format="parquet", row_group_size=3)
    assert list(read_shards(str(tmp_path / "o"))) == recs
    # A filter on a key that some records of a shard keep as JSON (another type) is refused for that shard.
    with pytest.raises(
        DataError, match=r"names metadata \['a'\], but some records of this shard hold values"
    ):
        Dataset.from_files(str(tmp_path / "o"), filter=[("metadata.a", "==", 1)]).count(client="inline")


def test_filters_on_fields_a_shard_lacks(tmp_path) -> None:
    a = [{"id": f"a{i}", "text": "t", "source": "s", "metadata": {"lang": "en"}} for i in range(5)]
    b = [{"id": f"b{i}", "text": "t", "source": "s", "metadata": {"other": 1}} for i in range(5)]
    Dataset.from_records(a + b, num_shards=2).write_parquet(str(tmp_path / "o"), client="inline")
    got = Dataset.from_files(str(tmp_path / "o"), filter=[("metadata.lang", "==", "en")]).collect(
        client="inline"
    )
    assert [r["id"] for r in got] == [r["id"] for r in a]  # shard b has no 'lang': none of its rows match
    pq.write_table(pa.table({"text": ["x"], "n": [1]}), tmp_path / "f.parquet")
    path = str(tmp_path / "f.parquet")
    with pytest.raises(DataError, match=rf"^{path}: the filter names column 'lang', which this file does not have "
                       r"\(columns: text, n\)"):  # fmt: skip
        list(read_records(path, filter=[("lang", "==", "en")]))


def test_output_shard_count_is_independent_of_the_input(tmp_path) -> None:
    recs = make_records(1000)
    write_records(recs, str(tmp_path / "one"), num_shards=1)  # one big input file
    m = Dataset.from_files(str(tmp_path / "one")).write_jsonl(
        str(tmp_path / "o3"), num_shards=3, client="inline"
    )
    assert [s["records"] for s in m["shards"]] == [333, 333, 334]
    assert list(read_shards(str(tmp_path / "o3"))) == recs
    size = sum(len(json.dumps(r)) for r in recs)
    m = Dataset.from_files(str(tmp_path / "one")).write_parquet(
        str(tmp_path / "ob"), shard_bytes=size // 5, client="inline"
    )
    assert 4 <= m["num_shards"] <= 6 and list(read_shards(str(tmp_path / "ob"))) == recs
    many = make_records(40)
    write_records(many, str(tmp_path / "many"), num_shards=20)
    m = Dataset.from_files(str(tmp_path / "many")).write_jsonl(
        str(tmp_path / "o2"), num_shards=2, client="inline"
    )
    assert m["num_shards"] == 2 and list(read_shards(str(tmp_path / "o2"))) == many
    m = write_records(recs, str(tmp_path / "wb"), shard_bytes=size // 4)
    assert 3 <= m["num_shards"] <= 5 and list(read_shards(str(tmp_path / "wb"))) == recs
    with pytest.raises(ValueError, match="pass num_shards or shard_bytes, not both"):
        Dataset.from_records(recs).write_jsonl(str(tmp_path / "x"), num_shards=2, shard_bytes=10)


def test_import_files_takes_a_shard_count(tmp_path) -> None:
    from schooner.cluster import StepRunner
    from schooner.data.steps import import_files

    write_records(make_records(90), str(tmp_path / "in"), format="jsonl", num_shards=1)
    step = import_files("data/imported", str(tmp_path / "in"), num_shards=3)
    out = StepRunner(prefix=str(tmp_path / "p"), quiet=True).run([step])[step].output_path
    assert len(list_shards(out)) == 3 and sum(1 for _ in read_shards(out)) == 90


def test_one_rule_for_files_without_records(tmp_path) -> None:
    (tmp_path / "e.jsonl").write_bytes(b"")
    (tmp_path / "e.txt").write_bytes(b"")
    (tmp_path / "e.jsonl.gz").write_bytes(gzip.compress(b"", mtime=0))
    (tmp_path / "e.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b""))
    for name in ("e.jsonl", "e.txt", "e.jsonl.gz", "e.jsonl.zst"):
        assert list(read_records(str(tmp_path / name))) == [], name  # no records: nothing, no error
    for name in ("z.jsonl.gz", "z.jsonl.zst"):  # 0 bytes is not a gzip/zstd stream at all
        (tmp_path / name).write_bytes(b"")
        with pytest.raises(
            DataError, match=rf"{name}, line 1: empty file \(0 bytes\), not a (gzip|zstd) stream"
        ):
            list(read_records(str(tmp_path / name)))


def test_explain_names_functions_not_addresses() -> None:
    def keep_long(r: dict) -> bool:
        return len(r["text"]) > 3

    ds = (
        Dataset.from_records(make_records(3)).filter(keep_long, reason="short").map(lambda r: r)
        .group_by("source", lambda k, rs: rs[0], num_partitions=4).take(2)
    )  # fmt: skip
    text = ds.explain()
    assert " at 0x" not in text and "object at" not in text
    assert "filter keep_long (as 'filter:keep_long'; drops count as dropped.short)" in text
    assert "group_by reducer=lambda key=source" in text and "partitions: 4" in text
    assert text.splitlines()[-1] == "  take 2 (stage boundary)"
