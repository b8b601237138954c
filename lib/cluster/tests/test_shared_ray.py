"""One shared test Ray per pytest-xdist run (schooner.cluster.testing): a second worker starting one is refused."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from schooner.cluster import testing


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "run-under-test")
    return tmp_path


def as_worker(monkeypatch, worker: str) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)


def test_a_second_live_worker_of_the_run_is_refused(run_dir, monkeypatch):
    marker = run_dir / "schooner-shared-ray-run-under-test"
    marker.write_text(f"gw0 {os.getppid()}")  # a live process holds the run's Ray
    as_worker(monkeypatch, "gw1")
    with pytest.raises(RuntimeError, match=r"worker gw1 .* worker gw0 .*xdist_group\(\"ray\"\)"):
        testing._claim_the_run()
    assert marker.read_text() == f"gw0 {os.getppid()}"


def test_the_first_worker_claims_and_may_claim_again(run_dir, monkeypatch):
    as_worker(monkeypatch, "gw0")
    testing._claim_the_run()
    marker = run_dir / "schooner-shared-ray-run-under-test"
    assert marker.read_text() == f"gw0 {os.getpid()}"
    testing._claim_the_run()  # its Ray was shut down and is started again: the same worker
    assert marker.read_text() == f"gw0 {os.getpid()}"


def test_a_replacement_for_a_dead_worker_takes_over(run_dir, monkeypatch):
    dead = subprocess.Popen(["true"])
    dead.wait()
    marker = run_dir / "schooner-shared-ray-run-under-test"
    marker.write_text(f"gw0 {dead.pid}")
    as_worker(monkeypatch, "gw2")
    testing._claim_the_run()
    assert marker.read_text() == f"gw2 {os.getpid()}"


def test_outside_xdist_nothing_is_claimed(run_dir, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    testing._claim_the_run()
    assert not list(run_dir.iterdir())


def test_a_failed_start_s_handles_of_processes_that_already_exited_are_reaped():
    """A failed Ray start leaves Popen handles nobody waits on; one whose process already exited (a zombie,
    whose command line can no longer be read) warned "subprocess N is still running" when collected, an error
    under -W error in whichever test ran then (CI: a Ray fixture's setup). The cleanup reaps every handle the
    failed start made, not only those of the processes it killed."""
    import sys
    import time

    import psutil
    import ray

    before = testing._children()
    # a process of the failed start that exited by itself: its argv names Ray's folder, as Ray's do
    exited = subprocess.Popen([sys.executable, "-c", "pass", os.path.dirname(ray.__file__)])
    deadline = time.monotonic() + 30
    while psutil.Process(exited.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    testing._cleanup_failed_start(before)
    assert exited.returncode == 0
