"""Record folders on an object store: a real S3 API server (moto, its own process) as the destination of
writers, a sharded pipeline run in worker processes, and a shuffle whose scratch runs live on the bucket."""

from __future__ import annotations

import fsspec
import pytest

from schooner.data import Dataset, list_shards, read_manifest, read_records, write_records

from .conftest import make_records


def _read(folder: str) -> list[dict]:
    return [r for s in list_shards(folder) for r in read_records(s)]


def _key5(r: dict) -> int:
    return r["metadata"]["i"] % 5


def _count(key: int, recs: list[dict]) -> dict:
    return {"id": f"k{key}", "text": str(len(recs)), "source": "count", "metadata": {"n": len(recs)}}


@pytest.mark.parametrize("fmt", ["jsonl.zst", "jsonl.gz", "parquet"])
def test_record_shards_round_trip_on_s3(s3_prefix: str, fmt: str) -> None:
    recs = make_records(50)
    out = f"{s3_prefix}/recs-{fmt}"
    write_records(recs, out, format=fmt, num_shards=3)
    assert _read(out) == recs
    assert read_manifest(out)["records"] == 50


def test_a_pipeline_writes_its_shards_to_s3_from_worker_processes(s3_prefix: str, local_client) -> None:
    recs = make_records(300)
    src = f"{s3_prefix}/src"
    write_records(recs, src, num_shards=4)
    out = f"{s3_prefix}/even"
    m = (
        Dataset.from_files(f"{src}/part-*")
        .filter(lambda r: r["metadata"]["i"] % 2 == 0)
        .write_jsonl(out, client=local_client)
    )
    assert _read(out) == [r for r in recs if r["metadata"]["i"] % 2 == 0]
    assert m["records"] == 150
    # Rewriting the folder with fewer shards removes the old ones from the bucket.
    Dataset.from_records(recs[:10], num_shards=1).write_jsonl(out, client="inline")
    fs = fsspec.filesystem("s3")
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(out.removeprefix("s3://"), refresh=True))
    assert [n for n in names if n.startswith("part-")] == ["part-00000-of-00001.jsonl.zst"]
    assert _read(out) == recs[:10]


def test_a_shuffle_with_its_work_folder_on_s3(s3_prefix: str, local_client) -> None:
    recs = make_records(400)
    out = f"{s3_prefix}/groups"
    ds = Dataset.from_records(recs, num_shards=3).group_by(
        _key5, _count, num_partitions=2, memory_budget=4_000
    )
    ds.write_jsonl(out, client=local_client)
    assert sorted((r["id"], r["metadata"]["n"]) for r in _read(out)) == [(f"k{k}", 80) for k in range(5)]
