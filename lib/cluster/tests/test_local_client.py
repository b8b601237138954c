"""LocalClient specifics: admission by CPUs and memory, logs, worker isolation, pool lifecycle."""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schooner.cluster import (
    JobCancelledError,
    JobError,
    JobStatus,
    LocalClient,
    ResourceConfig,
    ResourcesUnavailableError,
    WorkerDiedError,
)
from schooner.cluster._local_machine import Machine, gpu_matches
from schooner.cluster._pool import Pool


@dataclass(frozen=True)
class Span:
    """Defined in this test module, which workers cannot import by name: it must travel by value."""

    start: float
    end: float
    pid: int


def timed_sleep(seconds: float) -> Span:
    start = time.time()
    time.sleep(seconds)
    return Span(start, time.time(), os.getpid())


def _max_overlap(spans: list[Span]) -> int:
    events = sorted([(s.start, 1) for s in spans] + [(s.end, -1) for s in spans])
    depth = best = 0
    for _, d in events:
        depth += d
        best = max(best, depth)
    return best


def test_cpu_admission_never_oversubscribes():
    with LocalClient(max_workers=2) as client:
        jobs = [client.submit(timed_sleep, 0.4, resources=ResourceConfig.with_cpu(cpu=1)) for _ in range(4)]
        assert _max_overlap([j.result(timeout=60) for j in jobs]) <= 2  # == 2 unless a start lags (busy host)
        wide = [client.submit(timed_sleep, 0.3, resources=ResourceConfig.with_cpu(cpu=2)) for _ in range(2)]
        assert _max_overlap([j.result(timeout=60) for j in wide]) == 1


def test_memory_admission_never_oversubscribes():
    with LocalClient(max_workers=2, memory="1GiB") as client:
        res = ResourceConfig.with_cpu(cpu=0.5, ram="600MiB")
        jobs = [client.submit(timed_sleep, 0.3, resources=res) for _ in range(2)]
        assert _max_overlap([j.result(timeout=60) for j in jobs]) == 1
        with pytest.raises(ResourcesUnavailableError, match=r"ram=.*1\.00 GiB"):
            client.submit(timed_sleep, 0, resources=ResourceConfig.with_cpu(ram="2GiB"))


def test_constructor_validates():
    with pytest.raises(ValueError, match="max_workers"):
        LocalClient(max_workers=0)
    with pytest.raises(ValueError, match="memory"):
        LocalClient(memory="lots")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    physical = psutil.virtual_memory().total
    with pytest.raises(ValueError, match=rf"max_workers={cores + 62}\) is more than the [0-9.]+ cores"):
        LocalClient(max_workers=cores + 62)
    too_much = f"{physical * 4 // 2**30}GiB"
    with pytest.raises(ValueError, match=rf"memory='{too_much}'\) is more than this machine's"):
        LocalClient(memory=too_much)
    with LocalClient(max_workers=cores + 2, memory=too_much, oversubscribe=True) as client:
        assert client.machine.cpus == cores + 2


def test_cancel_pending_job_never_runs(tmp_path):
    with LocalClient(max_workers=1) as client:
        blocker = client.submit(timed_sleep, 1.0)
        marker = tmp_path / "ran"
        pending = client.submit(Path.write_text, marker, "x")
        time.sleep(0.1)
        assert pending.status() is JobStatus.PENDING
        pending.cancel()
        assert pending.wait(timeout=5) is JobStatus.CANCELLED
        with pytest.raises(JobCancelledError):
            pending.result()
        blocker.result(timeout=30)
        assert not marker.exists()


def chatty(n: int) -> int:
    for i in range(n):
        print(f"line {i}")
    return n


def test_logs_are_captured_per_job_and_streamed(capsys):
    with LocalClient(max_workers=2, stream_logs=True) as client:
        a = client.submit(chatty, 3, name="job-a")
        b = client.submit(chatty, 2, name="job-b")
        assert (a.result(timeout=60), b.result(timeout=60)) == (3, 2)
        assert a.logs() == "line 0\nline 1\nline 2\n"
        assert b.logs() == "line 0\nline 1\n"
    out = capsys.readouterr().out
    assert "[job-a] line 2" in out
    assert "[job-b] line 1" in out


