"""The suite's `--dist loadgroup` scheduler finishes a run in which a worker dies, and keeps each `xdist_group`
on one worker (tools/xdist_schedule.py).

With pytest-xdist 3.8.0's own scheduler these runs never end: both workers sit idle waiting for work. Each
case runs a small suite in a subprocess with a deadline and checks that every other test ran exactly once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[1] / "tools" / "xdist_schedule.py"

CRASHES = """
import os
import pytest

def test_a1(): pass
def test_a2(): pass
def test_a3(): pass

@pytest.mark.xdist_group("g")
def test_group_crash():
    os.abort()

@pytest.mark.xdist_group("g")
def test_group_after(): pass

def test_z1(): pass
def test_z2(): pass
"""

# Grouped tests first: xdist hands the first two scheduling units to different workers, so a group that is not
# one unit is split. Each test records its worker.
GROUPED = """
import os
import pytest

def note(name):
    with open(name + ".worker", "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.xdist_group("g")
@pytest.mark.parametrize("i", [0, 1, 2])
def test_grouped(i): note(f"grouped-{i}")

def test_free_a(): note("free-a")
def test_free_b(): note("free-b")
"""

SLOW_THEN_CRASH = """
import os, time

def test_slow(): time.sleep(2)
def test_crash(): os._exit(1)
def test_last(): pass
"""


def run(tmp_path: Path, source: str, workers: int) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_cases.py").write_text(source)
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('xs', {str(PLUGIN)!r})\n"
        "xs = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(xs)\n"
        "pytest_xdist_make_scheduler = xs.pytest_xdist_make_scheduler\n"
        "pytest_collection_modifyitems = xs.pytest_collection_modifyitems\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    # Only xdist among the installed plugins: loading them all (hypothesis alone takes seconds to import, in
    # the controller and again in each worker) made this small run take ~4x longer.
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "xdist",
        "-n",
        str(workers),
        "--dist",
        "loadgroup",
        "-p",
        "no:cacheprovider",
    ]
    cmd += ["-rA", "-q", "test_cases.py"]
    try:
        return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the run hung after a worker crashed:\n{e.stdout}")


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_crash_in_a_group_fails_that_test_and_runs_the_rest_once(tmp_path: Path, workers: int) -> None:
    out = run(tmp_path, CRASHES, workers).stdout
    assert "1 failed, 6 passed" in out, out
    assert "FAILED test_cases.py::test_group_crash" in out, out
    for name in ("test_a1", "test_a2", "test_a3", "test_group_after", "test_z1", "test_z2"):
        assert out.count(f"PASSED test_cases.py::{name}") == 1, (name, out)


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    """pytest 9.2 with xdist 3.8.0 dropped the groups silently: the suite's Ray tests ran on both workers, each
    starting its own Ray."""
    out = run(tmp_path, GROUPED, 2).stdout
    assert "5 passed" in out, out
    workers = {p.stem: p.read_text() for p in tmp_path.glob("*.worker")}
    assert len(workers) == 5, workers
    assert len({workers[f"grouped-{i}"] for i in range(3)}) == 1, workers


@pytest.mark.slow
def test_a_crash_after_finished_tests_does_not_requeue_them(tmp_path: Path) -> None:
    out = run(tmp_path, SLOW_THEN_CRASH, 1).stdout
    assert "1 failed, 2 passed" in out, out
    assert out.count("PASSED test_cases.py::test_slow") == 1, out
