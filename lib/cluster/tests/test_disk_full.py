"""A full disk (OSError ENOSPC) is a step failure, recorded FAILED with the error named, never INTERRUPTED.

On a real full filesystem the runner's own end records need space too: without some kept aside, the status
stayed RUNNING and `schooner status` called the step INTERRUPTED. The real case runs a driver on a small
tmpfs mounted in a private user and mount namespace (`unshare -rm`); it is skipped where that is not allowed.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from schooner.cluster import StepRunner, step

FILL = str(Path(__file__).parent / "experiments_data" / "fill_disk.py")


def no_space(config: dict, out: str) -> None:
    raise OSError(errno.ENOSPC, "No space left on device", os.path.join(out, "shard-0.bin"))


def test_a_step_raising_enospc_ends_failed_with_the_error_named(tmp_path: Path) -> None:
    h = step("full", no_space, {"n": 1})
    runner = StepRunner(prefix=str(tmp_path), console=Console(file=io.StringIO()))
    result = runner.run([h], raise_on_failure=False)
    assert result[h].state == "failed" and result[h].error_type == "OSError"
    folder = Path(result[h].output_path)
    status = json.loads((folder / ".schooner" / "status.json").read_text())
    assert status["status"] == "FAILED"
    assert "[Errno 28] No space left on device" in status["error"]
    record = json.loads((folder / ".schooner" / "step.json").read_text())
    assert record["state"] == "FAILED" and "No space left on device" in record["error"]


_INNER = """
set -e
mount -t tmpfs -o size=1m tmpfs "$1"
cd "$1"
code=0
"$3" -m schooner.cluster.cli run "$2" --prefix "$1/out" > "$1/run.log" 2>&1 || code=$?
echo "exit=$code"
cat "$1"/out/big-*/.schooner/status.json; echo
echo "kept=$(cat "$1"/out/.big-*.attempt-*/big.bin 2>/dev/null | wc -c)" >&2
"$3" -m schooner.cluster.cli status --prefix "$1/out" --json
"""


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -rm` (user and mount namespaces)")
@pytest.mark.parametrize(("where", "resumable"), [("process", "0"), ("cluster", "0"), ("process", "1")])
def test_a_step_that_fills_a_real_filesystem_ends_failed(tmp_path: Path, where: str, resumable: str) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = tmp_path / "inner.sh"
    script.write_text(_INNER)
    env = {**os.environ, "FILL_WHERE": where, "FILL_RESUMABLE": resumable, "COLUMNS": "200"}
    env.pop("SCHOONER_PREFIX", None)
    done = subprocess.run(
        ["unshare", "-rm", "sh", str(script), str(mnt), FILL, sys.executable],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines and lines[0] == "exit=1", done.stdout + done.stderr
    status = json.loads(lines[1])
    assert status["status"] == "FAILED", done.stdout
    assert "No space left on device" in status["error"], status
    listed = json.loads("\n".join(lines[2:]))
    assert [s["state"] for s in listed] == ["FAILED"], listed
    if resumable == "1":  # its partial output is kept for the next attempt: the space came from the reserve
        assert "kept=" in done.stderr and "kept=0\n" not in done.stderr, done.stderr


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -rm` (user and mount namespaces)")
def test_a_step_that_leaves_the_disk_nearly_full_and_returns_succeeds(tmp_path: Path) -> None:
    """The space kept aside is freed before the attempt is published, never copied with the records (a
    raw `shutil.Error` failed the step)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = tmp_path / "inner.sh"
    script.write_text(_INNER)
    env = {**os.environ, "FILL_WHERE": "process", "FILL_RETURN": "1", "COLUMNS": "200"}
    env.pop("SCHOONER_PREFIX", None)
    done = subprocess.run(
        ["unshare", "-rm", "sh", str(script), str(mnt), FILL, sys.executable],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines and lines[0] == "exit=0", done.stdout + done.stderr
    assert json.loads(lines[1])["status"] == "SUCCESS", done.stdout
    assert [s["state"] for s in json.loads("\n".join(lines[2:]))] == ["SUCCESS"]
