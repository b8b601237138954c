"""Leases on step output folders: exclusive, heartbeated, stale ones taken over exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from schooner.cluster.records import meta_path
from schooner.cluster.runner._lease import Lease, parse_lease
from schooner.cluster.storage import storage_for


@pytest.fixture(params=["local", "memory"])
def folder(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "step-1234abcd")
    return f"memory://lease-tests/{uuid.uuid4().hex}/step-1234abcd"


def _lease(folder: str, owner: str, ttl: float = 30.0) -> Lease:
    storage = storage_for(folder)
    storage.makedirs(folder)
    return Lease(storage, folder, owner=owner, run_id=owner, ttl=ttl)


def _plant(
    folder: str, *, host: str, pid: int, heartbeat: float, ttl: float = 30.0, owner: str = "old"
) -> None:
    """A lease file as another runner left it."""
    storage = storage_for(folder)
    storage.makedirs(folder)
    storage.write_text(
        meta_path(folder, "lease.json"),
        json.dumps(
            {
                "owner": owner,
                "run_id": owner,
                "host": host,
                "pid": pid,
                "pid_start": 0.0,
                "heartbeat": heartbeat,
                "ttl": ttl,
            }
        ),
    )


def test_a_live_lease_is_exclusive(folder: str) -> None:
    a, b = _lease(folder, "a"), _lease(folder, "b")
    assert a.try_acquire() == (True, None)
    ok, holder = b.try_acquire()
    assert not ok and holder is not None and holder.owner == "a"
    assert a.heartbeat() and a.still_held() and not b.still_held()
    a.release()
    assert a.read() is None
    assert b.try_acquire()[0]


def test_a_lease_past_its_ttl_is_taken_over_by_exactly_one_of_many(folder: str) -> None:
    _plant(folder, host="another-host", pid=1, heartbeat=time.time() - 120, ttl=30)
    contenders = [_lease(folder, f"c{i}") for i in range(8)]
    barrier = threading.Barrier(len(contenders))
    wins: list[str] = []

    def attempt(lease: Lease) -> None:
        barrier.wait()
        if lease.try_acquire()[0]:
            wins.append(lease.owner)

    threads = [threading.Thread(target=attempt, args=(c,)) for c in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    current = contenders[0].read()
    assert current is not None and current.owner == wins[0]
    winner = next(c for c in contenders if c.owner == wins[0])
    winner.release()
    assert storage_for(folder).glob(meta_path(folder, "lease.json") + ".takeover-*") == []


def test_a_fresh_lease_from_another_host_is_respected(folder: str) -> None:
    _plant(folder, host="another-host", pid=1, heartbeat=time.time(), ttl=30)
    ok, holder = _lease(folder, "me").try_acquire()
    assert not ok and holder.host == "another-host"


def test_heartbeat_notices_a_lost_lease(folder: str) -> None:
    a = _lease(folder, "a", ttl=0.2)
    assert a.try_acquire()[0]
    time.sleep(0.3)  # a stalls past its ttl (same host and alive, but the heartbeat is too old)
    b = _lease(folder, "b")
    assert b.try_acquire()[0]
    assert not a.heartbeat() and not a.still_held()
    a.release()  # must not remove b's lease
    assert b.still_held()


_HOLDER = textwrap.dedent("""
    import sys, time
    from schooner.cluster.runner._lease import Lease
    from schooner.cluster.storage import storage_for
    folder = sys.argv[1]
    lease = Lease(storage_for(folder), folder, owner="child", run_id="child", ttl=3600)
    assert lease.try_acquire()[0]
    print("held", flush=True)
    time.sleep(600)
""")


def test_a_lease_of_a_killed_process_on_this_host_is_stale_at_once(tmp_path) -> None:
    folder = str(tmp_path / "step")
    os.makedirs(folder)
    child = subprocess.Popen([sys.executable, "-c", _HOLDER, folder], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        ok, holder = _lease(folder, "me").try_acquire()
        assert not ok and holder.owner == "child"  # alive: respected, even with a 1 h ttl ahead
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        info = parse_lease(storage_for(folder).read_text(meta_path(folder, "lease.json")))
        assert info is not None and info.is_stale()  # heartbeat is fresh, but the pid is gone
        assert _lease(folder, "me").try_acquire() == (True, None)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


_CONTENDER = textwrap.dedent("""
    import os, sys, time
    from schooner.cluster.runner._lease import Lease
    from schooner.cluster.storage import storage_for
    folder, owner, ready_dir, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    lease = Lease(storage_for(folder), folder, owner=owner, run_id=owner, ttl=60)
    open(os.path.join(ready_dir, owner), "w").close()
    while len(os.listdir(ready_dir)) < n:  # start together, however slowly the interpreters came up
        time.sleep(0.001)
    print("won" if lease.try_acquire()[0] else "lost", flush=True)
    sys.stdin.read()  # stay alive (a dead winner's lease would be stale) until the test has every answer
""")


def test_processes_racing_for_a_stale_lease_one_wins(tmp_path) -> None:
    folder = str(tmp_path / "step")
    _plant(folder, host="another-host", pid=1, heartbeat=time.time() - 600)
    ready = tmp_path / "ready"
    ready.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONTENDER, folder, f"p{i}", str(ready), "4"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    try:
        results = [p.stdout.readline().strip() for p in procs]
    finally:
        for p in procs:
            p.communicate(timeout=60)
    assert sorted(results) == ["lost", "lost", "lost", "won"]


def test_exclusive_create_through_a_generic_fsspec_backend(tmp_path) -> None:
    import fsspec

    from schooner.cluster.storage import FsspecStorage

    storage = FsspecStorage(fsspec.filesystem("file"))  # fsspec's generic pipe_file(mode="create") path
    path = str(tmp_path / "lease.json")
    assert storage.create_exclusive(path, "first")
    assert not storage.create_exclusive(path, "second")
    assert storage.read_text(path) == "first"
