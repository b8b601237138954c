"""The client contract, run against both `LocalClient` and a real local `RayClient` (fixture `client`)."""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import pytest

from schooner.cluster import (
    Client,
    JobCancelledError,
    JobError,
    JobStatus,
    ResourceConfig,
    ResourcesUnavailableError,
    WorkerDiedError,
)

SECRET = "sk-test-4f9a8b7c6d5e"  # the value of a secret-looking variable; must never show in logs


# Module-level job functions: they travel to workers (by value, as pytest imports this file by path).
def add(a: int, b: int = 0) -> int:
    return a + b


def slow_identity(i: int, n: int = 8) -> int:
    time.sleep((n - i) * 0.03)  # later items finish first: map must still yield in input order
    return i * 10


def square(x: int) -> int:
    return x * x


def fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError(f"item {x} is bad")
    return x


def raise_custom() -> None:
    raise KeyError("missing-key-42")


def wait_forever(marker: str) -> None:
    Path(marker).write_text(str(os.getpid()))
    time.sleep(120)


def die_once_then_succeed(marker: str) -> str:
    """First attempt: record our pid and hang (the test SIGKILLs us); a retry finds the marker and returns."""
    if os.path.exists(marker):
        return f"recovered in {os.getpid()}"
    Path(marker).write_text(str(os.getpid()))
    time.sleep(120)
    return "never"


def kill_self_once(item: tuple[int, str]) -> int:
    x, marker_dir = item
    marker = os.path.join(marker_dir, f"died-{x}")
    if x == 2 and not os.path.exists(marker):
        Path(marker).write_text("")
        os.kill(os.getpid(), signal.SIGKILL)
    return x + 100


def flaky_once(item: tuple[int, str]) -> int:
    x, marker_dir = item
    marker = os.path.join(marker_dir, f"failed-{x}")
    if not os.path.exists(marker):
        Path(marker).write_text("")
        raise RuntimeError(f"transient failure on {x}")
    return -x


def show_env() -> tuple[int, str]:
    print(f"token is {os.environ['SCHOONER_TEST_API_TOKEN']}")
    print(f"colour is {os.environ['SCHOONER_TEST_COLOUR']}", flush=True)
    return len(os.environ["SCHOONER_TEST_API_TOKEN"]), os.environ["SCHOONER_TEST_COLOUR"]


