"""Session fixtures shared by every package's tests. A conftest.py makes them available with
`from schooner.cluster.pytest_fixtures import local_client as local_client, ray_client as ray_client`.

Only test code imports this module (it imports pytest).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ._local import LocalClient
from ._ray import RayClient


@pytest.fixture(scope="session")
def local_client() -> Iterator[LocalClient]:
    """One two-worker LocalClient per test process."""
    client = LocalClient(max_workers=2)
    yield client
    client.shutdown()


@pytest.fixture(scope="session")
def ray_client() -> Iterator[RayClient]:
    """The process's shared local Ray (2 CPUs), shut down when the session ends. Tests using it belong in
    `@pytest.mark.xdist_group("ray")` so one Ray serves the whole run."""
    from .testing import shared_ray_client, shutdown_shared_ray

    yield shared_ray_client()
    shutdown_shared_ray()
