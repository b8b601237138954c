"""Session fixtures shared by every package's tests. A conftest.py makes them available with
`from schooner.cluster.pytest_fixtures import local_client as local_client, ray_client as ray_client`.

Only test code imports this module (it imports pytest).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from ._local import LocalClient
from ._ray import RayClient

if TYPE_CHECKING:
    from .testing import S3Server


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


@pytest.fixture(scope="session")
def s3_server() -> Iterator[object]:
    """A real S3 API server (moto, its own process) shared by every test of this process; its `env()` is put
    into os.environ so every fsspec/s3fs client in the tests and in worker processes started afterwards
    reaches it. Several conftests import this fixture (each import is a fixture of its own to pytest), so the
    server is one per process (`shared_s3_server`): two servers would leave s3fs's cached filesystem, created
    from the environment, talking to the first while buckets are made on the second."""
    from .testing import shared_s3_server

    yield shared_s3_server()


@pytest.fixture
def s3_prefix(s3_server: S3Server) -> str:
    """A fresh bucket on the test S3 server, as a prefix `s3://bucket`."""
    import uuid

    return s3_server.bucket(f"test-{uuid.uuid4().hex[:12]}")
