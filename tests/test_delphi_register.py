"""experiments/scaling/delphi_register.py gathers a Delphi suite's registration and scores from the step folders a
suite writes (their layout written out here), refuses to rewrite a file or to guess between two suites' steps,
and computes the seed spread as numpy does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.scaling import delphi_register


def _step(folder: Path, files: dict[str, object], state: str = "SUCCESS") -> None:
    (folder / ".schooner").mkdir(parents=True)
    (folder / ".schooner" / "step.json").write_text(json.dumps({"state": state}))
    for name, value in files.items():
        text = value if isinstance(value, str) else json.dumps(value)
        (folder / name).write_text(text)


def _suite(prefix: Path) -> None:
    s = prefix / "scaling"
    runs = [
        {"budget": b, "name": f"scaling/delphi/{b:.2e}-w{w}", "loss": 4.123456789}
        for b in (1e11, 3e11)
        for w in (8, 16)
    ]
    _step(
        s / "delphi-fit-0123abcd",
        {"fit.json": {"runs": runs, "delphi": {"law": {"E": 0.0}}, "approach2": {}}},
    )
    _step(s / "delphi-forecast-30x-11112222", {"forecast.json": {"loss": 2.3, "replicates": [2.2, 2.4]}})
    _step(s / "delphi-forecast-10x-33334444", {"forecast.json": {"loss": 2.5, "replicates": [2.4, 2.6]}})
    _step(s / "delphi-downstream-55556666", {"downstream.json": {"metrics": {}}})
    _step(s / "delphi-77778888", {"runs.jsonl": "".join(json.dumps(r) + "\n" for r in runs)})


def test_forecasts_gathers_the_fit_each_forecast_in_order_and_the_sweep_losses(tmp_path: Path) -> None:
    _suite(tmp_path)
    out = tmp_path / "reg.json"
    delphi_register.main(["forecasts", str(tmp_path), str(out), "--device", "a CPU"])
    record = json.loads(out.read_text())
    assert list(record["forecasts"]) == ["10x", "30x"]  # by multiple, not by name
    assert record["forecasts"]["10x"] == {"loss": 2.5, "replicates": [2.4, 2.6]}
    assert record["fit"] == {"delphi": {"law": {"E": 0.0}}} and record["budgets"] == [1e11, 3e11]
    assert record["sweep_final_validation_loss"]["1.00e+11-w8"] == 4.12346
    assert record["device"] == "a CPU" and record["code"].startswith("main at ")
    with pytest.raises(SystemExit, match="never rewritten"):
        delphi_register.main(["forecasts", str(tmp_path), str(out), "--device", "a CPU"])


def test_forecasts_refuses_two_suites_an_unfinished_step_and_no_device(tmp_path: Path) -> None:
    _suite(tmp_path)
    with pytest.raises(SystemExit, match="--device"):
        delphi_register.main(["forecasts", str(tmp_path), str(tmp_path / "a.json")])
    _step(tmp_path / "scaling" / "delphi-fit-9999aaaa", {"fit.json": {}})
    with pytest.raises(SystemExit, match="more than one suite"):
        delphi_register.main(["forecasts", str(tmp_path), str(tmp_path / "b.json"), "--device", "x"])
    other = tmp_path / "other"
    _suite(other)
    (other / "scaling" / "delphi-downstream-55556666" / ".schooner" / "step.json").write_text(
        '{"state": "FAILED"}'
    )
    with pytest.raises(SystemExit, match="FAILED, not SUCCESS"):
        delphi_register.main(["forecasts", str(other), str(tmp_path / "c.json"), "--device", "x"])
    assert not list(tmp_path.glob("*.json"))  # nothing written by a refusal


def test_scores_gives_each_seed_and_the_spread_as_numpy_computes_it(tmp_path: Path) -> None:
    actual = [2.7970, 2.7973, 2.8033]
    for seed, a in enumerate(actual):
        score = {"budget": 3e13, "predicted": 2.8230, "actual": a}
        _step(
            tmp_path / "scaling" / f"delphi-forecast-10x-score-s{seed}-abcd{seed}000", {"score.json": score}
        )
    out = tmp_path / "scores.json"
    delphi_register.main(["scores", str(tmp_path), str(out), "--registration", "reg.json"])
    record = json.loads(out.read_text())
    assert [r["seed"] for r in record["scores"]] == [0, 1, 2]
    assert record["scores"][0]["step"] == "delphi-forecast-10x-score-s0"
    spread = record["seed_spread"]["3e+13"]
    mean = np.mean(actual)
    assert spread["seeds"] == 3 and spread["range"] == [min(actual), max(actual)]
    assert spread["std_pct"] == pytest.approx(100 * np.std(actual, ddof=1) / mean)
    assert spread["mean_error_pct"] == pytest.approx(100 * (2.8230 - mean) / mean)
    assert record["registration"] == "reg.json" and record["downstream"] is None


def test_scores_of_one_multiple_take_the_newest_downstream_row_of_each_run(tmp_path: Path) -> None:
    """A suite that trained its 10x runs in one call and its 30x in a later one has a downstream-score step of
    each call; the 10x scores take each 10x run's newest row, and nothing of 30x."""
    import os
    import time

    for k, budget in ((10, 3e13), (30, 9e13)):
        for seed in (0, 1):
            score = {"budget": budget, "predicted": 2.8, "actual": 2.79 + seed / 100}
            _step(
                tmp_path / "scaling" / f"delphi-forecast-{k}x-score-s{seed}-{k:04d}{seed:04d}",
                {"score.json": score},
            )
    first = [{"budget": 3e13, "seed": s, "bpb": 1.0} for s in (0, 1)]
    later = [
        *({"budget": 3e13, "seed": s, "bpb": 2.0} for s in (0, 1)),
        {"budget": 9e13, "seed": 0, "bpb": 3.0},
    ]
    _step(tmp_path / "scaling" / "delphi-downstream-score-bbbbbbbb", {"score.json": first})
    _step(tmp_path / "scaling" / "delphi-downstream-score-aaaaaaaa", {"score.json": later})
    now = time.time()  # the later call's step is newer, though its name sorts first
    os.utime(tmp_path / "scaling" / "delphi-downstream-score-bbbbbbbb" / "score.json", (now - 60, now - 60))
    out = tmp_path / "s10.json"
    delphi_register.main(["scores", str(tmp_path), str(out), "--registration", "r.json", "--multiple", "10"])
    record = json.loads(out.read_text())
    assert {r["budget"] for r in record["scores"]} == {3e13} and len(record["scores"]) == 2
    assert list(record["seed_spread"]) == ["3e+13"]
    assert record["downstream"] == [
        {"budget": 3e13, "seed": 0, "bpb": 2.0},
        {"budget": 3e13, "seed": 1, "bpb": 2.0},
    ]


