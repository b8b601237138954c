"""A failed step's error is printed once, by `schooner run EXP.py` and by `python EXP.py`
(`StepRunner().main`): with the step's name and its traceback, and where its record keeps the whole of it.

It was printed three times: on the step's FAILED line, in the summary table's reason column, and at the end
of the traceback printed after the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXPERIMENT = """
from schooner.cluster import StepRunner, step


def fine(config, out):
    return 1


def explode(config, out):
    raise ValueError("boom " + "7f3a: the step broke")


ok = step("fine-step", fine, {})
bad = step("exploding-step", explode, {"a": 1})

if __name__ == "__main__":
    StepRunner().main([ok, bad])
"""

ERROR_LINE = "ValueError: boom 7f3a: the step broke"


def _run(tmp_path: Path, how: str) -> tuple[subprocess.CompletedProcess, Path]:
    exp = tmp_path / "exploding.py"
    exp.write_text(EXPERIMENT)
    prefix = tmp_path / "out"
    prefix.mkdir()
    env = {**os.environ, "COLUMNS": "250"}
    env.pop("SCHOONER_PREFIX", None)
    command = (
        [sys.executable, str(exp)]
        if how == "python"
        else [sys.executable, "-m", "schooner.cluster.cli", "run", str(exp)]
    )
    done = subprocess.run(
        [*command, "--prefix", str(prefix)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    return done, prefix


@pytest.mark.parametrize("how", ["schooner run", "python"])
def test_a_failed_steps_error_is_printed_once_with_its_traceback_and_record(tmp_path: Path, how: str) -> None:
    done, prefix = _run(tmp_path, how)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert output.count("boom 7f3a") == 1, output
    assert output.count(ERROR_LINE) == 1, output
    # The traceback is there, ending in the error line, under the step's name.
    at = output.index(ERROR_LINE)
    block = output[: at + len(ERROR_LINE)]
    assert "exploding-step failed" in block
    assert 'exploding.py", line 10, in explode' in block.rsplit("exploding-step failed", 1)[1]
    # Where the whole traceback is kept: the step's record, which holds it.
    (folder,) = prefix.glob("exploding-step-*")
    record = folder / ".schooner" / "step.json"
    assert str(record) in output.replace("\n", "")
    assert ERROR_LINE in json.loads(record.read_text())["error"]
    # The step's FAILED line and the summary table still name the step and say that it failed.
    failed_lines = [ln for ln in output.splitlines() if "exploding-step" in ln and "FAILED" in ln]
    assert len(failed_lines) >= 2, output


def fails_when_asked(config: dict, out: str) -> int:
    if os.environ.get("SCHOONER_TEST_FAIL_NOW"):
        raise ValueError("asked " + "to fail")
    return 1


def test_a_failed_forced_rerun_over_a_published_output_points_at_its_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record stays the published output's, so the whole traceback is in the history's last line."""
    from schooner.cluster.records import meta_path, read_history

    h, result, output = _published_then_forced_to_fail("flaky", fails_when_asked, tmp_path, monkeypatch)
    assert output.count("ValueError: asked to fail") == 1, output
    history = meta_path(result[h].output_path, "history.jsonl")
    assert f"the whole traceback is the `error` of the last line of {history}" in output
    assert "ValueError: asked to fail" in read_history(result[h].output_path)[-1]["error"]


def _published_then_forced_to_fail(name: str, fn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Step `name` run once (published), then forced to rerun with SCHOONER_TEST_FAIL_NOW set: its handle, the
    run's result and the console's output."""
    import io

    from rich.console import Console

    from schooner.cluster import StepRunner, step

    h = step(name, fn, {})
    StepRunner(prefix=str(tmp_path), quiet=True).run([h])
    monkeypatch.setenv("SCHOONER_TEST_FAIL_NOW", "1")
    buf = io.StringIO()
    runner = StepRunner(prefix=str(tmp_path), console=Console(file=buf, width=400))
    result = runner.run([h], force=name, raise_on_failure=False)
    return h, result, buf.getvalue()


def _down_a(n: int) -> int:
    return _down_b(n - 1) + 1


def _down_b(n: int) -> int:
    if n <= 0:
        raise ValueError("asked " + "to fail deep down")
    return _down_a(n - 1) + 1


def fails_deep_when_asked(config: dict, out: str) -> int:
    if os.environ.get("SCHOONER_TEST_FAIL_NOW"):
        return _down_a(40)  # 40 frames: far more than the lines printed after the table
    return 1


def test_a_deep_failure_over_a_published_output_keeps_its_notes_and_cuts_at_a_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notes before a long traceback (the published output that stays, the failed attempt's files) are
    printed whole: only the traceback is cut to its last lines, from a frame's `File` line. They were cut
    away with its head, so a `--force` that failed deep down did not say that the old output stays."""
    h, result, output = _published_then_forced_to_fail(
        "deep-flaky", fails_deep_when_asked, tmp_path, monkeypatch
    )
    block = output[output.index("deep-flaky failed (") :]
    assert "lines above)" in block, block  # the traceback was cut
    assert f"(the previous output stays published in {result[h].output_path}:" in block, block
    assert "(this attempt's files are kept for debugging in " in block, block
    shown = block.split("lines above)\n", 1)[1].splitlines()
    assert shown[0].lstrip().startswith("File "), block  # a whole frame, not its caret or source line
    assert "ValueError: asked to fail deep down" in shown[-2], block


def raises_in_a_worker(config: dict, out: str) -> int:
    raise ValueError("worker " + "3c9d: the step broke")


def test_a_cluster_steps_failure_names_its_exception_and_prints_it_once(tmp_path: Path) -> None:
    """A step run by a worker (`resources=`) failed as `JobError`: its FAILED line and table row said
    `JobError`, and its error was printed three times (the cause re-raised in the driver, the JobError's
    message, the remote traceback's last line). Its own exception's type and traceback are what is shown."""
    import io

    from rich.console import Console

    from schooner.cluster import LocalClient, ResourceConfig, StepRunner, step, using_client

    h = step("worker-step", raises_in_a_worker, {}, resources=ResourceConfig.with_cpu())
    buf = io.StringIO()
    with LocalClient(max_workers=1) as client, using_client(client):
        runner = StepRunner(prefix=str(tmp_path), console=Console(file=buf, width=400))
        result = runner.run([h], raise_on_failure=False)
    output = buf.getvalue()
    assert result[h].state == "failed"
    assert output.count("worker 3c9d: the step broke") == 1, output
    assert "JobError" not in output, output
    failed_lines = [ln for ln in output.splitlines() if "worker-step" in ln and "FAILED" in ln]
    assert failed_lines and all("ValueError" in ln for ln in failed_lines), output
    assert "in raises_in_a_worker" in output, output