def _wait_for_file(path: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear within {timeout} s")


def test_every_protocol_method_has_the_documented_signature(client):
    """`isinstance` against a runtime_checkable Protocol only checks that names exist; compare the
    signatures of what the runner and the steps call."""
    import inspect

    for name in ("submit", "map", "check", "shutdown"):
        want = inspect.signature(getattr(Client, name))
        have = inspect.signature(getattr(type(client), name))
        assert list(have.parameters) == list(want.parameters), (name, have, want)
        for p, q in zip(have.parameters.values(), want.parameters.values(), strict=True):
            assert p.kind == q.kind, (name, p, q)


def note_attempt(path: str) -> int:
    with open(path, "a") as f:
        f.write("attempt\n")
    with open(path) as f:
        return len(f.read().splitlines())


def always_fail(path: str) -> None:
    n = note_attempt(path)
    raise RuntimeError(f"attempt {n} fails")


def fail_item(item: tuple[int, str]) -> int:
    x, folder = item
    note_attempt(os.path.join(folder, f"item-{x}"))
    raise RuntimeError(f"item {x} fails")


def die_every_time(path: str) -> None:
    note_attempt(path)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("retries", [0, 1, 2])
def test_failure_retries_make_exactly_one_plus_retries_attempts(client, tmp_path, retries):
    res = ResourceConfig.with_cpu(max_retries_failure=retries, max_retries_preemption=3)
    attempts = tmp_path / "attempts"
    with pytest.raises(JobError, match="fails"):
        client.submit(always_fail, str(attempts), resources=res).result(timeout=120)
    assert len(attempts.read_text().splitlines()) == 1 + retries
    with pytest.raises(JobError, match="item 0 fails"):
        list(client.map(fail_item, [(0, str(tmp_path))], resources=res))
    assert len((tmp_path / "item-0").read_text().splitlines()) == 1 + retries


def test_preemption_retries_make_exactly_one_plus_retries_starts(client, tmp_path):
    res = ResourceConfig.with_cpu(max_retries_failure=2, max_retries_preemption=1)
    attempts = tmp_path / "attempts"
    with pytest.raises(WorkerDiedError):
        client.submit(die_every_time, str(attempts), resources=res).result(timeout=180)
    assert len(attempts.read_text().splitlines()) == 2  # a death is not a failure: failure retries unused


def test_submit_returns_result(client):
    job = client.submit(add, 2, b=40, name="add-job")
    assert job.result(timeout=60) == 42
    assert job.status() is JobStatus.SUCCEEDED
    assert job.wait(timeout=1) is JobStatus.SUCCEEDED
    assert job.name == "add-job"


def test_map_yields_in_input_order(client):
    assert list(client.map(slow_identity, range(8))) == [i * 10 for i in range(8)]


def test_map_many_small_items(client):
    assert list(client.map(square, range(500))) == [x * x for x in range(500)]


def test_map_of_nothing(client):
    assert list(client.map(square, [])) == []


def test_submit_exception_carries_remote_traceback(client):
    job = client.submit(raise_custom)
    with pytest.raises(JobError) as info:
        job.result(timeout=60)
    err = info.value
    assert job.status() is JobStatus.FAILED
    assert "KeyError" in err.cause_type
    assert "missing-key-42" in str(err)
    assert "raise_custom" in err.remote_traceback  # the function's own frame, from where it ran
    assert "Remote traceback" in str(err)
    assert isinstance(err.__cause__, KeyError)  # the original exception, when it could travel back


def test_map_exception_raised_at_its_item(client):
    seen = []
    with pytest.raises(JobError) as info:
        for value in client.map(fail_on_three, range(6)):
            seen.append(value)
    assert seen == [0, 1, 2]
    assert "item 3 is bad" in str(info.value)
    assert "fail_on_three" in info.value.remote_traceback


def test_map_retries_failures_per_resources(client, tmp_path):
    res = ResourceConfig.with_cpu(max_retries_failure=1)
    items = [(i, str(tmp_path)) for i in range(4)]
    assert list(client.map(flaky_once, items, resources=res)) == [0, -1, -2, -3]


def test_map_survives_a_worker_killed_mid_item(client, tmp_path):
    items = [(i, str(tmp_path)) for i in range(6)]
    res = ResourceConfig.with_cpu(max_retries_preemption=2)
    assert list(client.map(kill_self_once, items, resources=res)) == [i + 100 for i in range(6)]
    assert (tmp_path / "died-2").exists()


def test_cancel_kills_a_running_job(client, tmp_path):
    marker = tmp_path / "started"
    job = client.submit(wait_forever, str(marker))
    pid = int(_wait_for_file(marker))
    start = time.monotonic()
    job.cancel()
    assert job.wait(timeout=30) is JobStatus.CANCELLED
    assert time.monotonic() - start < 30
    with pytest.raises(JobCancelledError):
        job.result(timeout=1)
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the cancelled job's process is still running"
    job.cancel()  # idempotent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_sigkilled_worker_is_retried(client, tmp_path):
    marker = tmp_path / "attempt"
    job = client.submit(
        die_once_then_succeed, str(marker), resources=ResourceConfig.with_cpu(max_retries_preemption=2)
    )
    pid = int(_wait_for_file(marker))
    os.kill(pid, signal.SIGKILL)
    assert job.result(timeout=90).startswith("recovered in ")


def test_sigkilled_worker_without_retries_fails_cleanly(client, tmp_path):
    marker = tmp_path / "attempt"
    job = client.submit(
        die_once_then_succeed, str(marker), resources=ResourceConfig.with_cpu(max_retries_preemption=0)
    )
    pid = int(_wait_for_file(marker))
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerDiedError):
        job.result(timeout=90)
    assert job.status() is JobStatus.FAILED


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        (ResourceConfig.with_cpu(cpu=64), "cpu=64"),
        (ResourceConfig.with_cpu(ram="100TiB"), "ram="),
        (ResourceConfig.with_gpu("H100", count=8), "H100"),
        (ResourceConfig.with_tpu("v5p-8"), "v5p-8"),
    ],
    ids=["cpu", "ram", "gpu", "tpu"],
)
def test_oversized_requests_fail_fast(client, resources, field):
    start = time.monotonic()
    with pytest.raises(ResourcesUnavailableError, match=field):
        client.submit(add, 1, resources=resources).result(timeout=30)
    with pytest.raises(ResourcesUnavailableError, match=field):
        list(client.map(square, [1, 2], resources=resources))
    assert time.monotonic() - start < 10


