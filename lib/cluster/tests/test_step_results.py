"""What a step returns, as its record stores it, and names that must fit the file system (issue 36)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from schooner.cluster import ConfigError, ResultWarning, StepRunner, step
from schooner.cluster.records import meta_path, read_step_record


def _runner(prefix: Path) -> tuple[StepRunner, io.StringIO]:
    buf = io.StringIO()
    return StepRunner(prefix=str(prefix), console=Console(file=buf, width=300)), buf


def returns_non_finite(config: dict, out: str) -> dict:
    return {"loss": math.nan, "scores": [1.0, math.inf, -math.inf], "ok": 2.5}


def test_non_finite_results_are_stored_as_null_with_a_named_warning(tmp_path: Path) -> None:
    h = step("nan-result", returns_non_finite, {"a": 1})
    runner, buf = _runner(tmp_path)
    with pytest.warns(ResultWarning, match=r"step 'nan-result'.*loss.*nan.*null") as caught:
        result = runner.run([h])
    message = str(caught[0].message)
    assert "result['scores'][1] = inf" in message and "result['scores'][2] = -inf" in message
    record = read_step_record(result[h].output_path)
    assert record["result"] == {"loss": None, "scores": [1.0, None, None], "ok": 2.5}
    # The file is strict JSON (no NaN, no 'nan' strings).
    text = Path(meta_path(result[h].output_path, "step.json")).read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in step.json"))
    assert "'nan'" not in text and '"nan"' not in text
    assert "null" in buf.getvalue() and "nan-result" in buf.getvalue()


def returns_a_lot(config: dict, out: str) -> Any:
    return "x" * (30 * 1024 * 1024)


def test_a_result_too_large_to_record_is_replaced_by_a_note_with_a_warning(tmp_path: Path) -> None:
    h = step("big-result", returns_a_lot, {})
    runner, buf = _runner(tmp_path)
    with pytest.warns(ResultWarning, match=r"step 'big-result'.*31,457,\d+ characters.*output folder"):
        result = runner.run([h])
    note = read_step_record(result[h].output_path)["result"]
    assert "too large" in note["note"]
    assert "big-result" in buf.getvalue() and "too large" in buf.getvalue()


def writes_a_file(config: dict, out: str) -> str:
    Path(out, "f.txt").write_text("x")
    return "ok"


@pytest.mark.parametrize("length", [218, 230, 246, 300])
def test_a_step_name_too_long_for_a_folder_fails_when_the_step_is_made(length: int) -> None:
    with pytest.raises(ConfigError, match=rf"step name part of {length} characters.*at most 200"):
        step("group/" + "n" * length, writes_a_file, {})


def test_the_longest_name_allowed_runs(tmp_path: Path) -> None:
    h = step("group/" + "n" * 200, writes_a_file, {})
    runner, _ = _runner(tmp_path)
    assert runner.run([h]).ok
    assert Path(h.output_path(str(tmp_path)), "f.txt").read_text() == "x"
