"""The JSON-lines inputs train reads (GRPO prompts, sweep results) go through `storage.read_json_lines`: `.gz`
files are read, a row is one line even when its text holds a Unicode line separator, and a bad line is named
`path:line` with the fix."""

from __future__ import annotations

import gzip
import json

import pytest

from schooner.train._rl_batches import read_prompts
from schooner.train.scaling import ScalingRun, read_runs

PROMPTS = [
    {"id": "p1", "prompt": "2+2=", "answer": 4},
    {"id": "p2", "prompt": "line\u2028break", "answer": 0},
]


def test_prompts_are_read_from_gzip_and_a_line_separator_stays_in_its_row(tmp_path) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in PROMPTS)
    (tmp_path / "p.jsonl").write_text(text, encoding="utf-8")
    (tmp_path / "p.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    plain, packed = read_prompts(str(tmp_path / "p.jsonl")), read_prompts(str(tmp_path / "p.jsonl.gz"))
    assert [(r.row_id, r.prompt, dict(r.fields)) for r in plain] == [
        (r["id"], r["prompt"], r) for r in PROMPTS
    ]
    assert [(r.row_id, r.prompt) for r in packed] == [(r.row_id, r.prompt) for r in plain]


def test_a_prompts_line_that_is_not_an_object_names_file_line_and_fix(tmp_path) -> None:
    (tmp_path / "p.jsonl").write_text(json.dumps(PROMPTS[0]) + "\n[1, 2]\n")
    with pytest.raises(
        ValueError, match=r"^grpo: .*p\.jsonl:2 is an array, not a JSON object .*one JSON object per line"
    ):
        read_prompts(str(tmp_path / "p.jsonl"))


def test_sweep_results_name_a_bad_line(tmp_path) -> None:
    run = ScalingRun(budget=1e15, params=1e6, tokens=2e7, loss=3.0)
    (tmp_path / "runs.jsonl").write_text(json.dumps(run.to_dict()) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"^sweep results: .*runs\.jsonl:2 is not valid JSON"):
        read_runs(str(tmp_path))
    (tmp_path / "runs.jsonl").write_text(json.dumps(run.to_dict()) + "\n\n")
    assert read_runs(str(tmp_path)) == [run]


def test_an_empty_prompts_file_is_refused_and_a_zero_byte_gz_is_cut_short(tmp_path) -> None:
    """GRPO needs prompts: an empty file (plain, or a valid empty gzip stream) is an error with the fix; a
    0-byte `.gz` is a cut copy, named as one (it was read as an empty file)."""
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "empty.jsonl.gz").write_bytes(gzip.compress(b""))
    for name in ("empty.jsonl", "empty.jsonl.gz"):
        with pytest.raises(
            ValueError, match=rf"^grpo: .*{name} holds no rows: give one JSON object per line"
        ):
            read_prompts(str(tmp_path / name))
    (tmp_path / "zero.jsonl.gz").write_bytes(b"")
    with pytest.raises(ValueError, match=r"^grpo: .*zero\.jsonl\.gz: the gzip data is truncated .*re-create"):
        read_prompts(str(tmp_path / "zero.jsonl.gz"))


def test_sweep_results_without_runs_are_refused_naming_the_file(tmp_path) -> None:
    """A fit needs runs: an empty runs.jsonl gave `[]`, and the fit step then failed on an IndexError."""
    from schooner.train.scaling._sweep import read_run_data

    (tmp_path / "runs.jsonl").write_text("\n")
    for read in (read_runs, read_run_data):
        with pytest.raises(ValueError) as info:
            read(str(tmp_path))
        message = str(info.value)
        assert message.startswith(f"sweep results: {tmp_path}/runs.jsonl holds no runs"), message
        assert "isoflop_sweep" in message, message


def test_a_sweep_results_row_missing_fields_names_file_line_and_the_fields(tmp_path) -> None:
    """A row without `loss` (a hand-edited or foreign runs.jsonl) raised a bare TypeError from ScalingRun."""
    run = ScalingRun(budget=1e15, params=1e6, tokens=2e7, loss=3.0, name="r1")
    short = {k: v for k, v in run.to_dict().items() if k not in ("loss", "tokens")}
    (tmp_path / "runs.jsonl").write_text(json.dumps(run.to_dict()) + "\n" + json.dumps(short) + "\n")
    with pytest.raises(ValueError) as info:
        read_runs(str(tmp_path))
    message = str(info.value)
    assert message.startswith(f"sweep results: {tmp_path}/runs.jsonl:2 (run 'r1') lacks tokens, loss"), (
        message
    )
    assert "isoflop_sweep" in message, message
    bad = run.to_dict() | {"loss": -1.0}
    (tmp_path / "runs.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"^sweep results: .*runs\.jsonl:1: ScalingRun\.loss must be"):
        read_runs(str(tmp_path))


def test_a_sweep_results_row_with_none_of_a_run_s_fields_names_the_fields_it_has(tmp_path) -> None:
    """A row of another file (no run field at all) listed the required fields twice ("lacks budget, ...: a run row
    holds budget, ..."): it says what the row holds instead."""
    (tmp_path / "runs.jsonl").write_text(json.dumps({"name": "x", "flops": 1e12}) + "\n")
    with pytest.raises(ValueError) as info:
        read_runs(str(tmp_path))
    assert "(its fields are name, flops)" in str(info.value), str(info.value)
