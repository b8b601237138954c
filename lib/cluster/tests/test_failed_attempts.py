"""A failed attempt's files are kept for debugging beside the output, the newest few (issue 36)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from schooner.cluster import StepRunner, step
from schooner.cluster.records import read_history, read_step_record
from schooner.cluster.runner._publish import FAILED_KEPT


def dumps_then_fails(config: dict, out: str) -> None:
    Path(out, "debug-dump.txt").write_text("state at the crash")
    raise RuntimeError("crashed after its dump")


def test_a_failed_attempt_keeps_its_files_and_only_the_newest_are_kept(tmp_path: Path) -> None:
    h = step("crashy", dumps_then_fails, {})
    kept: list[str] = []
    for _ in range(FAILED_KEPT + 2):
        buf = io.StringIO()
        result = StepRunner(prefix=str(tmp_path), console=Console(file=buf, width=300)).run(
            [h], raise_on_failure=False
        )
        assert result[h].state == "failed"
        assert result[h].error_line() == "RuntimeError: crashed after its dump"
        where = read_step_record(result[h].output_path)["failed_attempt_path"]
        assert Path(where, "debug-dump.txt").read_text() == "state at the crash"
        assert where in buf.getvalue() and where in result[h].error
        kept.append(where)
    on_disk = sorted(str(p) for p in tmp_path.glob(".crashy-*.failed-*"))
    assert on_disk == sorted(kept[-FAILED_KEPT:])
    assert [r.get("failed_attempt_path") for r in read_history(h.output_path(str(tmp_path)))] == kept
