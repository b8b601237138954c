"""A small isoFLOP sweep end to end as steps: train, collect, fit, forecast before the run, train, score."""

from __future__ import annotations

import json
import os

import pytest

from schooner.cluster import StepRunner, step
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
from schooner.train.steps import train_lm

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
        json.dump({"average": {"loss": last["eval/loss"] + 1.0, "bpb": 2.5}}, f)
    return {}


def test_sweep_fit_forecast_and_score(data_dir, tmp_path) -> None:
    data = {data_dir: 1.0}
    evaluate = lambda name, run: step(name, _fake_evaluation, {"run": run}, version="fake-v1")  # noqa: E731
    sweep = isoflop_sweep(
        "scaling/test", budgets=BUDGETS, sizes_per_budget=3, data=data, recipe=RULES, resources=None,
        evaluate=evaluate,
    )  # fmt: skip
    fit = fit_scaling_law("scaling/test-fit", sweep, samples=4, approach3=Approach3Config(top_k=16))
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


def test_sweep_runs_are_named_by_budget_and_width_and_share_their_data(data_dir) -> None:
    runs = isoflop_runs("scaling/x", budgets=BUDGETS, sizes_per_budget=3, data={data_dir: 1.0}, recipe=RULES)
    assert len(runs) == 6 and len({r.train.key for r in runs}) == 6
    assert runs[0].train.name == f"scaling/x/1.00e+09-w{runs[0].recipe.width}"
    assert all(r.train.config.datasets == [{"input": data_dir, "weight": 1.0}] for r in runs)
    with pytest.raises(ValueError, match="method"):
        forecast("f", "fit", budget=1e12, method="approach1")
