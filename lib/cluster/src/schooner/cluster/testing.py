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

import contextlib
import os
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._ray import RayClient

RAY_TEST_OPTIONS: dict[str, Any] = {
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
            _claim_the_run()
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            # A failed start's process handles may be collected at any moment of the next attempt (not only in
            # `_cleanup_failed_start`), and each warns "subprocess N is still running", an error under `-W
            # error` that failed this fixture's setup in CI although the retry succeeded: the handles are
            # Ray's, their processes are killed by `_cleanup_failed_start`, so that warning is off while starting.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                for attempt in range(_START_ATTEMPTS):
                    before = _children()
                    try:
                        with _patient_raylet_wait():
                            _client = RayClient(address="local", **RAY_TEST_OPTIONS).connect()
                        break
                    except Exception as exc:
                        # Ray gives up on a raylet that has not registered after 30 s, which a loaded machine
                        # can exceed; then try again, after cleaning up what the failed start left behind.
                        if attempt + 1 == _START_ATTEMPTS or "timed out during startup" not in str(exc):
                            _cleanup_failed_start(before)
                            raise
                    # Outside the handler: the exception's frames (which hold Ray's process handles) are gone.
                    _cleanup_failed_start(before)
        assert _client is not None
        return _client


def _run_marker() -> Path | None:
    run, worker = os.environ.get("PYTEST_XDIST_TESTRUNUID"), os.environ.get("PYTEST_XDIST_WORKER")
    if not run or not worker:
        return None
    import tempfile

    return Path(tempfile.gettempdir()) / f"schooner-shared-ray-{run}"


def _claim_the_run() -> None:
    """Under pytest-xdist, refuse a second worker of the same run starting a Ray of its own: its Ray tests are
    not in the "ray" group (or the groups do not reach the scheduler: pytest 9.2 with pytest-xdist 3.8.0 did
    that silently), and the run pays for two Rays. A worker that died may be replaced: only a live one counts."""
    marker = _run_marker()
    if marker is None:
        return
    import psutil

    worker, me = os.environ["PYTEST_XDIST_WORKER"], f"{os.environ['PYTEST_XDIST_WORKER']} {os.getpid()}"
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)  # atomic: two workers starting at once
    except FileExistsError:
        owner, _, pid = marker.read_text().partition(" ")
        if owner != worker and pid.isdigit() and psutil.pid_exists(int(pid)):
            raise RuntimeError(
                f"xdist worker {worker} is starting the shared test Ray, but worker {owner} (pid {pid}) of the "
                f"same run already has one ({marker}): mark every test that uses it "
                '`@pytest.mark.xdist_group("ray")` and run with `--dist loadgroup` (the suite\'s setting), so '
                "that one Ray serves the whole run"
            ) from None
        marker.write_text(me)
    else:
        with os.fdopen(fd, "w") as f:
            f.write(me)


@contextlib.contextmanager
def _patient_raylet_wait(seconds: float = 150.0) -> Iterator[None]:
    """Give a starting raylet `seconds` (not Ray's fixed 30 s) to register, while we start the test Ray.

    On a 2-core machine that is also running the rest of the test suite, Ray's Python agents can take longer
    than 30 s to come up, and `ray.init` then fails for no fault of the code under test. Ray's start-up loop
    polls `ray._private.services.get_node` until it stops raising; we make each poll wait patiently instead.
    """
    import ray._private.services as services

    original = services.get_node

    def patient(*args: object, **kwargs: object) -> object:
        deadline = time.monotonic() + seconds
        while True:
            try:
                return original(*args, **kwargs)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    services.get_node = patient
    try:
        yield
    finally:
        services.get_node = original


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _cleanup_failed_start(before: set[int]) -> None:
    """Stop the processes a failed `ray.init` started (it forgets them) and drop its process handles quietly."""
    import gc

    import psutil
    import ray

    ray.shutdown()
    ray_dir = os.path.dirname(ray.__file__)
    leftovers = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.pid not in before and (ray_dir in " ".join(p.cmdline()) or p.name().startswith("ray::")):
                leftovers.append(p)
    for p in leftovers:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(leftovers, timeout=30)
    # Ray's Popen handles of those processes would warn "still running" whenever they are collected (an
    # error under `-W error`, in whichever test runs then): mark them finished. The collection itself runs
    # with that warning off: a handle already unreachable is collected here, and on a loaded machine its
    # process can outlive the wait above (seen in CI: five handles of a failed start, collected while their
    # processes were still being killed, failed the next Ray test's setup).
    # Every handle the failed start made is reaped, not only those of the processes killed here: a process
    # that had already exited (a zombie: its command line can no longer be read, so it is not among the
    # leftovers) warned the same way when its handle was collected.
    killed = {p.pid for p in leftovers}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
        for obj in gc.get_objects():
            if isinstance(obj, subprocess.Popen) and obj.returncode is None and obj.pid not in before:
                with contextlib.suppress(Exception):
                    if obj.pid in killed:
                        obj.wait(timeout=1)
                    else:
                        obj.poll()  # reaps an exited process; leaves a running one alone
        gc.collect()


def shutdown_shared_ray() -> None:
    """Stop the shared local Ray (at the end of a test session). Idempotent."""
    global _client
    with _lock:
        if _client is not None:
            _client.shutdown()
            _client = None
            marker = _run_marker()
            with contextlib.suppress(OSError):
                if marker is not None and marker.read_text().endswith(f" {os.getpid()}"):
                    marker.unlink()


_s3_lock = threading.Lock()
_s3_server: S3Server | None = None


def shared_s3_server() -> S3Server:
    """This process's S3 test server, started on first use and stopped when the process exits; its `env()` is
    set in `os.environ` for the process's lifetime (s3fs's cached default filesystem is dropped, so clients
    made from the environment from now on reach this server)."""
    global _s3_server
    with _s3_lock:
        if _s3_server is None:
            import atexit

            server = S3Server().start()
            atexit.register(server.stop)
            os.environ.update(server.env())
            with contextlib.suppress(ImportError):
                import s3fs

                s3fs.S3FileSystem.clear_instance_cache()
            _s3_server = server
        return _s3_server


class S3Server:
    """A real S3 API server for tests: moto's server mode in its own process, on a free local port.

    `env()` is what clients need (endpoint, fake credentials, region): botocore, s3fs and fsspec honour
    `AWS_ENDPOINT_URL`. Used as a context manager; `bucket(name)` creates a bucket and returns `s3://name`.
    """

    def __init__(self) -> None:
        import socket
        import sys

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self._proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "schooner-test",
            "AWS_SECRET_ACCESS_KEY": "schooner-test-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def start(self) -> S3Server:
        import urllib.request

        self._proc = subprocess.Popen(
            self._cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=2).close()
                return self
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"the S3 test server ({' '.join(self._cmd)}) did not come up"
                    ) from None
                time.sleep(0.2)

    def bucket(self, name: str) -> str:
        import fsspec

        fs = fsspec.filesystem(
            "s3", endpoint_url=self.endpoint, key="schooner-test", secret="schooner-test-secret"
        )
        fs.mkdir(name)
        return f"s3://{name}"

    def stop(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, 9)
            self._proc.wait(timeout=10)
            self._proc = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
