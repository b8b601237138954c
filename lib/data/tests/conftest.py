"""Fixtures for schooner-data tests: one LocalClient per test process, one real local Ray per test run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from schooner.cluster import LocalClient


@pytest.fixture(scope="session")
def local_client() -> Iterator[LocalClient]:
    client = LocalClient(max_workers=2)
    yield client
    client.shutdown()


@pytest.fixture(scope="session")
def ray_client():
    """The process's shared local Ray (2 CPUs), shut down when the session ends."""
    from schooner.cluster.testing import shared_ray_client, shutdown_shared_ray

    yield shared_ray_client()
    shutdown_shared_ray()


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