def print_env_secret(x: int) -> int:
    print(f"item {x} token={os.environ['SCHOONER_MAP_ACCESS_TOKEN']}", flush=True)
    return x


def test_map_output_is_relayed_with_secrets_scrubbed(capfd):
    secret = "tok-91d2e8f7a6b5"
    res = ResourceConfig.with_cpu(env={"SCHOONER_MAP_ACCESS_TOKEN": secret})
    with LocalClient(max_workers=2) as client:
        assert list(client.map(print_env_secret, range(3), resources=res)) == [0, 1, 2]
    out, err = capfd.readouterr()
    assert "item 2 token=***" in out
    assert secret not in out + err


def nested_budget() -> float:
    inner = LocalClient()
    try:
        return inner.machine.cpus
    finally:
        inner.shutdown()


def test_client_inside_a_job_stays_within_the_jobs_cpus(local_client):
    assert (
        local_client.submit(nested_budget, resources=ResourceConfig.with_cpu(cpu=1)).result(timeout=60) == 1
    )


def crash_hard() -> None:
    import ctypes

    ctypes.string_at(0)  # segfault: the worker dies, the caller must not


def test_segfault_in_a_worker_is_a_clean_error(local_client):
    job = local_client.submit(crash_hard, resources=ResourceConfig.with_cpu(max_retries_preemption=1))
    with pytest.raises(WorkerDiedError, match="SIGSEGV") as info:
        job.result(timeout=60)
    assert "max_retries_preemption=1" in str(info.value)
    assert job.attempts == 2
    assert "[schooner] worker pid" in job.logs()


def test_shutdown_kills_running_jobs(tmp_path):
    client = LocalClient(max_workers=1)
    job = client.submit(timed_sleep, 60)
    while job.status() is not JobStatus.RUNNING:
        time.sleep(0.01)
    start = time.monotonic()
    client.shutdown()
    assert time.monotonic() - start < 15
    assert job.wait(timeout=5) is JobStatus.FAILED
    with pytest.raises(JobError, match="shut down"):
        job.result()
    with pytest.raises(RuntimeError, match="shut down"):
        client.submit(timed_sleep, 0)
    client.shutdown()  # idempotent


def test_abandoned_map_releases_its_workers(local_client):
    first = list(itertools.islice(local_client.map(abs, itertools.count()), 5))  # an endless input
    assert first == [0, 1, 2, 3, 4]
    deadline = time.monotonic() + 10
    while local_client._pool._used_cpu and time.monotonic() < deadline:
        time.sleep(0.01)
    assert local_client._pool._used_cpu == 0
    assert list(local_client.map(abs, [-1, -2])) == [1, 2]


def make_lock(_: int) -> threading.Lock:
    return threading.Lock()


def test_unpicklable_result_is_a_job_error(local_client):
    with pytest.raises(JobError, match="not picklable"):
        list(local_client.map(make_lock, [1]))
    with pytest.raises(JobError, match="not picklable"):
        local_client.submit(make_lock, 1).result(timeout=60)


def test_test_module_classes_travel_both_ways(local_client):
    span = local_client.submit(timed_sleep, 0.0).result(timeout=60)
    assert isinstance(span, Span)
    assert span.pid != os.getpid()


def test_large_ordered_map(local_client):
    n = 20_000
    assert list(local_client.map(abs, range(-n, 0))) == list(range(n, 0, -1))


