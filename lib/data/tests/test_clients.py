"""The same pipeline on LocalClient and on a real local RayClient gives byte-identical output."""

from __future__ import annotations

from pathlib import Path

import pytest

from schooner.data import Dataset

from .conftest import make_records


def _key(r: dict) -> int:
    return r["metadata"]["i"] % 11


def _reduce(key, records: list[dict]) -> dict:
    return {
        "id": f"g{key}",
        "text": " ".join(r["text"] for r in records),
        "source": "g",
        "metadata": {"n": len(records)},
    }


def _pipeline(tmp: Path) -> Dataset:
    recs = make_records(3000)
    return (
        Dataset.from_records(recs, num_shards=4)
        .filter(lambda r: r["metadata"]["mod7"] != 0, reason="mod7")
        .map(lambda r: {**r, "text": r["text"][::-1]})
        .group_by(_key, _reduce, num_partitions=3, memory_budget=50_000)
    )


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_local_and_ray_give_identical_outputs(tmp_path, local_client, ray_client) -> None:
    ds = _pipeline(tmp_path)
    m_local = ds.write_jsonl(str(tmp_path / "local"), client=local_client)
    m_ray = ds.write_jsonl(str(tmp_path / "ray"), client=ray_client)
    assert m_local == m_ray
    assert m_local["counters"]["group_by:_key.groups"] == 11
    assert m_local["counters"]["group_by:_key.spilled_runs"] > 0
    assert _files(tmp_path / "local") == _files(tmp_path / "ray")
    m_parquet = ds.write_parquet(str(tmp_path / "ray-pq"), client=ray_client)
    assert m_parquet["records"] == 11
    # collect: through spill files on Ray, passed back in memory by LocalClient workers, streamed inline
    got = ds.collect(client=ray_client, progress=False)
    assert (
        got == ds.collect(client=local_client, progress=False) == ds.collect(client="inline", progress=False)
    )
    assert len(got) == 11
