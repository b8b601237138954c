"""The step runner on an object store: a real S3 API server (moto, its own process) as the prefix."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest
from rich.console import Console

from schooner.cluster import StepRunner, step, write_report
from schooner.cluster.views import scan_prefix

HERE = Path(__file__).parent / "experiments_data"


@dataclass(frozen=True)
class Cfg:
    name: str
    inputs: Any = ()


def add_up(config: Cfg, out: str) -> dict:
    total = 1
    for path in config.inputs:
        with fsspec.open(f"{path}/value.txt") as f:
            total += int(f.read())
    with fsspec.open(f"{out}/value.txt", "w") as f:
        f.write(str(total))
    with fsspec.open(f"{out}/metrics.jsonl", "w") as f:
        f.write(json.dumps({"step": 1, "train/loss": 2.5}) + "\n")
    return {"total": total}


def test_a_graph_runs_on_s3_reruns_cached_and_reports_there(s3_prefix: str) -> None:
    a = step("a", add_up, Cfg("a"))
    b = step("b", add_up, Cfg("b", (a,)))
    c = step("c/x", add_up, Cfg("c", (a, b)))
    buf = io.StringIO()
    result = StepRunner(prefix=s3_prefix, console=Console(file=buf, width=200)).run([c])
    assert result.ok and result[c].result == {"total": 4}  # 1 + a(1) + b(2)
    fs, _ = fsspec.core.url_to_fs(s3_prefix)
    status = json.loads(fs.cat_file(f"{result[c].output_path}/.schooner/status.json"))
    assert status["status"] == "SUCCESS" and status["key"] == c.key
    again = StepRunner(prefix=s3_prefix, quiet=True).run([c])
    assert {o.state for o in again.steps} == {"cached"}
    assert {f.output_path for f in scan_prefix(s3_prefix)} == {result[h].output_path for h in (a, b, c)}
    report = write_report(s3_prefix)
    assert report == f"{s3_prefix}/report.html" and b"c/x" in fs.cat_file(report)


def _driver(prefix: str, log: Path, **env: str) -> subprocess.Popen:
    full = {**os.environ, "EXP_LOG": str(log), "COLUMNS": "200", **env}
    full.pop("SCHOONER_PREFIX", None)
    cmd = [sys.executable, "-m", "schooner.cluster.cli", "run", str(HERE / "s3_rows.py"), "--prefix", prefix]
    return subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip


def _row_objects(prefix: str) -> list[str]:
    fs, root = fsspec.core.url_to_fs(prefix)
    return [p for p in fs.find(root.rstrip("/")) if "/rows/" in p]


@pytest.mark.slow  # a full-suite budget cut (see pyproject's --durations); test_cli.py's two drivers on a local prefix stay
def test_two_drivers_on_one_bucket_run_the_step_once(s3_prefix: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    drivers = [_driver(s3_prefix, log, APP_ROWS="8", APP_DELAY="0.05") for _ in range(2)]
    outs = [d.communicate(timeout=300)[0] for d in drivers]
    assert [d.returncode for d in drivers] == [0, 0], outs
    assert len(log.read_text().splitlines()) == 1  # one start: the lease (a conditional write) held
    assert len(_row_objects(s3_prefix)) == 8


@pytest.mark.slow  # a full-suite budget cut (see pyproject's --durations); the kill -9 reruns on a local prefix stay (test_step_attempts.py)
def test_kill_9_of_the_driver_then_a_rerun_leaves_exactly_one_attempts_output(
    s3_prefix: str, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    first = _driver(s3_prefix, log, APP_DELAY="0.2")
    deadline = time.monotonic() + 120
    while len(_row_objects(s3_prefix)) < 5:
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()[0]
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=30)
    second = _driver(s3_prefix, log, APP_DELAY="0")
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out
    time.sleep(1.0)
    rows = _row_objects(s3_prefix)
    assert len(rows) == 20 and len({r.rsplit("/", 1)[-1].split("-")[0] for r in rows}) == 1, rows


def many_objects(config: Cfg, out: str) -> int:
    fs, root = fsspec.core.url_to_fs(out)
    fs.pipe({f"{root}/shards/part-{i:05d}": b"x" for i in range(300)})
    return 300


def test_status_lists_folders_level_by_level_never_a_steps_objects(s3_prefix: str, monkeypatch) -> None:
    h = step("big/shards", many_objects, Cfg("big"))
    small = step("small", add_up, Cfg("small"))
    StepRunner(prefix=s3_prefix, quiet=True).run([h, small])
    import s3fs

    listed: list[str] = []
    real_ls = s3fs.S3FileSystem._ls

    async def counting_ls(self, path, *args, **kwargs):
        out = await real_ls(self, path, *args, **kwargs)
        listed.extend(o["name"] if isinstance(o, dict) else o for o in out)
        return out

    def no_find(*args, **kwargs):
        raise AssertionError("listed every object under the prefix")

    monkeypatch.setattr(s3fs.S3FileSystem, "_ls", counting_ls)
    monkeypatch.setattr(s3fs.S3FileSystem, "_find", no_find)
    found = scan_prefix(s3_prefix)
    assert len(found) == 2 and all(f.status is not None for f in found)
    assert not any("/shards/" in name for name in listed)
    assert len(listed) < 20
