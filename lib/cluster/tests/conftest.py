"""Fixtures for the client tests: one LocalClient per test process and one real local Ray per test run."""

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


_RAY = pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.xdist_group("ray")], id="ray")


@pytest.fixture(params=["local", _RAY])
def client(request):
    """Each contract test runs against both clients."""
    return request.getfixturevalue(f"{request.param}_client")
