"""`explain`'s field-by-field diff of canonical configs (the CLI tests cover it end to end)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schooner.cluster import step
from schooner.cluster.runner._version import canonicalize
from schooner.cluster.views._explain import diff_configs


@dataclass(frozen=True)
class Train:
    datasets: Any
    lr: float
    layers: tuple = (1, 2)


@dataclass(frozen=True)
class Other:
    datasets: Any
    lr: float
    layers: tuple = (1, 2)


def fn(config: Any, out: str) -> None:
    return None


def test_handle_keyed_dicts_line_up_by_step_name_when_keys_change() -> None:
    docs_v1, docs_v2 = step("tok/docs", fn, {"v": 1}), step("tok/docs", fn, {"v": 2})
    code = step("tok/code", fn, {"v": 1})
    old = canonicalize(Train({docs_v1: 1.0, code: 0.5}, 1e-3))
    new = canonicalize(Train({docs_v2: 1.0, code: 0.25}, 1e-3, (1, 2, 3)))
    names = {h.key: h.name for h in (docs_v1, docs_v2, code)}
    changes = {c.path: c.describe() for c in diff_configs(old, new, names=names)}
    assert changes == {
        "config.datasets[<step 'tok/code'>]": "config.datasets[<step 'tok/code'>]: 0.5 -> 0.25",
        "config.datasets[<step 'tok/docs'>]<key>": (
            f"config.datasets[<step 'tok/docs'>]<key>: "
            f'{{"__step__": "{docs_v1.key}"}} -> {{"__step__": "{docs_v2.key}"}}'
        ),
        "config.layers[2]": "config.layers[2]: added (3)",
    }


def test_identical_configs_have_no_changes_and_class_changes_show() -> None:
    a = canonicalize(Train({}, 1e-3))
    assert diff_configs(a, canonicalize(Train({}, 1e-3))) == []

    (change,) = diff_configs(a, canonicalize(Other({}, 1e-3)))
    assert change.path == "config.__class__" and change.describe() == 'config.__class__: "Train" -> "Other"'


def test_a_long_changed_string_shows_where_it_differs_and_text_as_written() -> None:
    # A 150-character prompt edited near its end was shown as two identical 97-character heads
    # ('"You are ..." -> "You are ..."'): explain said it changed but not how. Non-ASCII showed as \u2713.
    head = "You are a careful grader. " * 5
    old = {"prompt": head + "Answer with yes or no.", "mark": "✓ café"}
    new = {"prompt": head + "Answer with YES or NO.", "mark": "✗ café"}
    changes = {c.path: c.describe() for c in diff_configs(canonicalize(old), canonicalize(new))}
    prompt = changes["config.prompt"]
    before, after = prompt.split(" -> ")
    assert "yes or no" in before and "YES or NO" in after
    assert len(prompt) < 300
    assert changes["config.mark"] == 'config.mark: "✓ café" -> "✗ café"'


def test_input_files_are_diffed_by_name(tmp_path) -> None:
    # Files compared by list index: removing a.jsonl showed 'a.jsonl' -> 'b.jsonl' and 'b.jsonl' -> 'c.jsonl'
    # (read as renames and edits of files that did not change) and one removal at the end.
    from schooner.cluster import InputFiles

    for name, text in (("a.jsonl", "1\n"), ("b.jsonl", "2\n"), ("c.jsonl", "3\n")):
        (tmp_path / name).write_text(text)
    old = canonicalize({"files": InputFiles(str(tmp_path))})
    (tmp_path / "a.jsonl").unlink()
    (tmp_path / "b.jsonl").write_text("22\n")
    (tmp_path / "d.jsonl").write_text("4\n")
    new = canonicalize({"files": InputFiles(str(tmp_path))})
    lines = [c.describe() for c in diff_configs(old, new)]
    assert len(lines) == 3, lines
    assert lines[0].startswith("config.files: a.jsonl: removed")
    assert lines[1].startswith("config.files: b.jsonl: ") and "2 bytes" in lines[1] and "3 bytes" in lines[1]
    assert lines[2].startswith("config.files: d.jsonl: added")
    assert not any("c.jsonl" in line for line in lines)


def _maybe_fail(config: dict, output_path: str) -> dict:
    if config["n"] == 2:
        raise ValueError("told to fail")
    return {"n": config["n"]}


def test_explain_without_the_experiment_reads_the_versions_in_the_order_they_ran(tmp_path) -> None:
    # n=1 succeeded, then n=2 ran and failed. explain (no experiment file) put SUCCESS first, called it
    # "latest recorded version" and showed 'config.n: 2 -> 1': the change backwards, the newest run hidden.
    from schooner.cluster import StepRunner
    from schooner.cluster.views._explain import explain_records

    runner = StepRunner(prefix=str(tmp_path), quiet=True)
    first = step("abl/x", _maybe_fail, {"n": 1})
    second = step("abl/x", _maybe_fail, {"n": 2})
    assert runner.run([first]).ok
    assert not runner.run([second], raise_on_failure=False).ok
    expl = explain_records(str(tmp_path), "abl/x")
    assert expl is not None
    assert expl.key == second.key and expl.verdict == "FAILED"
    assert [c.describe() for c in expl.changes] == ["config.n: 1 -> 2"]
    assert expl.compared_with == runner.output_path(first)
    # A run killed with kill -9 leaves its status RUNNING with no live lease: INTERRUPTED, as `status` says.
    import json as _json
    import os as _os

    status = _os.path.join(runner.output_path(second), ".schooner", "status.json")
    with open(status) as f:
        data = _json.load(f)
    data["status"] = "RUNNING"
    with open(status, "w") as f:
        _json.dump(data, f)
    assert not _os.path.exists(_os.path.join(runner.output_path(second), ".schooner", "lease.json"))
    expl = explain_records(str(tmp_path), "abl/x")
    assert expl is not None and expl.verdict == "INTERRUPTED"


def test_explain_without_the_experiment_names_a_changed_input_by_its_step(tmp_path) -> None:
    # A changed input read `config.src: {"__step__": "04cc6574d038..."} -> {...}` (its raw key); with the
    # experiment file the same change reads `<step 'abl/src' 1a2b3c4d>`.
    from schooner.cluster import StepRunner
    from schooner.cluster.views._explain import explain_records

    runner = StepRunner(prefix=str(tmp_path), quiet=True)
    src1, src2 = step("abl/src", fn, {"n": 1}), step("abl/src", fn, {"n": 2})
    assert runner.run([step("abl/use", fn, {"src": src1})]).ok
    assert runner.run([step("abl/use", fn, {"src": src2})]).ok
    expl = explain_records(str(tmp_path), "abl/use")
    assert expl is not None
    assert [c.describe() for c in expl.changes] == [
        f"config.src: <step 'abl/src' {src1.key[:8]}> -> <step 'abl/src' {src2.key[:8]}>"
    ]
