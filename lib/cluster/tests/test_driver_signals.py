"""The driver stopped from outside (issue 36): SIGTERM ends a run with a message and a recorded status; after
kill -9 of the driver, a process that an in-process step started does not keep running and writing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

EXP = str(Path(__file__).parent / "experiments_data" / "long_child.py")


def _start(
    tmp_path: Path, *, prelude: str = "", gate: Path | None = None, subreaper: bool = False
) -> tuple[subprocess.Popen, Path, Path]:
    """The driver, its output in `tmp_path/driver.out` (a pipe would stay open while the child lives).

    `prelude`: Python run in the driver before the CLI. `gate`: the step waits for this file before it starts
    its child (returns once the step waits). `subreaper`: the driver runs under a child subreaper, which
    orphans below it go to instead of init (as under some init systems and container runtimes); the
    returned process is then that subreaper, and `tmp_path/driver.pid` holds the driver's pid."""
    log, pid_file = tmp_path / "child.log", tmp_path / "child.pid"
    env = {**os.environ, "CHILD_LOG": str(log), "CHILD_PID": str(pid_file), "COLUMNS": "200"}
    env.pop("SCHOONER_PREFIX", None)
    if gate is not None:
        env["CHILD_GATE"] = str(gate)
    cmd = [
        sys.executable,
        "-c",
        _DRIVER.format(prelude=prelude),
        "run",
        EXP,
        "--prefix",
        str(tmp_path / "out"),
    ]
    if subreaper:
        driver_pid = tmp_path / "driver.pid"
        cmd = [sys.executable, "-c", _SUBREAPER, str(driver_pid), str(tmp_path / "done"), *cmd]
    with (tmp_path / "driver.out").open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not (
        Path(f"{gate}.waiting").exists() if gate else log.exists() and log.read_text().count("tick") >= 2
    ):
        assert proc.poll() is None, (tmp_path / "driver.out").read_text()
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    return proc, log, pid_file


_DRIVER = "import sys\n{prelude}\nfrom schooner.cluster.cli import main\nsys.exit(main(sys.argv[1:]))\n"

_SUBREAPER = """
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
pid_file, done, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
driver = subprocess.Popen(cmd)
with open(pid_file + ".tmp", "w") as f:
    f.write(str(driver.pid))
os.replace(pid_file + ".tmp", pid_file)
while not os.path.exists(done):  # reap the driver and the orphans that come here
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    time.sleep(0.02)
"""


def _wait_for(condition: Callable[[], bool], what: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _guard_of(driver: int) -> int:
    """The pid of the driver's orphan guard (its child running `_orphans.py`)."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == driver and b"_orphans.py" in cmdline:
                return int(name)
    raise AssertionError(f"driver {driver} has no orphan guard running")


def _ticks(log: Path) -> int:
    return log.read_text().count("tick") if log.exists() else 0


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


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux /proc")
def test_a_guard_that_starts_only_after_the_driver_died_still_stops_the_child(tmp_path: Path) -> None:
    """The driver waits a short while for its guard to say "ready", then goes on; a guard whose interpreter
    started after the driver was gone could not read the driver's session from /proc any more."""
    go, python = tmp_path / "go", tmp_path / "python"
    python.write_text(  # the guard's interpreter starts once `go` exists; anything else starts at once
        f'#!/bin/sh\ncase "$*" in *_orphans.py*) while [ ! -e "{go}" ]; do sleep 0.02; done ;; esac\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    prelude = f"sys.executable = {str(python)!r}\nimport schooner.cluster.runner._orphans as o\no.READY_TIMEOUT_S = 0.5"
    proc, log, pid_file = _start(tmp_path, prelude=prelude)
    child, guard = int(pid_file.read_text()), _guard_of(proc.pid)
    try:
        proc.kill()
        proc.wait(timeout=30)
        go.touch()
        assert _stops_writing(log, child, within=10), (
            f"the step's child kept running after the driver was killed; child {_status_of(child)}; "
            f"driver output:\n{(tmp_path / 'driver.out').read_text()[-3000:]}"
        )
        _wait_for(lambda: not _alive(guard), "the guard did not exit", within=10)
        out = (tmp_path / "driver.out").read_text()
        assert "Traceback" not in out and "Exception" not in out, out  # its "ready" found no reader: quiet
    finally:
        go.touch()
        _kill(child)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux /proc")
@pytest.mark.parametrize("reaper", ["init", "a subreaper"])
def test_a_child_started_while_the_guard_did_not_scan_stops_after_kill_9(tmp_path: Path, reaper: str) -> None:
    """The guard is stopped (SIGSTOP) from before the step starts its child until after the driver is gone:
    it never saw the child as the driver's, only as an orphan of the driver's session, whose parent is now
    init or, under a child subreaper, that subreaper."""
    gate = tmp_path / "gate"
    proc, log, pid_file = _start(tmp_path, gate=gate, subreaper=reaper == "a subreaper")
    driver = int((tmp_path / "driver.pid").read_text()) if reaper == "a subreaper" else proc.pid
    guard = _guard_of(driver)
    child = None
    os.kill(guard, signal.SIGSTOP)
    try:
        gate.touch()
        _wait_for(lambda: _ticks(log) >= 2, "the child never started")
        child = int(pid_file.read_text())
        os.kill(driver, signal.SIGKILL)
        if reaper == "init":
            proc.wait(timeout=30)
        _wait_for(lambda: not _alive(driver), "the killed driver stayed", within=30)
        os.kill(guard, signal.SIGCONT)
        assert _stops_writing(log, child, within=10), (
            f"the step's child kept running after the driver was killed; child {_status_of(child)}; "
            f"driver output:\n{(tmp_path / 'driver.out').read_text()[-3000:]}"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(guard, signal.SIGCONT)
        if child is not None:
            _kill(child)
        (tmp_path / "done").touch()
        proc.wait(timeout=30)


_FAILING_SCANS = """
import errno, os, runpy, sys
listdir, calls = os.listdir, []
def failing_listdir(path="."):  # the guard's second and third looks at /proc fail
    if path == "/proc":
        calls.append(path)
        if len(calls) in (2, 3):
            raise OSError(errno.EMFILE, "Too many open files (injected by the test)")
    return listdir(path)
os.listdir = failing_listdir
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux /proc")
def test_a_guard_whose_scan_failed_still_stops_the_child_and_says_what_failed(tmp_path: Path) -> None:
    """A scan that raises (here: the guard cannot list /proc twice) is said on the driver's stderr, and the
    guard goes on: it still kills the step's child when the driver is killed."""
    failing, python = tmp_path / "failing_scans.py", tmp_path / "python"
    failing.write_text(_FAILING_SCANS)
    python.write_text(  # the guard runs under `failing_scans.py`; anything else as usual
        f'#!/bin/sh\ncase "$*" in *_orphans.py*) shift; exec "{sys.executable}" -I "{failing}" "$@" ;; esac\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    proc, log, pid_file = _start(tmp_path, prelude=f"sys.executable = {str(python)!r}")
    child = int(pid_file.read_text())
    try:
        _wait_for(lambda: _ticks(log) >= 10, "the child stopped ticking")  # the guard has looked 5 times
        proc.kill()
        proc.wait(timeout=30)
        assert _stops_writing(log, child), (
            f"the step's child kept running after the driver was killed; child {_status_of(child)}; "
            f"driver output:\n{(tmp_path / 'driver.out').read_text()[-3000:]}"
        )
        out = (tmp_path / "driver.out").read_text()  # (a slow guard's second look may have been its last)
        assert "orphan guard" in out and "Too many open files" in out, out
    finally:
        _kill(child)
