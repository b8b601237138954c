"""Every attempt of a step starts from an empty output unless the step is resumable; `--force` reruns.

The workload that exposes partial output: a step that appends rows to a file, killed with `kill -9` of the
driver mid-way, then rerun. Real driver processes (`schooner run`), on the LocalClient, in the runner's own
process, and on a real Ray cluster.
"""

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

import pytest
from rich.console import Console

from schooner.cluster import ResourceConfig, StepRunner, step, using_client

HERE = Path(__file__).parent / "experiments_data"
APPENDER = str(HERE / "appender.py")


def _driver(prefix: Path, *args: str, **env: str) -> subprocess.Popen:
    full = {**os.environ, "COLUMNS": "200", **env}
    full.pop("SCHOONER_PREFIX", None)
    return subprocess.Popen(
        [sys.executable, "-m", "schooner.cluster.cli", "run", APPENDER, "--prefix", str(prefix), *args],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _rows_file(prefix: Path) -> Path | None:
    """The rows being written: in the running attempt's own folder (or, once done, the published one)."""
    found = list(prefix.glob(".rows-*.attempt-*/rows.txt")) + list(prefix.glob("rows-*/rows.txt"))
    return found[0] if found else None


def _count(path: Path | None) -> int:
    return len(path.read_text().splitlines()) if path is not None and path.exists() else 0


def _wait_for_rows(prefix: Path, n: int, proc: subprocess.Popen, timeout: float = 120.0) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = _rows_file(prefix)
        if _count(path) >= n:
            assert path is not None
            return path
        if proc.poll() is not None:
            raise AssertionError(f"driver ended before writing {n} rows:\n{proc.communicate()[0]}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"no {n} rows after {timeout} s:\n{proc.communicate()[0]}")


def _status(folder: Path) -> dict:
    return json.loads((folder / ".schooner" / "status.json").read_text())


def _kill_then_rerun(tmp_path: Path, *args: str, **env: str) -> None:
    prefix = tmp_path / "out"
    first = _driver(prefix, *args, APP_DELAY="0.2", **env)
    killed = _wait_for_rows(prefix, 5, first)
    os.kill(first.pid, signal.SIGKILL)  # the driver only: what it started must not outlive it
    first.communicate(timeout=30)
    second = _driver(prefix, *args, APP_DELAY="0.01", **env)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out
    time.sleep(1.5)  # an orphaned first attempt would still be appending now
    (rows,) = prefix.glob("rows-*/rows.txt")
    assert _count(rows) == 20, rows.read_text()
    # The killed attempt's own folder is gone (the rerun removed it), nothing else is left beside the output.
    assert not killed.parent.exists() and not list(prefix.glob(".rows-*"))
    assert _status(rows.parent)["status"] == "SUCCESS"
    record = json.loads((rows.parent / ".schooner" / "step.json").read_text())
    assert record["result"] == {"rows": 20}
    # The killed attempt wrote no end; the next one records it, so the history lists every attempt.
    history = [
        json.loads(ln) for ln in (rows.parent / ".schooner" / "history.jsonl").read_text().splitlines()
    ]
    assert [h["state"] for h in history] == ["LOST", "SUCCESS"], history
    assert history[0]["ended"] is None and history[0]["started"] < history[1]["started"]
    assert "no end was recorded" in history[0]["error"]


@pytest.mark.slow  # a full-suite budget cut (see pyproject's --durations); the LocalClient variant stays
def test_killed_appending_step_reruns_from_empty_output_in_process(tmp_path: Path) -> None:
    _kill_then_rerun(tmp_path, APP_WHERE="process")


def test_killed_appending_step_reruns_from_empty_output_on_local_client(tmp_path: Path) -> None:
    _kill_then_rerun(tmp_path, APP_WHERE="cluster")


@pytest.mark.slow
@pytest.mark.ray
def test_killed_appending_step_reruns_from_empty_output_on_ray(tmp_path: Path) -> None:
    _kill_then_rerun(tmp_path, "--cluster", "ray", APP_WHERE="cluster")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split(")")[-1].split()[0] != "Z"


def _children_die_with_driver(tmp_path: Path, *args: str, **env: str) -> None:
    prefix, child_log = tmp_path / "out", tmp_path / "child.log"
    first = _driver(prefix, *args, APP_DELAY="0.2", APP_CHILD=str(child_log), **env)
    _wait_for_rows(prefix, 3, first)
    pid = int(Path(f"{child_log}.pid").read_text())
    assert _alive(pid)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not _alive(pid), "the step's child process outlived kill -9 of the driver"
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_steps_subprocesses_die_with_the_driver_on_local_client(tmp_path: Path) -> None:
    _children_die_with_driver(tmp_path, APP_WHERE="cluster")


@pytest.mark.slow
@pytest.mark.ray
def test_a_steps_subprocesses_die_with_the_driver_on_ray(tmp_path: Path) -> None:
    _children_die_with_driver(tmp_path, "--cluster", "ray", APP_WHERE="cluster")


# -- attempts, retries and --force in one runner --------------------------------------------------------


@dataclass(frozen=True)
class AppendCfg:
    rows: int
    attempts_file: str
    """Outside the output: one line per attempt, so a test can tell attempts apart."""
    fail_first: bool = False
    fail_always: bool = False


def append_and_maybe_fail(config: AppendCfg, out: str) -> dict:
    """Appends `rows` rows; the first attempt (or every one) raises after appending."""
    with open(config.attempts_file, "a") as f:
        f.write("attempt\n")
    with open(config.attempts_file) as f:
        attempt = len(f.read().splitlines())
    path = os.path.join(out, "rows.txt")
    before = len(Path(path).read_text().splitlines()) if os.path.exists(path) else 0
    with open(path, "a") as f:
        for i in range(config.rows):
            f.write(f"attempt {attempt} row {i}\n")
    if config.fail_always or (config.fail_first and attempt == 1):
        raise RuntimeError(f"attempt {attempt} fails after appending")
    return {"found_before": before}


def reader(config: dict, out: str) -> dict:
    with open(os.path.join(config["rows"], "rows.txt")) as f:
        return {"rows": len(f.read().splitlines())}


def _run(prefix: Path, steps, **kw):
    buf = io.StringIO()
    runner = StepRunner(prefix=str(prefix), console=Console(file=buf, width=200))
    return runner.run(steps, **kw), buf.getvalue()


@pytest.mark.parametrize("resumable", [False, True])
def test_a_retried_attempt_starts_empty_unless_the_step_is_resumable(
    tmp_path: Path, client, resumable
) -> None:
    cfg = AppendCfg(rows=3, attempts_file=str(tmp_path / "attempts"), fail_first=True)
    res = ResourceConfig.with_cpu(max_retries_failure=1)
    h = step("rows", append_and_maybe_fail, cfg, resources=res, resumable=resumable)
    with using_client(client):
        result, _ = _run(tmp_path / "out", [h])
    assert result.ok
    rows = (Path(result[h].output_path) / "rows.txt").read_text().splitlines()
    if resumable:  # the second attempt got the first one's rows back
        assert result[h].result == {"found_before": 3} and len(rows) == 6
    else:
        assert result[h].result == {"found_before": 0} and rows == [f"attempt 2 row {i}" for i in range(3)]


def test_force_reruns_a_resumable_step_from_an_empty_folder(tmp_path: Path) -> None:
    cfg = AppendCfg(rows=4, attempts_file=str(tmp_path / "attempts"))
    h = step("rows", append_and_maybe_fail, cfg, resumable=True)
    first, _ = _run(tmp_path / "out", [h])
    (Path(first[h].output_path) / "stale.bin").write_bytes(b"from an older run")
    again, text = _run(tmp_path / "out", [h], force="rows")
    assert again[h].state == "succeeded" and again[h].result == {"found_before": 0}
    folder = Path(again[h].output_path)
    assert sorted(p.name for p in folder.iterdir()) == [".schooner", "rows.txt"]
    assert len((folder / "rows.txt").read_text().splitlines()) == 4
    assert "--force: reruns from an empty folder" in text


def test_a_forced_step_that_fails_is_not_done_and_its_dependents_are_not_cached(tmp_path: Path) -> None:
    attempts = str(tmp_path / "attempts")
    ok = step("rows", _fail_if_marked, AppendCfg(rows=2, attempts_file=attempts))
    down = step("reader", reader, {"rows": ok})
    first, _ = _run(tmp_path / "out", [down])
    assert first.ok and first[down].result == {"rows": 2}
    # The same step (same key and code: whether it fails is read from a file here) fails when forced.
    Path(attempts).write_text("")
    failing = step("rows", _fail_if_marked, AppendCfg(rows=2, attempts_file=attempts))
    assert failing.key == ok.key
    (tmp_path / "fail-marker").write_text("")
    os.environ["SCHOONER_TEST_FAIL_MARKER"] = str(tmp_path / "fail-marker")
    try:
        down2 = step("reader", reader, {"rows": failing})
        result, text = _run(tmp_path / "out", [down2], force="^rows$", raise_on_failure=False)
    finally:
        del os.environ["SCHOONER_TEST_FAIL_MARKER"]
    assert result[failing].state == "failed"
    assert result[down2].state == "skipped" and "rows" in result[down2].error
    # The previous output stays published, and its status says so (issue 36: it said FAILED over it).
    status = _status(Path(result[failing].output_path))
    assert status["status"] == "SUCCESS" and "a forced rerun failed" in status["error"]
    assert "cached" not in {o.state for o in result.steps}


def _fail_if_marked(config: AppendCfg, out: str) -> dict:
    if os.path.exists(os.environ.get("SCHOONER_TEST_FAIL_MARKER", "/nonexistent")):
        raise RuntimeError("marked to fail")
    return append_and_maybe_fail(config, out)


def test_a_folder_holding_foreign_files_is_refused_and_left_alone(tmp_path: Path) -> None:
    mine = tmp_path / "my-data"
    mine.mkdir()
    (mine / "precious.txt").write_text("do not delete")
    h = step(
        "rows",
        append_and_maybe_fail,
        AppendCfg(rows=1, attempts_file=str(tmp_path / "a")),
        override_output_path=str(mine),
    )
    result, _ = _run(tmp_path / "out", [h], raise_on_failure=False)
    assert result[h].state == "failed" and "holds files it did not write (precious.txt)" in result[h].error
    assert (mine / "precious.txt").read_text() == "do not delete"
    assert not (mine / "rows.txt").exists()


def interrupt_myself(config: dict, out: str) -> None:
    with open(os.path.join(out, "partial.txt"), "w") as f:
        f.write("half")
    raise KeyboardInterrupt


def test_a_keyboard_interrupt_inside_a_step_records_it_interrupted(tmp_path: Path) -> None:
    from schooner.cluster import RunInterrupted

    h = step("stops", interrupt_myself, {"n": 1})
    with pytest.raises(RunInterrupted) as err:
        _run(tmp_path / "out", [h])
    assert "stops after" in str(err.value) and "a rerun starts it again" in str(err.value)
    folder = next((tmp_path / "out").glob("stops-*"))
    assert _status(folder)["status"] == "INTERRUPTED"
    history = [json.loads(x) for x in (folder / ".schooner" / "history.jsonl").read_text().splitlines()]
    assert [e["state"] for e in history] == ["INTERRUPTED"]


def test_a_lost_attempt_is_recorded_once(tmp_path: Path) -> None:
    """A taker killed right after recording the attempt before it as LOST leaves the record RUNNING; the next
    taker must not record the same attempt again, and a finished record adds nothing."""
    from schooner.cluster.records import read_history, record_lost_attempt, write_step_record

    out = str(tmp_path / "step")
    write_step_record(out, {"run_id": "r1", "owner": "o1", "state": "RUNNING", "started": 10.0})
    assert record_lost_attempt(out) is not None
    assert record_lost_attempt(out) is None
    assert [(h["run_id"], h["state"], h["started"]) for h in read_history(out)] == [("r1", "LOST", 10.0)]
    write_step_record(out, {"run_id": "r2", "owner": "o2", "state": "SUCCESS", "started": 20.0})
    assert record_lost_attempt(out) is None and len(read_history(out)) == 1


def die_on_first_start(config: dict, out: str) -> dict:
    """The first start kills its own worker (a preempted host); the next one writes its output."""
    marker = config["marker"]
    if not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    Path(out, "done.txt").write_text("done")
    return {"pid": os.getpid()}


def test_a_preempted_start_is_recorded_with_its_node_in_the_record_and_history(
    tmp_path: Path, local_client
) -> None:
    marker = tmp_path / "first-pid"
    h = step("preempted", die_on_first_start, {"marker": str(marker)}, resources=ResourceConfig.with_cpu())
    with using_client(local_client):
        result, text = _run(tmp_path / "out", [h])
    assert result[h].state == "succeeded"
    folder = Path(result[h].output_path)
    record = json.loads((folder / ".schooner" / "step.json").read_text())
    starts = record["starts"]
    first_pid, second_pid = int(marker.read_text()), result[h].result["pid"]
    assert [(s["pid"], s["how"]) for s in starts] == [
        (first_pid, "died (worker or node lost)"),
        (second_pid, "returned"),
    ], starts
    assert starts[0]["ended"] is None and starts[0]["started"] < starts[1]["started"] <= starts[1]["ended"]
    assert {s["node"] for s in starts} == {os.uname().nodename}  # LocalClient: this host
    (line,) = [json.loads(x) for x in (folder / ".schooner" / "history.jsonl").read_text().splitlines()]
    assert line["state"] == "SUCCESS" and line["starts"] == starts
    assert "started 2 times" in text and "(died) ->" in text
    assert not (folder / ".schooner" / "starts.jsonl").exists()  # only the record keeps them