def test_concurrent_maps_share_the_pool(local_client):
    results: dict[int, list] = {}

    def run(k: int) -> None:
        results[k] = list(local_client.map(abs, range(-300 * k, 0)))

    threads = [threading.Thread(target=run, args=(k,)) for k in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert {k: len(v) for k, v in results.items()} == {1: 300, 2: 600, 3: 900}
    assert results[2] == list(range(600, 0, -1))


def _gpu_machine() -> Machine:
    return Machine(cpus=8, memory=64 * 2**30, gpus=("NVIDIA H100 80GB HBM3",) * 2, gpu_ids=("0", "3"))


def test_gpu_jobs_get_distinct_devices_and_wait_for_free_ones():
    pool = Pool(_gpu_machine())
    one = ResourceConfig.with_gpu("H100", count=1)
    a, b = pool.try_reserve(one), pool.try_reserve(one)
    assert a is not None and b is not None
    assert {a.env()["CUDA_VISIBLE_DEVICES"], b.env()["CUDA_VISIBLE_DEVICES"]} == {"0", "3"}
    assert pool.try_reserve(one) is None  # both GPUs held: a third waits
    pool.unreserve(a)
    c = pool.try_reserve(one)
    assert c is not None and c.env() == a.env()
    assert pool.try_reserve(ResourceConfig.with_cpu()).env() == {}  # CPU jobs are not confined to a GPU


def test_gpu_requests_are_checked_against_models_and_counts():
    machine = _gpu_machine()
    machine.check(ResourceConfig.with_gpu("H100", count=2))
    with pytest.raises(
        ResourcesUnavailableError, match=r"device_count=3 GPUs of device_kind='H100'.*H100 80GB"
    ):
        machine.check(ResourceConfig.with_gpu("H100", count=3))
    with pytest.raises(ResourcesUnavailableError, match="device_kind='A100'"):
        machine.check(ResourceConfig.with_gpu("A100", count=1))


@pytest.mark.parametrize(
    ("kind", "name", "expected"),
    [
        ("H100", "NVIDIA H100 80GB HBM3", True),
        ("H200", "NVIDIA H200", True),
        ("A100-80G", "NVIDIA A100-SXM4-80GB", True),
        ("A100-80G", "NVIDIA A100-SXM4-40GB", False),
        ("A10", "NVIDIA A10G", False),
        ("A10G", "NVIDIA A10G", True),
    ],
)
def test_gpu_model_matching(kind, name, expected):
    assert gpu_matches(kind, name) is expected


def test_unpicklable_arguments_fail_at_submit(local_client):
    with pytest.raises(TypeError, match="cannot send .* module-level functions and picklable arguments"):
        local_client.submit(print, threading.Lock())


def hold_memory(mib: int) -> int:
    block = bytearray(mib * 2**20)  # bytearray() zero-fills: the pages are resident
    time.sleep(1.0)
    return len(block) // 2**20


def test_a_job_over_its_ram_is_killed_not_the_machine(local_client):
    greedy = local_client.submit(hold_memory, 300, resources=ResourceConfig.with_cpu(ram="100MiB"))
    with pytest.raises(WorkerDiedError, match=r"more than its reservation ram=104857600 \(100 MiB\)"):
        greedy.result(timeout=60)
    assert greedy.attempts == 1  # not retried: it would only be killed again
    fitting = local_client.submit(hold_memory, 50, resources=ResourceConfig.with_cpu(ram="400MiB"))
    assert fitting.result(timeout=60) == 50


def test_unpicklable_items_fail_clearly(local_client):
    with pytest.raises(TypeError, match=r"map 'abs': cannot send items 0\.\.0 .* items must be picklable"):
        list(local_client.map(abs, [threading.Lock()]))
    assert list(local_client.map(abs, [-1])) == [1]  # the client is still usable


@settings(max_examples=25, deadline=None)
@given(
    items=st.lists(st.integers(min_value=-(10**6), max_value=10**6), max_size=300),
    workers=st.integers(min_value=1, max_value=2),
)
def test_map_equals_builtin_map(local_client, items, workers):
    assert list(local_client.map(abs, items, max_workers=workers)) == list(map(abs, items))


def read_env(name: str) -> str | None:
    return os.environ.get(name)


def test_jobs_see_the_callers_environment_at_submit(local_client, monkeypatch):
    assert local_client.submit(abs, -1).result(timeout=60) == 1  # a warm worker exists before the change
    monkeypatch.setenv("SCHOONER_TEST_LATE_VAR", "set-after-the-workers-started")
    assert (
        local_client.submit(read_env, "SCHOONER_TEST_LATE_VAR").result(timeout=60)
        == "set-after-the-workers-started"
    )
    assert list(local_client.map(read_env, ["SCHOONER_TEST_LATE_VAR"])) == ["set-after-the-workers-started"]
    monkeypatch.delenv("SCHOONER_TEST_LATE_VAR")
    assert local_client.submit(read_env, "SCHOONER_TEST_LATE_VAR").result(timeout=60) is None
    assert list(local_client.map(read_env, ["SCHOONER_TEST_LATE_VAR"])) == [None]
    res = ResourceConfig.with_cpu(env={"SCHOONER_TEST_LATE_VAR": "from-resources"})  # resources win
    monkeypatch.setenv("SCHOONER_TEST_LATE_VAR", "from-caller")
    assert (
        local_client.submit(read_env, "SCHOONER_TEST_LATE_VAR", resources=res).result(timeout=60)
        == "from-resources"
    )


def test_queued_jobs_start_in_submission_order():
    with LocalClient(max_workers=1) as client:
        jobs = [client.submit(timed_sleep, 0.05, name=f"queued-{i}") for i in range(6)]
        starts = [j.result(timeout=60).start for j in jobs]
    assert starts == sorted(starts)


def test_cancelling_a_queued_wide_job_lets_narrower_ones_run():
    with LocalClient(max_workers=2) as client:
        blocker = client.submit(timed_sleep, 0.5, resources=ResourceConfig.with_cpu(cpu=2))
        wide = client.submit(timed_sleep, 0.1, resources=ResourceConfig.with_cpu(cpu=2))
        narrow = client.submit(timed_sleep, 0.1, resources=ResourceConfig.with_cpu(cpu=1))
        wide.cancel()
        assert wide.wait(timeout=10) is JobStatus.CANCELLED
        assert narrow.result(timeout=60).start >= blocker.result(timeout=60).end - 0.05


def test_concurrent_pickling_ships_unimportable_modules_by_value(tmp_path) -> None:
    """Threads pickling functions of a module no worker can import must all ship it by value, even when
    another thread is registering that module at the same moment (a by-reference pickle fails remotely)."""
    import importlib.util
    import subprocess
    import sys
    import threading

    from schooner.cluster._worker_pickle import dumps

    src = tmp_path / "unimportable_mod_for_race.py"
    src.write_text("def f(x):\n    return x + 1\n")
    spec = importlib.util.spec_from_file_location("unimportable_mod_for_race", src)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    try:
        barrier = threading.Barrier(8)
        blobs: list[bytes] = []

        def work() -> None:
            barrier.wait()
            blobs.append(dumps((mod.f, 41)))

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        loader = "import pickle, sys; f, x = pickle.loads(sys.stdin.buffer.read()); print(f(x))"
        for blob in blobs:
            out = subprocess.run(
                [sys.executable, "-c", loader], input=blob, capture_output=True, cwd=tmp_path.parent
            )
            assert out.returncode == 0, out.stderr.decode()
            assert out.stdout.decode().strip() == "42"
    finally:
        del sys.modules[spec.name]


def die_leaving_a_child(marker: str, value: int = 0) -> int:
    """The first call forks a child that keeps the worker's socket open, then SIGKILLs only the worker: its
    death closes no socket (what a job that starts background processes does), so only the exit tells."""
    import signal

    if not os.path.exists(marker):
        Path(marker).write_text("died once")
        if os.fork() == 0:  # the child sleeps holding every descriptor of the worker
            time.sleep(120)
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)
    return value * 2


def _within(seconds: float, fn, *args):
    """`fn(*args)` on a thread, failing the test (instead of hanging it) when it takes longer than `seconds`."""
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(fn, *args).result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        pytest.fail(f"still waiting after {seconds} s for a worker that was SIGKILLed")
    finally:
        pool.shutdown(wait=False)


def test_a_killed_worker_whose_socket_stays_open_is_noticed_by_map(local_client, tmp_path):
    marker = str(tmp_path / "marker")
    res = ResourceConfig.with_cpu(max_retries_preemption=1)
    got = _within(60, lambda: list(local_client.map(die_leaving_a_child, [marker] * 3, resources=res)))
    assert got == [0, 0, 0]
    assert Path(marker).exists()


def test_a_killed_worker_whose_socket_stays_open_is_noticed_by_a_job(local_client, tmp_path):
    marker = str(tmp_path / "marker")
    res = ResourceConfig.with_cpu(max_retries_preemption=1)
    job = local_client.submit(die_leaving_a_child, marker, 21, resources=res)
    assert _within(60, job.result) == 42
    assert job.attempts == 2
