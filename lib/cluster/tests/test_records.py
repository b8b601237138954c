"""`schooner.cluster.records`: the files of a step's output folder, read and written through one module,
for local folders and fsspec URLs alike."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import pytest

from schooner.cluster import StepRunner, records, step, storage


@pytest.fixture(params=["local", "memory"])
def out(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "step-1234")
    return f"memory://records/{uuid.uuid4().hex}/step-1234"


def test_metrics_round_trip_and_non_finite_values_as_null(out: str) -> None:
    records.append_metrics(out, {"step": 0, "loss": 2.0, "name": "x"})
    records.append_metrics(out, {"step": 1, "loss": math.nan, "gnorm": math.inf})
    assert records.read_metrics(out) == [
        {"step": 0, "loss": 2.0, "name": "x"},
        {"step": 1, "loss": None, "gnorm": None},
    ]
    # Plain JSON on disk: any reader parses it (no NaN tokens, no "nan" strings).
    lines = storage.read_text(records.metrics_path(out)).splitlines()
    assert json.loads(lines[1], parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}")) == {
        "step": 1,
        "loss": None,
        "gnorm": None,
    }


def test_no_metrics_file_is_no_rows(out: str) -> None:
    assert records.read_metrics(out) == []


def test_a_torn_last_line_is_left_out_and_a_bad_middle_line_is_named(out: str) -> None:
    path = records.metrics_path(out)
    storage.write_text(path, '{"step": 0, "loss": 1.0}\n{"step": 1, "lo')
    assert records.read_metrics(out) == [{"step": 0, "loss": 1.0}]
    records.append_metrics(out, {"step": 1, "loss": 0.5})  # a resumed writer: the torn row is cut off
    assert records.read_metrics(out) == [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.5}]
    storage.write_text(path, '{"step": 0}\nnot json\n{"step": 2}\n')
    with pytest.raises(
        ValueError, match=r"metrics\.jsonl:2 is not valid JSON \(Expecting value at column 1;"
    ):
        records.read_metrics(out)
    for line, kind in (("[1, 2]", "an array"), ('"step"', "a string"), ("null", "null")):
        storage.write_text(path, line + "\n")
        with pytest.raises(ValueError) as info:
            records.read_metrics(out)
        message = str(info.value)  # in JSON's words, as storage.read_json_lines names a row (not list, str)
        assert message.startswith(f"{path}:1 is {kind}, not a JSON object ({line!r})"), message
        assert "list" not in message and "NoneType" not in message, message


def test_a_complete_last_line_without_newline_is_read(out: str) -> None:
    storage.write_text(records.metrics_path(out), '{"step": 0}\n{"step": 1}')
    assert records.read_metrics(out) == [{"step": 0}, {"step": 1}]


def test_metrics_writer_new_run_and_resume(out: str) -> None:
    with records.MetricsWriter(out) as w:
        for s in range(9):
            w.append({"step": s, "loss": 1.0 / (s + 1)})
    # The interrupted run logged steps 6..8 after its checkpoint at 5: a resume drops them.
    with records.MetricsWriter(out, resume_step=5) as w:
        w.append({"step": 6, "loss": -1.0})
    rows = records.read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5, 6] and rows[-1]["loss"] == -1.0
    with records.MetricsWriter(out) as w:  # a new run starts a new file
        w.append({"step": 0, "loss": math.nan})
    assert records.read_metrics(out) == [{"step": 0, "loss": None}]


def test_metrics_writer_on_an_object_store_uploads_at_flush() -> None:
    out = f"memory://records/{uuid.uuid4().hex}/run"
    w = records.MetricsWriter(out)
    w.upload_every_s = 3600.0
    w.append({"step": 0})
    assert records.read_metrics(out) == []  # not uploaded yet
    w.flush()
    assert records.read_metrics(out) == [{"step": 0}]
    w.append({"step": 1})
    w.close()
    assert records.read_metrics(out) == [{"step": 0}, {"step": 1}]


def _double(config: dict, output_path: str) -> dict:
    return {"n": config["n"] * 2}


def _fail(config: dict, output_path: str) -> dict:
    raise RuntimeError("planned failure")


def test_status_record_history_and_experiment_of_a_real_run(tmp_path: Path) -> None:
    prefix = str(tmp_path / "prefix")
    ok = step("records/ok", _double, config={"n": 2})
    bad = step("records/bad", _fail, config={"n": 3})
    result = StepRunner(prefix=prefix).run([ok, bad], raise_on_failure=False)
    ok_out, bad_out = ok.output_path(prefix), bad.output_path(prefix)

    status = records.step_status(ok_out)
    assert status is not None and status.state is records.StepState.SUCCESS and status.key == ok.key
    assert status.name == "records/ok"
    failed = records.step_status(bad_out)
    assert (
        failed is not None and failed.state is records.StepState.FAILED and "planned failure" in failed.error
    )
    assert records.step_status(str(tmp_path / "nothing")) is None

    record = records.read_step_record(ok_out)
    assert record is not None and record["result"] == {"n": 4} and record["state"] == "SUCCESS"
    assert [h["state"] for h in records.read_history(ok_out)] == ["SUCCESS"]
    assert [h["state"] for h in records.read_history(bad_out)] == ["FAILED"]

    found = records.read_experiment_records(prefix)
    assert len(found) == 1 and found[0][0] == result.experiment_record
    assert found[0][1]["ok"] is False and {s["name"] for s in found[0][1]["steps"]} == {
        "records/ok",
        "records/bad",
    }


def test_status_files_written_and_read_through_memory() -> None:
    out = f"memory://records/{uuid.uuid4().hex}/s"
    written = records.write_step_status(out, records.StepState.RUNNING, key="k" * 64, name="s", owner="o")
    assert records.step_status(out) == written
    storage.write_text(records.meta_path(out, "status.json"), "{torn")
    assert records.step_status(out) is None  # unreadable: no status


def test_history_keeps_the_last_attempts(out: str) -> None:
    for i in range(records.HISTORY_KEEP + 3):
        records.append_history(out, {"run_id": f"r{i}", "state": "FAILED", "env": {"host": "h"}})
    hist = records.read_history(out)
    assert len(hist) == records.HISTORY_KEEP and hist[-1]["run_id"] == f"r{records.HISTORY_KEEP + 2}"
    assert hist[0]["host"] == "h"


def test_a_metrics_line_not_utf8_names_file_line_and_fix(out: str) -> None:
    path = records.metrics_path(out)
    storage.write_bytes(path, b'{"step": 0}\n{"note": "caf\xe9"}\n')
    with pytest.raises(ValueError) as info:  # it was a bare UnicodeDecodeError
        records.read_metrics(out)
    message = str(info.value)
    assert message.startswith(f"{path}:2 is not UTF-8 text (byte 0xe9 at column 14"), message
    assert "iconv" in message, message


def test_a_metrics_line_torn_inside_a_character_is_left_out(out: str) -> None:
    path = records.metrics_path(out)
    storage.write_bytes(path, b'{"step": 0}\n{"note": "caf' + "é".encode()[:1])  # killed mid-write
    assert records.read_metrics(out) == [{"step": 0}]
