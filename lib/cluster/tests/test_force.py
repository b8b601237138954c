"""`--force` (issue 36): dependents of a replaced output rerun, and a forced rerun that fails leaves the
published output, its status and its record agreeing (real runs, real folders)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from schooner.cluster import StepRunner, step
from schooner.cluster.records import read_history, read_step_record, step_status

STATE = {"version": 0, "fail": False}
"""Outside the configs, so the keys stay: what `source` writes, and whether it fails."""


def source(config: dict, out: str) -> dict:
    if STATE["fail"]:
        raise RuntimeError("source was told to fail")
    Path(out, "data.txt").write_text(f"version {STATE['version']}")
    return {"version": STATE["version"]}


def derived(config: dict, out: str) -> str:
    text = Path(config["input"], "data.txt").read_text()
    Path(out, "copy.txt").write_text(text)
    Path(out, "data.txt").write_text(text)
    return text


def _graph():
    a = step("source", source, {"n": 1})
    b = step("derived", derived, {"input": a})
    c = step("derived-again", derived, {"input": b / ""})
    return a, b, c


def _runner(prefix: Path) -> tuple[StepRunner, io.StringIO]:
    buf = io.StringIO()
    return StepRunner(prefix=str(prefix), console=Console(file=buf, width=300)), buf


@pytest.fixture(autouse=True)
def _reset():
    STATE.update(version=0, fail=False)
    yield
    STATE.update(version=0, fail=False)


def _copy(prefix: Path, h) -> str:
    return Path(h.output_path(str(prefix)), "copy.txt").read_text()


def test_dependents_of_a_forced_step_rerun_on_its_new_output(tmp_path: Path) -> None:
    a, b, _ = _graph()
    runner, _ = _runner(tmp_path)
    assert runner.run([b]).ok and _copy(tmp_path, b) == "version 0"
    STATE["version"] = 1
    runner, buf = _runner(tmp_path)
    result = runner.run([b], force=["source"])
    assert result[a].state == "succeeded" and result[b].state == "succeeded", buf.getvalue()
    assert _copy(tmp_path, b) == "version 1"
    assert "input 'source'" in buf.getvalue()


def test_a_step_whose_input_was_replaced_in_another_run_reruns(tmp_path: Path) -> None:
    a, b, c = _graph()
    runner, _ = _runner(tmp_path)
    assert runner.run([c]).ok
    STATE["version"] = 2
    runner, _ = _runner(tmp_path)
    assert runner.run([a], force=["source"]).ok  # its dependents are not in this run
    runner, buf = _runner(tmp_path)
    plan = runner.run([c], dry_run=True)
    assert [plan[h].state for h in (a, b, c)] == ["cached", "will_run", "will_run"], buf.getvalue()
    assert "replaced since it ran" in buf.getvalue()
    result = runner.run([c])
    assert result[a].state == "cached" and result[b].state == result[c].state == "succeeded"
    assert _copy(tmp_path, b) == _copy(tmp_path, c) == "version 2"
    runner, _ = _runner(tmp_path)
    assert [runner.run([c])[h].state for h in (a, b, c)] == ["cached"] * 3


def test_a_forced_rerun_that_fails_leaves_the_published_output_and_says_so(tmp_path: Path) -> None:
    a, b, _ = _graph()
    runner, _ = _runner(tmp_path)
    assert runner.run([b]).ok
    out = a.output_path(str(tmp_path))
    STATE["fail"] = True
    runner, buf = _runner(tmp_path)
    result = runner.run([b], force=["source"], raise_on_failure=False)
    assert result[a].state == "failed" and result[b].state == "skipped"
    assert "previous output stays published" in result[a].error
    # What the folder holds, its status and its record agree: the published (old) attempt.
    assert Path(out, "data.txt").read_text() == "version 0"
    status = step_status(out)
    record = read_step_record(out)
    assert status.state.value == "SUCCESS" and record["state"] == "SUCCESS"
    assert record["result"] == {"version": 0} and record["owner"] == status.owner
    assert "source was told to fail" in record["last_failed_attempt"]["error"]
    history = read_history(out)
    assert [h["state"] for h in history] == ["SUCCESS", "FAILED"]
    # The next run reuses the published output, and says a forced rerun of it failed.
    STATE["fail"] = False
    runner, buf = _runner(tmp_path)
    again = runner.run([b])
    assert again[a].state == again[b].state == "cached"
    assert "forced rerun failed" in buf.getvalue()
