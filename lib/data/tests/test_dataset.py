"""The lazy Dataset pipeline: fused ops and counters, stage boundaries, the disk shuffle, sources, retries."""

from __future__ import annotations

import collections
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schooner.cluster import JobError
from schooner.data import Dataset, list_shards, read_records, write_records

from .conftest import make_records


def _py_pipeline(recs: list[dict]) -> list[dict]:
    out = []
    for r in recs:
        if r["metadata"]["mod7"] == 3:
            continue
        r = {**r, "text": r["text"].upper()}
        for k in range(r["metadata"]["i"] % 3):
            out.append({**r, "id": f"{r['id']}-{k}"})
    return out


def _upper(r: dict) -> dict:
    return {**r, "text": r["text"].upper()}


def _explode(r: dict) -> list[dict]:
    return [{**r, "id": f"{r['id']}-{k}"} for k in range(r["metadata"]["i"] % 3)]


def _not_mod3(r: dict) -> bool:
    return r["metadata"]["mod7"] != 3


def test_fused_ops_and_counters(tmp_path, local_client) -> None:
    recs = make_records(700)
    ds = (
        Dataset.from_records(recs, num_shards=5)
        .filter(_not_mod3, reason="mod3")
        .map(_upper)
        .flat_map(_explode)
    )
    expected = _py_pipeline(recs)
    assert ds.collect(client=local_client) == expected
    m = ds.write_jsonl(str(tmp_path / "o"), client=local_client)
    assert [r for s in list_shards(str(tmp_path / "o")) for r in read_records(s)] == expected
    kept = sum(1 for r in recs if r["metadata"]["mod7"] != 3)
    assert m["counters"] == {
        "dropped.mod3": 700 - kept,
        "filter:_not_mod3.in": 700,
        "filter:_not_mod3.out": kept,
        "flat_map:_explode.in": kept,
        "flat_map:_explode.out": len(expected),
        "map:_upper.in": kept,
        "map:_upper.out": kept,
        "read.records": 700,
        "read.skipped": 0,
    }
    assert m["num_shards"] == 5 and m["records"] == len(expected)


def test_select_map_shard_take_count(local_client) -> None:
    recs = make_records(100)
    ds = Dataset.from_records(recs, num_shards=4)
    assert ds.select(["id", "text"]).collect(client="inline") == [
        {"id": r["id"], "text": r["text"]} for r in recs
    ]
    numbered = ds.map_shard(lambda it: ({**r, "text": str(k)} for k, r in enumerate(it)), name="number")
    assert [r["text"] for r in numbered.collect(client="inline")] == [str(k) for k in range(25)] * 4
    assert ds.take(37).collect(client=local_client) == recs[:37]
    assert ds.take(0).count(client="inline") == 0
    assert ds.filter(lambda r: r["metadata"]["i"] >= 60).take(10).collect(client="inline") == recs[60:70]
    assert ds.count(client=local_client) == 100


def test_map_returning_none_is_a_clear_error() -> None:
    ds = Dataset.from_records(make_records(3)).map(lambda r: None, name="oops")
    with pytest.raises(
        ValueError, match=r"map 'oops' returned None for record id='r00000'; use filter\(\) to drop"
    ):
        ds.count(client="inline")


def test_reshard_keeps_order_and_balances(tmp_path) -> None:
    recs = make_records(103)
    ds = Dataset.from_records(recs, num_shards=2).filter(lambda r: r["metadata"]["i"] % 10 != 0).reshard(4)
    m = ds.write_parquet(str(tmp_path / "o"), client="inline")
    kept = [r for r in recs if r["metadata"]["i"] % 10 != 0]
    assert [s["records"] for s in m["shards"]] == [
        len(kept) * (i + 1) // 4 - len(kept) * i // 4 for i in range(4)
    ]
    assert [r for s in list_shards(str(tmp_path / "o")) for r in read_records(s)] == kept


def _sum_reducer(key, records: list[dict]) -> dict:
    return {
        "id": f"k{key}",
        "text": ",".join(r["id"] for r in records),
        "source": "grouped",
        "metadata": {"n": len(records), "total": sum(r["metadata"]["i"] for r in records)},
    }


def _expected_groups(recs: list[dict], mod: int) -> dict[str, dict]:
    groups: dict[int, list[dict]] = collections.defaultdict(list)
    for r in recs:
        groups[r["metadata"]["i"] % mod].append(r)
    return {f"k{k}": _sum_reducer(k, v) for k, v in groups.items()}


def _key37(r: dict) -> int:
    return r["metadata"]["i"] % 37


