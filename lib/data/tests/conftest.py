"""Fixtures for schooner-data tests: one LocalClient per test process, one real local Ray per test run."""

from __future__ import annotations

from schooner.cluster.pytest_fixtures import local_client as local_client
from schooner.cluster.pytest_fixtures import ray_client as ray_client
from schooner.cluster.pytest_fixtures import s3_prefix as s3_prefix
from schooner.cluster.pytest_fixtures import s3_server as s3_server


def make_records(n: int, *, source: str = "test", start: int = 0) -> list[dict]:
    """Deterministic small records with nested metadata."""
    return [
        {
            "id": f"r{i:05d}",
            "text": f"record {i} " + "ünïcödé ✓ " * (i % 5),
            "source": source,
            "metadata": {"i": i, "mod7": i % 7, "tags": [str(i % 3)], "nested": {"even": i % 2 == 0}},
        }
        for i in range(start, start + n)
    ]
