"""Test helpers for every package's Ray tests: one real local Ray per test process, shared.

Use it from a session fixture and mark the tests that need it, so pytest-xdist runs them in one process:

    @pytest.fixture(scope="session")
    def ray_client():
        from schooner.cluster.testing import shared_ray_client, shutdown_shared_ray
        yield shared_ray_client()
        shutdown_shared_ray()

    @pytest.mark.ray
    @pytest.mark.xdist_group("ray")
    def test_on_ray(ray_client): ...
"""

from __future__ import annotations

import os
import threading

from ._ray import RayClient

RAY_TEST_OPTIONS = {
    "num_cpus": 2,
    "include_dashboard": False,
    "object_store_memory": 300 * 10**6,
    "log_to_driver": True,
    "configure_logging": False,
}
"""How the shared test Ray is started (`ray.init` keyword arguments)."""

_START_ATTEMPTS = 3
_lock = threading.Lock()
_client: RayClient | None = None


def shared_ray_client() -> RayClient:
    """This process's local Ray (2 CPUs, no dashboard, 300 MB object store), started on first use."""
    global _client
    with _lock:
        if _client is None or _client._closed:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            for attempt in range(_START_ATTEMPTS):
                try:
                    _client = RayClient(address="local", **RAY_TEST_OPTIONS)
                    break
                except (
                    Exception
                ) as exc:  # Ray gives up on a raylet after 30 s, which a loaded CI box can exceed
                    import ray

                    ray.shutdown()
                    if attempt + 1 == _START_ATTEMPTS or "timed out during startup" not in str(exc):
                        raise
        assert _client is not None
        return _client


def shutdown_shared_ray() -> None:
    """Stop the shared local Ray (at the end of a test session). Idempotent."""
    global _client
    with _lock:
        if _client is not None:
            _client.shutdown()
            _client = None