def test_group_by_spills_past_memory_budget_and_stays_correct(tmp_path, local_client) -> None:
    recs = make_records(6000)
    ds = Dataset.from_records(recs, num_shards=3)
    tiny = ds.group_by(_key37, _sum_reducer, num_partitions=2, memory_budget=20_000, name="g")
    m = tiny.write_jsonl(str(tmp_path / "tiny"), client=local_client)
    out_tiny = [r for s in list_shards(str(tmp_path / "tiny")) for r in read_records(s)]
    assert {r["id"]: r for r in out_tiny} == _expected_groups(recs, 37)
    # The shuffle data (~1 MB) is 50x the budget: both reduce tasks sorted and merged runs on disk.
    assert m["counters"]["g.spilled_runs"] >= 2 * 10
    assert m["counters"]["g.groups"] == 37 and m["counters"]["g.in"] == 6000
    roomy = ds.group_by(_key37, _sum_reducer, num_partitions=2, name="g").write_jsonl(
        str(tmp_path / "roomy"), client=local_client
    )
    assert roomy["counters"]["g.spilled_runs"] == 0
    out_roomy = [r for s in list_shards(str(tmp_path / "roomy")) for r in read_records(s)]
    assert out_roomy == out_tiny  # same groups in the same order either way
    assert not [n for n in os.listdir(tmp_path / "tiny") if n.startswith(".work")]  # shuffle files cleaned up


def test_deduplicate_keeps_first_in_input_order(local_client) -> None:
    recs = make_records(500)
    for r in recs:
        r["text"] = f"text {r['metadata']['i'] % 50}"
    ds = Dataset.from_records(recs, num_shards=4).deduplicate("text", memory_budget=5_000)
    out = ds.collect(client=local_client)
    assert sorted(r["id"] for r in out) == [r["id"] for r in recs[:50]]
    assert ds.collect(client="inline") == out  # deterministic across clients and runs


def test_from_files_parquet_splits_and_pushdown(tmp_path, local_client) -> None:
    n = 2000
    table = pa.table(
        {"text": [f"doc {i}" for i in range(n)], "id": [str(i) for i in range(n)], "score": list(range(n))}
    )
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=250)
    ds = Dataset.from_files(str(tmp_path / "a.parquet"), filter=[("score", ">=", 1600)])
    assert len(ds._splits_fn()) == 2  # row groups 6 and 7 only; the rest are pruned by statistics
    out = ds.collect(client=local_client)
    assert [r["id"] for r in out] == [str(i) for i in range(1600, n)]
    assert out[0]["metadata"] == {"score": 1600}
    whole = Dataset.from_files(str(tmp_path / "a.parquet"), split_row_groups=False)
    assert len(whole._splits_fn()) == 1 and whole.count(client="inline") == n


def test_from_files_mixed_formats_and_record_folders(tmp_path) -> None:
    recs = make_records(60)
    write_records(recs[:30], str(tmp_path / "folder"), format="jsonl.gz", num_shards=3)
    (tmp_path / "loose").mkdir()
    with open(tmp_path / "loose" / "x.jsonl", "w") as f:
        for r in recs[30:]:
            f.write(json.dumps(r) + "\n")
    ds = Dataset.from_files([str(tmp_path / "folder"), str(tmp_path / "loose" / "*.jsonl")])
    assert ds.collect(client="inline") == recs


def test_memory_filesystem_inline() -> None:
    recs = make_records(40)
    url = "memory://schooner-test/dataset"
    m = Dataset.from_records(recs, num_shards=2).write_parquet(url, client="inline")
    assert m["records"] == 40
    assert Dataset.from_files(url).collect(client="inline") == recs


def test_from_hf_saved_folder(tmp_path, local_client) -> None:
    datasets = pytest.importorskip("datasets")
    rows = {"content": [f"row {i} ✓" for i in range(50)], "label": [i % 2 for i in range(50)]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "hf"))
    out = Dataset.from_hf(str(tmp_path / "hf"), text_field="content", num_shards=3).collect(
        client=local_client
    )
    assert [r["text"] for r in out] == rows["content"]
    assert [r["metadata"] for r in out] == [{"label": i % 2} for i in range(50)]
    assert {r["source"] for r in out} == {"hf"}
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)})
    dd.save_to_disk(str(tmp_path / "hfd"))
    with pytest.raises(Exception, match=r"holds splits \['train'\]; pass split="):
        Dataset.from_hf(str(tmp_path / "hfd"), text_field="content").count(client="inline")
    assert (
        Dataset.from_hf(str(tmp_path / "hfd"), split="train", text_field="content").count(client="inline")
        == 50
    )


