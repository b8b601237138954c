"""A small isoFLOP sweep end to end as steps: train, collect, fit, forecast before the run, train, score."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from schooner.cluster import StepRunner, records, step
from schooner.train.scaling import (
    Approach3Config,
    BatchRule,
    ModelFamily,
    ScalingRecipe,
    fit_scaling_law,
    forecast,
    isoflop_runs,
    isoflop_sweep,
    read_runs,
    score,
    score_forecast,
)
from schooner.train.scaling._forecast import ForecastConfig, ScoreConfig, _run_forecast, _run_score
from schooner.train.steps import train_lm

# RL tasks, rewards and evaluate_lm come from schooner-eval, a test-time extra of this package (the exact guard
# runs train's tests without it): skip cleanly there.
pytest.importorskip("schooner.eval")

RULES = ScalingRecipe(
    family=ModelFamily(
        vocab_size=320, min_width=16, max_width=64, width_per_layer=64
    ),  # one layer: fewer, faster compiles
    batch=BatchRule(base_sequences=8, minimum=8, maximum=8),
    seq_len=32,
    min_steps=20,
)
BUDGETS = (1e9, 2e9)


def _fake_evaluation(config: dict, output_path: str) -> dict:
    """Stands in for schooner.eval's evaluate step (schooner-train does not depend on schooner-eval): the run's final loss plus one, in its results.json."""
    with open(f"{config['run']}/metrics.jsonl") as f:
        last = [json.loads(line) for line in f if "eval/loss" in line][-1]
    os.makedirs(output_path, exist_ok=True)
    with open(f"{output_path}/results.json", "w") as f:
        checkpoint = max(d for d in os.listdir(config["run"]) if d.startswith("step-"))
        average = {"loss": last["eval/loss"] + 1.0, "bpb": 2.5}
        json.dump({"average": average, "checkpoint": f"{config['run']}/{checkpoint}"}, f)
    return {}


def test_sweep_fit_forecast_and_score(data_dir, tmp_path) -> None:
    data = {data_dir: 1.0}
    evaluate = lambda name, run: step(name, _fake_evaluation, {"run": run}, version="fake-v1")  # noqa: E731
    sweep = isoflop_sweep(
        "scaling/test", budgets=BUDGETS, sizes_per_budget=3, data=data, recipe=RULES, resources=None,
        evaluate=evaluate,
    )  # fmt: skip
    # 24 resamplings: a forecast gives no interval from fewer than 20 successful refits (MIN_REPLICATES).
    # Approach 3 from its one best start (each replicate restarts L-BFGS from the full fit's best ones): the
    # forecast uses variable projection, and approach 3's accuracy is test_scaling_fits.py's concern.
    coarse = {"alpha": (0.2, 0.6), "beta": (0.2, 0.6), "e": (0.0, 1.0), "a": (2.0, 8.0), "b": (2.0, 8.0)}
    fit = fit_scaling_law("scaling/test-fit", sweep, samples=24, approach3=Approach3Config(**coarse, top_k=1))
    guess = forecast("scaling/test-forecast", fit, budget=4e9, recipe=RULES, width=16)
    runner = StepRunner(prefix=str(tmp_path))
    first = runner.run([guess], max_concurrent=1)  # in-process training runs, one at a time

    runs = read_runs(first[sweep].output_path)
    assert len(runs) == 6 and sorted({r.budget for r in runs}) == list(BUDGETS)
    for r in runs:
        assert abs(r.flops - r.budget) / r.budget < 0.1
        # The evaluation step's results.json supplies the loss (the fake adds one to the run's own).
        train_dir = next(o.output_path for o in first.steps if o.name == r.name)
        with open(f"{train_dir}/metrics.jsonl") as f:
            final = [json.loads(line) for line in f if "eval/loss" in line][-1]["eval/loss"]
        assert r.loss == pytest.approx(final + 1.0) and r.bpb == 2.5
    fit_dir = first[fit].output_path
    assert {"fit.json", "isoflops.png", "fit_vs_observed.png", "residuals.png"} <= set(os.listdir(fit_dir))
    with open(f"{first[guess].output_path}/forecast.json") as f:
        registered = json.load(f)
    assert registered["method"] == "varpro" and registered["extrapolation"] == pytest.approx(2.0)
    assert len(registered["fit"]["runs"]) == 6 and registered["target"]["width"] == 16
    # The data the fitted runs trained and were evaluated on, by content (read here from the caches' own files)
    from schooner.tokenize import load_tokenizer

    manifests = {
        s: json.loads(Path(f"{data_dir}/{s}/manifest.json").read_text()) for s in ("train", "validation")
    }
    assert registered["data"] == {
        "tokenizer": load_tokenizer(f"{data_dir}/tokenizer.json").fingerprint,
        "train": {manifests["train"]["content_sha256"]: 1.0},
        "validation": {os.path.basename(data_dir): manifests["validation"]["content_sha256"]},
    }

    # Only now does the target run exist, declared from the forecast's target.
    run = train_lm("scaling/test-target", **RULES.run(4e9, 16), datasets=data, resources=None)
    scored = score_forecast("scaling/test-score", guess, run=run)
    second = runner.run([scored], max_concurrent=1)
    with open(f"{second[scored].output_path}/score.json") as f:
        result = json.load(f)  # unrounded (the step's result rounds to 5 digits)
    assert second[scored].result["inside_interval"] == result["inside_interval"]
    assert result["registered_before_run"] is True and result["matches_target"] is True
    expected = score(registered, result["actual"])
    assert result["error_pct"] == pytest.approx(expected["error_pct"], abs=1e-4)
    assert result["inside_interval"] == (
        registered["interval"]["low"] <= result["actual"] <= registered["interval"]["high"]
    )
    assert {"score.json", "forecast.png"} <= set(os.listdir(second[scored].output_path))
    assert result["mismatches"] == [] and result["run_started_from"] == "step history"
    assert result["same_data"] is True and result["data_mismatches"] == []
    assert second[scored].result["tables"][0]["title"] == "Forecast and outcome"

    # What a score must refuse or flag, on copies of the real run's folder (found by a review):
    target_dir, forecast_dir = second[run].output_path, first[guess].output_path
    _refusals_and_flags(target_dir, forecast_dir, registered, tmp_path, data_dir)
    # A recipe that did not make the fitted runs (the default one: another vocabulary and seq_len) is refused.
    with pytest.raises(ValueError, match="does not make the fitted run scaling/test/1.00e"):
        _run_forecast(ForecastConfig(fit=fit_dir, budget=4e9), str(tmp_path / "wrong-recipe"))


def _copy_run(src: str, dst) -> str:
    shutil.copytree(src, dst)
    return str(dst)


def _refusals_and_flags(
    target_dir: str, forecast_dir: str, registered: dict, tmp_path, data_dir: str
) -> None:
    cfg = lambda run: ScoreConfig(forecast=forecast_dir, run=run)  # noqa: E731
    with open(f"{target_dir}/run.json") as f:
        last_step = json.load(f)["config"]["num_train_steps"]
    # 1. A run still training: its step record is not SUCCESS.
    running = _copy_run(target_dir, tmp_path / "running")
    with open(f"{running}/.schooner/status.json") as f:
        status = json.load(f)
    with open(f"{running}/.schooner/status.json", "w") as f:
        json.dump({**status, "status": "RUNNING"}, f)
    with pytest.raises(ValueError, match="the training step is RUNNING, not finished"):
        _run_score(cfg(running), str(tmp_path / "s1"))
    # 2. Its metrics stop before the last step (as when scored while training): refused, naming both steps.
    partial = _copy_run(target_dir, tmp_path / "partial")
    with open(f"{partial}/metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    # The rows up to half-way, with an evaluation there (as with eval_every=last_step // 2).
    final_eval = next(r for r in reversed(rows) if "eval/loss" in r)
    early = [r for r in rows if r["step"] < last_step // 2] + [{**final_eval, "step": last_step // 2}]
    with open(f"{partial}/metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in early)
    with pytest.raises(ValueError, match=f"not the run's last step {last_step}"):
        _run_score(cfg(partial), str(tmp_path / "s2"))
    # 3. A forecast written after the run started but before its first metrics row (during compilation) was
    # not registered before the run.
    started = min(attempt["started"] for attempt in records.read_history(target_dir))
    with open(f"{target_dir}/metrics.jsonl") as f:
        first_row = json.loads(f.readline())["time"]
    assert first_row > started
    late = _copy_run(forecast_dir, tmp_path / "late-forecast")
    with open(f"{late}/forecast.json", "w") as f:
        json.dump({**registered, "created_unix": (started + first_row) / 2}, f)
    late_score = _run_score(ScoreConfig(forecast=late, run=target_dir), str(tmp_path / "s3"))
    assert late_score["registered_before_run"] is False
    # 4. A run of the target's shape and tokens with another learning rate is not the target.
    other = _copy_run(target_dir, tmp_path / "other-lr")
    with open(f"{other}/run.json") as f:
        info = json.load(f)
    info["config"]["optimizer"]["learning_rate"] /= 20
    with open(f"{other}/run.json", "w") as f:
        json.dump(info, f)
    flagged = _run_score(cfg(other), str(tmp_path / "s4"))
    assert flagged["matches_target"] is False
    assert [m.split(":")[0] for m in flagged["mismatches"]] == ["optimizer.learning_rate"]
    # 5. The target's shape on other data (its own train/validation caches, same tokenizer): refused, naming
    # what differs; accepted with the override, flagged. A 3.5% "better" loss on other data proves nothing.
    other_data = _other_data(tmp_path / "other-data", data_dir)
    elsewhere = _copy_run(target_dir, tmp_path / "other-data-run")
    with open(f"{elsewhere}/run.json") as f:
        info = json.load(f)
    info["config"]["datasets"] = [[other_data, 1.0]]
    with open(f"{elsewhere}/run.json", "w") as f:
        json.dump(info, f)
    with pytest.raises(ValueError, match=r"training data: forecast .*; validation sets: forecast") as e:
        _run_score(cfg(elsewhere), str(tmp_path / "s5"))
    assert "tokenizer: forecast" not in str(e.value) and "accept_other_data=True" in str(e.value)
    accepted = _run_score(
        ScoreConfig(forecast=forecast_dir, run=elsewhere, accept_other_data=True), str(tmp_path / "s6")
    )
    assert accepted["same_data"] is False
    assert [m.split(":")[0] for m in accepted["data_mismatches"]] == ["training data", "validation sets"]
    # 6. Another tokenizer (its fingerprint in run.json), the same caches: refused, naming the tokenizer.
    retok = _copy_run(target_dir, tmp_path / "other-tokenizer")
    with open(f"{retok}/run.json") as f:
        info = json.load(f)
    info["tokenizer_fingerprint"] = "0" * 64
    with open(f"{retok}/run.json", "w") as f:
        json.dump(info, f)
    with pytest.raises(
        ValueError, match=r"fitted on, so its loss is not the predicted one: tokenizer: forecast"
    ):
        _run_score(cfg(retok), str(tmp_path / "s7"))


def _other_data(root, data_dir: str) -> str:
    """Token caches `root/train`, `root/validation` of other text, with the sweep's tokenizer."""
    from schooner.tokenize import load_tokenizer, write_cache

    from .conftest import stdlib_texts

    texts = [t[::-1] for t in stdlib_texts()]  # other data: the same characters, reversed
    tok = load_tokenizer(f"{data_dir}/tokenizer.json")
    docs = [tok.encode(t) for t in texts]
    write_cache(str(root / "train"), docs[8:], tok)
    write_cache(str(root / "validation"), docs[:8], tok)
    return str(root)


def test_sweep_runs_are_named_by_budget_and_width_and_share_their_data(data_dir) -> None:
    runs = isoflop_runs("scaling/x", budgets=BUDGETS, sizes_per_budget=3, data={data_dir: 1.0}, recipe=RULES)
    assert len(runs) == 6 and len({r.train.key for r in runs}) == 6
    assert runs[0].train.name == f"scaling/x/1.00e+09-w{runs[0].recipe.width}"
    assert all(r.train.config.datasets == ((data_dir, 1.0),) for r in runs)
    with pytest.raises(ValueError, match="method"):
        forecast("f", "fit", budget=1e12, method="approach1")
