"""Fixtures for the client tests: one LocalClient per test process and one real local Ray per test run."""

from __future__ import annotations

from pathlib import Path

import pytest

from schooner.cluster.pytest_fixtures import local_client as local_client
from schooner.cluster.pytest_fixtures import ray_client as ray_client
from schooner.cluster.pytest_fixtures import s3_prefix as s3_prefix
from schooner.cluster.pytest_fixtures import s3_server as s3_server


@pytest.fixture(params=["local", "ray"])
def client(request):
    """Each contract test runs against both clients."""
    return request.getfixturevalue(f"{request.param}_client")


@pytest.fixture(params=["local", "file-url", "memory"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh storage root of each kind the storage layer reads: a local folder, a file:// URL, fsspec memory."""
    if request.param == "local":
        return str(tmp_path / "root")
    if request.param == "file-url":
        return f"file://{tmp_path}/root"
    import uuid

    return f"memory://test-root/{uuid.uuid4().hex}"


# Ray variants that run only with `-m slow` (the default suite's 10-minute budget; their local variants stay).
# A job's env and secrets on Ray stay covered by test_ray_client.py's test_secrets_travel_outside_runtime_env and
# test_secret_never_reaches_ray_log_files; functions mapped on Ray by test_map_yields_in_input_order[ray].
SLOW_ON_RAY = {
    "test_resource_env_is_in_place_when_the_worker_process_starts",
    "test_map_many_small_items",
    "test_env_reaches_job_and_secrets_stay_out_of_logs",
    "test_partial_functions_travel",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Marks on fixture params arrive too late for pytest-xdist's grouping; put the Ray variants of the
    # contract tests in the one process that holds the Ray instance explicitly.
    here = Path(__file__).parent
    for item in items:
        if here not in item.path.parents:
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("client") == "ray":
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.xdist_group("ray"))
            if item.originalname in SLOW_ON_RAY:
                item.add_marker(pytest.mark.slow)