def test_a_forecast_or_score_step_found_twice_is_refused_not_one_kept(tmp_path: Path) -> None:
    # two keys of one step name (a suite rerun with other settings under the same prefix): one was dropped
    # silently (forecasts) or both seeds counted in the spread (scores)
    _suite(tmp_path)
    _step(tmp_path / "scaling" / "delphi-forecast-10x-9999aaaa", {"forecast.json": {"loss": 9.9}})
    with pytest.raises(SystemExit, match=r"delphi-forecast-10x.*more than one suite"):
        delphi_register.main(["forecasts", str(tmp_path), str(tmp_path / "a.json"), "--device", "x"])
    for key in ("abcd0000", "abcd1111"):
        score = {"budget": 3e13, "predicted": 2.8, "actual": 2.79}
        _step(tmp_path / "scaling" / f"delphi-forecast-10x-score-s0-{key}", {"score.json": score})
    with pytest.raises(SystemExit, match=r"delphi-forecast-10x-score-s0.*more than one suite"):
        delphi_register.main(["scores", str(tmp_path), str(tmp_path / "b.json"), "--registration", "r.json"])
    assert not list(tmp_path.glob("*.json"))


def test_a_nan_loss_is_refused_by_file_and_leaves_no_file_behind(tmp_path: Path) -> None:
    _suite(tmp_path)
    runs = tmp_path / "scaling" / "delphi-77778888" / "runs.jsonl"
    runs.write_text('{"budget": 1e11, "name": "scaling/delphi/a", "loss": NaN}\n')
    with pytest.raises((SystemExit, ValueError), match=r"runs\.jsonl:1.*NaN"):
        delphi_register.main(["forecasts", str(tmp_path), str(tmp_path / "a.json"), "--device", "x"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scaling"]  # no OUT, no OUT.tmp-*


def test_a_prefix_that_is_not_a_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"no folder at .*nope.*SCHOONER_PREFIX"):
        delphi_register.main(["forecasts", str(tmp_path / "nope"), str(tmp_path / "a.json"), "--device", "x"])


def test_help_explains_the_subcommands_and_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        delphi_register.main(["--help"])
    said = capsys.readouterr().out
    assert "SCHOONER_DELPHI_PHASE=forecast" in said and "never rewritten" in said, said
    assert "SCHOONER_PREFIX" in said and "OUT" in said, said


def test_the_commit_is_the_scripts_checkout_whatever_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # run from outside the checkout (cd to the prefix), `git rev-parse` failed with a traceback
    _suite(tmp_path)
    monkeypatch.chdir(tmp_path)
    delphi_register.main(["forecasts", str(tmp_path), "reg.json", "--device", "a CPU"])
    assert json.loads((tmp_path / "reg.json").read_text())["code"].startswith("main at ")
