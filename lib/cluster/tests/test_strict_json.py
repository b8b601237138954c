"""Every file the runner writes is standard JSON, and the readers of its records refuse Python's `NaN`,
`Infinity` and `-Infinity` tokens (which jq and JavaScript's `JSON.parse` refuse) instead of reading them."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from schooner.cluster import ResultWarning, StepFailedError, StepRunner, step, storage
from schooner.cluster.records import (
    StepState,
    StepStatus,
    meta_path,
    read_experiment_records,
    read_history,
    read_metrics,
    read_step_record,
    step_status,
    write_experiment_record,
    write_step_record,
)


def _strict(text: str, where: str) -> Any:
    def refuse(token: str) -> Any:
        raise AssertionError(f"{where} holds {token}, which is not JSON")

    return json.loads(text, parse_constant=refuse)


def _step_folder(tmp_path: Path) -> str:
    out = tmp_path / "s-123"
    (out / ".schooner").mkdir(parents=True)
    return str(out)


# -- writers -------------------------------------------------------------------------------------------------


def test_the_step_record_writer_refuses_nan_naming_the_file_and_field_and_writes_nothing(
    tmp_path: Path,
) -> None:
    out = _step_folder(tmp_path)
    with pytest.raises(ValueError, match=r"step\.json: \$\.inputs\[0\]\.size is nan.*None \(null\)"):
        write_step_record(out, {"name": "s", "inputs": [{"size": math.nan}]})
    assert not Path(meta_path(out, "step.json")).exists()


def test_the_experiment_record_writer_refuses_infinity(tmp_path: Path) -> None:
    path = str(tmp_path / "experiments" / "e-1" / "run.json")
    with pytest.raises(ValueError, match=r"run\.json: \$\.duration_s is inf"):
        write_experiment_record(path, {"duration_s": math.inf, "steps": []})
    assert not Path(path).exists()


def test_a_status_with_a_non_finite_time_is_refused() -> None:
    status = StepStatus(StepState.SUCCESS, "k", "s", "o", math.nan)
    with pytest.raises(ValueError, match=r"\$\.time is nan"):
        status.to_json()


def returns_non_finite(config: dict, out: str) -> dict:
    return {"loss": math.nan, "scores": [1.0, math.inf]}


def fails(config: dict, out: str) -> None:
    raise ValueError("no good")


def test_every_json_file_a_run_writes_is_standard_json(tmp_path: Path) -> None:
    """A result holding NaN (stored as null), a config holding NaN and infinity (encoded losslessly), a
    failed step: whatever the run writes under its prefix parses with a strict reader."""
    steps = [
        step("nan-result", returns_non_finite, {"a": 1}),
        step("nan-config", returns_non_finite, {"lr": math.nan, "cap": math.inf}),
        step("fails", fails, {}),
    ]
    with pytest.warns(ResultWarning), pytest.raises(StepFailedError, match="no good"):
        StepRunner(prefix=str(tmp_path), quiet=True).run(steps)
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl")]
    assert len(files) >= 7, files
    for p in files:
        text = p.read_text()
        lines = text.splitlines() if p.suffix == ".jsonl" else [text]
        for line in lines:
            _strict(line, str(p))


# -- readers -------------------------------------------------------------------------------------------------


def test_read_json_refuses_nan_naming_the_file_line_column_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "forecast.json"
    path.write_text('{\n "name": "NaN is a word",\n "loss": NaN\n}\n')
    with pytest.raises(
        ValueError, match=r"forecast\.json: line 3, column 10 holds NaN, which is not JSON.*null"
    ):
        storage.read_json(str(path))


@pytest.mark.parametrize("token", ["Infinity", "-Infinity", "1e999"])
def test_read_json_refuses_infinities(tmp_path: Path, token: str) -> None:
    path = tmp_path / "x.json"
    path.write_text(f"[1, {token}]")
    with pytest.raises(ValueError, match=rf"x\.json: line 1, column 5 holds {token}"):
        storage.read_json(str(path))


def test_a_step_record_holding_nan_is_refused_not_read(tmp_path: Path) -> None:
    out = _step_folder(tmp_path)
    Path(meta_path(out, "step.json")).write_text('{"name": "s", "result": {"loss": NaN}}')
    with pytest.raises(ValueError, match=r"\.schooner/step\.json: line 1, column 34 holds NaN.*null"):
        read_step_record(out)


def test_a_status_holding_infinity_is_refused_not_read(tmp_path: Path) -> None:
    out = _step_folder(tmp_path)
    Path(meta_path(out, "status.json")).write_text(
        '{"status": "SUCCESS", "key": "k", "name": "s", "owner": "o", "time": Infinity}'
    )
    with pytest.raises(ValueError, match=r"status\.json: line 1, column \d+ holds Infinity"):
        step_status(out)


def test_a_history_line_holding_nan_is_refused_naming_its_line(tmp_path: Path) -> None:
    out = _step_folder(tmp_path)
    Path(meta_path(out, "history.jsonl")).write_text('{"state": "FAILED"}\n{"duration_s": NaN}\n')
    with pytest.raises(ValueError, match=r"history\.jsonl:2: line 1, column 16 holds NaN"):
        read_history(out)


def test_an_experiment_record_holding_nan_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "experiments" / "e-1"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text('{"started": 1.0, "duration_s": NaN}')
    with pytest.raises(ValueError, match=r"run\.json: line 1, column 32 holds NaN"):
        read_experiment_records(str(tmp_path))


def test_a_metrics_line_holding_nan_is_refused_naming_its_line(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": NaN}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: line 1, column 21 holds NaN.*null"):
        read_metrics(str(tmp_path))


@pytest.mark.parametrize("command", ["status", "report"])
def test_the_command_line_names_a_record_holding_nan_in_one_line(tmp_path: Path, command: str) -> None:
    out = _step_folder(tmp_path)
    Path(meta_path(out, "status.json")).write_text(
        '{"status": "SUCCESS", "key": "k", "name": "s", "owner": "o", "time": NaN}'
    )
    env = {**os.environ, "COLUMNS": "250"}
    done = subprocess.run(
        [sys.executable, "-m", "schooner.cluster.cli", command, "--prefix", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output
    assert f"error: {meta_path(out, 'status.json')}: line 1, column 70 holds NaN" in output.replace("\n", "")


def test_a_run_over_a_status_holding_infinity_stops_with_one_line(tmp_path: Path) -> None:
    exp = tmp_path / "exp.py"
    exp.write_text(
        "from schooner.cluster import StepRunner, step\n\n\ndef f(config, out):\n    return 1\n\n\n"
        "s = step('s', f, {})\n\nif __name__ == '__main__':\n    StepRunner().main([s])\n"
    )
    env = {**os.environ, "COLUMNS": "250"}
    env.pop("SCHOONER_PREFIX", None)
    command = [sys.executable, "-m", "schooner.cluster.cli", "run", str(exp), "--prefix", str(tmp_path)]
    first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    (status,) = tmp_path.glob("s-*/.schooner/status.json")
    status.write_text(status.read_text().replace('"time": ', '"time": Infinity, "was": '))
    for argv in (command, [sys.executable, str(exp), "--prefix", str(tmp_path)]):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
        output = done.stdout + done.stderr
        assert done.returncode == 2, output
        assert "Traceback" not in output
        assert f"error: {status}: line 1, column " in output.replace("\n", "")
        assert "holds Infinity" in output


def writes_a_file(config: dict, out: str) -> int:
    os.makedirs(out, exist_ok=True)
    Path(out, "data.txt").write_text("kept")
    return 1


def test_a_forced_rerun_over_a_record_holding_nan_stops_before_writing_anything(tmp_path: Path) -> None:
    """The plan refuses it, as it refuses the record of a cached step it reads: nothing is written and the
    published output stays. The step was reported failed with the runner's own frames (`check_own_folder`
    read the record), and its SUCCESS status and record were replaced by a FAILED attempt that never ran."""
    from schooner.cluster.storage import NotStandardJSON

    h = step("forced-nan", writes_a_file, {})
    StepRunner(prefix=str(tmp_path), quiet=True).run([h])
    out = h.output_path(str(tmp_path))
    record = Path(meta_path(out, "step.json"))
    record.write_text(record.read_text().replace('"result": 1', '"result": NaN'))
    assert "NaN" in record.read_text()
    status_before, record_before = Path(meta_path(out, "status.json")).read_text(), record.read_text()
    with pytest.raises(NotStandardJSON, match=r"step\.json: line \d+, column \d+ holds NaN"):
        StepRunner(prefix=str(tmp_path), quiet=True).run([h], force="forced-nan")
    assert Path(meta_path(out, "status.json")).read_text() == status_before  # still SUCCESS, untouched
    assert record.read_text() == record_before
    assert Path(out, "data.txt").read_text() == "kept"


def test_the_error_is_named_by_its_public_module_and_pickles() -> None:
    """Tracebacks name `schooner.cluster.storage.NotStandardJSON`, where the docs find it (not the private
    `schooner.cluster._reading`), as the package's other public errors are named; a worker's error travels."""
    import pickle
    import traceback

    from schooner.cluster import storage

    with pytest.raises(storage.NotStandardJSON) as err:
        storage.loads_json('{"loss": NaN}', "run.json")
    line = traceback.format_exception_only(type(err.value), err.value)[-1]
    assert line.startswith("schooner.cluster.storage.NotStandardJSON: run.json: line 1"), line
    assert type(pickle.loads(pickle.dumps(err.value))) is storage.NotStandardJSON