def test_env_reaches_job_and_secrets_stay_out_of_logs(client):
    env = {"SCHOONER_TEST_API_TOKEN": SECRET, "SCHOONER_TEST_COLOUR": "teal"}
    job = client.submit(show_env, resources=ResourceConfig.with_cpu(env=env))
    assert job.result(timeout=60) == (len(SECRET), "teal")
    logs = job.logs()
    assert "colour is teal" in logs
    assert "token is ***" in logs
    assert SECRET not in logs
    assert SECRET not in repr(ResourceConfig.with_cpu(env=env))


def start_environment(name: str) -> str:
    """A variable as the process had it at exec (what e.g. glibc reads once), not as os.environ has it now."""
    with open("/proc/self/environ", "rb") as f:
        entries = f.read().split(b"\0")
    prefix = f"{name}=".encode()
    return next((e.decode().split("=", 1)[1] for e in entries if e.startswith(prefix)), "")


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs Linux /proc")
def test_resource_env_is_in_place_when_the_worker_process_starts(client):
    """What settings read once at process start (glibc tunables, XLA flags) rely on: the training step puts
    its GLIBC_TUNABLES into its ResourceConfig.env."""
    res = ResourceConfig.with_cpu(env={"SCHOONER_TEST_AT_START": "from-exec"})
    name = "SCHOONER_TEST_AT_START"
    assert client.submit(start_environment, name, resources=res).result(timeout=60) == "from-exec"
    assert list(client.map(start_environment, [name, name], resources=res)) == ["from-exec"] * 2
    assert client.submit(start_environment, name).result(timeout=60) == ""  # not for other jobs


def test_partial_functions_travel(client):
    assert list(client.map(functools.partial(add, b=1), [1, 2, 3])) == [2, 3, 4]


def test_using_client_nests_and_restores(local_client):
    from schooner.cluster import LocalClient, current_client, using_client

    outer = current_client()
    with using_client(local_client):
        assert current_client() is local_client
        inner = LocalClient(max_workers=1)
        with using_client(inner):
            assert current_client() is inner
        assert current_client() is local_client
        inner.shutdown()
    assert current_client() is outer


def test_cluster_spec_from_environment():
    from schooner.cluster import LocalClient
    from schooner.cluster._current import client_from_spec

    for spec in (None, "", "local", " local "):
        client = client_from_spec(spec)
        assert isinstance(client, LocalClient)
        client.shutdown()
    with pytest.raises(ValueError, match="SCHOONER_CLUSTER='kubernetes' is not a cluster spec"):
        client_from_spec("kubernetes")


def test_errors_name_the_public_classes(client):
    import pickle
    import traceback

    with pytest.raises(ResourcesUnavailableError) as err:
        client.submit(add, 1, resources=ResourceConfig.with_cpu(cpu=64))
    line = traceback.format_exception_only(type(err.value), err.value)[-1]
    assert line.startswith("schooner.cluster.ResourcesUnavailableError: ")
    assert type(pickle.loads(pickle.dumps(err.value))) is ResourcesUnavailableError
    with pytest.raises(JobError) as job_err:
        client.submit(raise_custom).result(timeout=60)
    assert traceback.format_exception_only(type(job_err.value), job_err.value)[-1].startswith(
        "schooner.cluster.JobError: "
    )
