"""The driver stopped from outside (issue 36): SIGTERM ends a run with a message and a recorded status; after
kill -9 of the driver, a process that an in-process step started does not keep running and writing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXP = str(Path(__file__).parent / "experiments_data" / "long_child.py")


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    """The driver, its output in `tmp_path/driver.out` (a pipe would stay open while the child lives)."""
    log, pid_file = tmp_path / "child.log", tmp_path / "child.pid"
    env = {**os.environ, "CHILD_LOG": str(log), "CHILD_PID": str(pid_file), "COLUMNS": "200"}
    env.pop("SCHOONER_PREFIX", None)
    with (tmp_path / "driver.out").open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "schooner.cluster.cli", "run", EXP, "--prefix", str(tmp_path / "out")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while not (log.exists() and log.read_text().count("tick") >= 2):
        assert proc.poll() is None, (tmp_path / "driver.out").read_text()
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    return proc, log, pid_file


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper is not running
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _stops_writing(log: Path, pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _alive(pid):
            size = log.stat().st_size
            time.sleep(0.3)
            return log.stat().st_size == size
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux /proc")
def test_sigterm_ends_the_run_with_a_message_and_a_recorded_status(tmp_path: Path) -> None:
    proc, log, pid_file = _start(tmp_path)
    child = int(pid_file.read_text())
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        out = (tmp_path / "driver.out").read_text()
        assert proc.returncode == 143, out
        assert "terminated (SIGTERM)" in out and "waits after" in out, out
        status = next((tmp_path / "out").glob("waits-*/.schooner/status.json"))
        assert json.loads(status.read_text())["status"] == "INTERRUPTED"
        record = json.loads(next((tmp_path / "out" / "experiments").rglob("*.json")).read_text())
        assert record["interrupted"] is True and record.get("signal") == "SIGTERM"
        assert _stops_writing(log, child), "the step's child kept running after SIGTERM"
    finally:
        _kill(child)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux /proc")
def test_after_kill_9_of_the_driver_a_child_of_an_in_process_step_stops(tmp_path: Path) -> None:
    proc, log, pid_file = _start(tmp_path)
    child = int(pid_file.read_text())
    try:
        proc.kill()
        proc.wait(timeout=30)
        assert _stops_writing(log, child), (
            "the step's child kept running after the driver was killed; child "
            f"{_status_of(child)}; driver output:\n{(tmp_path / 'driver.out').read_text()[-3000:]}"
        )
    finally:
        _kill(child)


def _kill(pid: int) -> None:
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def _status_of(pid: int) -> str:
    """A process's state and parent, for a failure message (seen once: a child that outlived its killed driver)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return f"{pid} gone"
    return f"{pid} " + ", ".join(ln for ln in lines if ln.startswith(("State:", "PPid:", "NSsid:")))
