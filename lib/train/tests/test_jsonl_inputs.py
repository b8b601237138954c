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