class _FlakyOnce:
    """Fails with an I/O error the first time it sees each shard's first record (a marker file per shard)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, r: dict) -> dict:
        marker = os.path.join(self.folder, r["id"])
        if r["metadata"]["i"] % 25 == 0 and not os.path.exists(marker):
            open(marker, "w").close()
            raise OSError(f"transient failure on {r['id']}")
        return r


def test_per_shard_retries(tmp_path, local_client) -> None:
    recs = make_records(100)
    (tmp_path / "m1").mkdir()
    ds = Dataset.from_records(recs, num_shards=4).map(_FlakyOnce(str(tmp_path / "m1")))
    m = ds.write_jsonl(str(tmp_path / "o"), client=local_client, retries=1)
    assert m["records"] == 100
    assert [r for s in list_shards(str(tmp_path / "o")) for r in read_records(s)] == recs
    (tmp_path / "m2").mkdir()
    ds = Dataset.from_records(recs, num_shards=4).map(_FlakyOnce(str(tmp_path / "m2")))
    with pytest.raises(JobError, match="transient failure on r00000"):
        ds.write_jsonl(str(tmp_path / "o2"), client=local_client, retries=0)


def test_sources_as_dataset(tmp_path) -> None:
    ds = Dataset.from_source("python-docs", num_shards=3)
    m = ds.filter(lambda r: r["metadata"]["kind"] == "topic", reason="not-topic").write_jsonl(
        str(tmp_path / "t"), client="inline"
    )
    from pydoc_data.topics import topics

    assert m["records"] == sum(1 for v in topics.values() if v.strip())
    assert m["counters"]["dropped.not-topic"] + m["records"] == m["counters"]["read.records"]


def test_bad_arguments() -> None:
    ds = Dataset.from_records(make_records(2))
    with pytest.raises(ValueError, match=r"take\(n\) needs an integer n >= 0, got n=-1"):
        ds.take(-1)
    with pytest.raises(ValueError, match="num_shards must be an integer >= 1, got num_shards=0"):
        ds.reshard(0)
    with pytest.raises(ValueError, match="compression must be None, 'zst' or 'gz', got compression='lz4'"):
        ds.write_jsonl("/tmp/never", compression="lz4")
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip', got on_error='ignore'"):
        Dataset.from_files("x.jsonl", on_error="ignore")
    # checked when the dataset is built, not only once a text file is read (a jsonl input never was)
    with pytest.raises(ValueError, match="text_mode must be 'file' or 'lines', got text_mode='line'"):
        Dataset.from_files("x.jsonl", text_mode="line")
    with pytest.raises(ValueError, match="Execution.retries must be an integer >= 0"):
        ds.count(retries=-1)


def _first_line(r: dict) -> str:
    return r["text"].split("\n", 1)[0][:40]


def _count_group(key, records: list[dict]) -> dict:
    return {
        "id": str(key),
        "text": str(len(records)),
        "source": "count",
        "metadata": {"ids": [r["id"] for r in records]},
    }


@pytest.mark.slow
def test_group_by_many_megabytes_through_a_tiny_budget(tmp_path, local_client) -> None:
    from schooner.data.sources import iter_source

    code = list(iter_source("python-code")) * 3  # ~30 MB through a 256 KB budget
    ds = Dataset.from_records(code, num_shards=6).group_by(
        _first_line, _count_group, num_partitions=4, memory_budget=2**18, name="g"
    )
    m = ds.write_jsonl(str(tmp_path / "o"), client=local_client)
    expected: dict[str, list[str]] = collections.defaultdict(list)
    for r in code:
        expected[json.dumps(_first_line(r))].append(r["id"])
    got = {
        json.dumps(r["id"]): r["metadata"]["ids"]
        for s in list_shards(str(tmp_path / "o"))
        for r in read_records(s)
    }
    assert got == expected
    assert m["counters"]["g.spilled_runs"] > 50


def test_take_counts_the_records_it_passes_on(tmp_path) -> None:
    """Each input shard's task stops at n records, the stage then keeps the first n of them: the manifest's
    `take[n].out` is n, the records written (it said 4 x 10 = 40 for 10 records)."""
    recs = make_records(100)
    m = (
        Dataset.from_records(recs, num_shards=4)
        .filter(lambda r: r["metadata"]["i"] % 2 == 0, reason="odd")
        .take(10)
        .write_jsonl(str(tmp_path / "out"), progress=False)
    )
    assert m["records"] == 10
    assert m["counters"]["take[10].out"] == 10
    m = (
        Dataset.from_records(recs[:7], num_shards=3)
        .take(10)
        .write_jsonl(str(tmp_path / "few"), progress=False)
    )
    assert m["records"] == 7 and m["counters"]["take[10].out"] == 7
