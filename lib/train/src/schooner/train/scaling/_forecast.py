"""Registered forecasts: a step that writes its prediction before the target run exists, and a step that
scores it once the run has finished.

A forecast names its target run exactly (the recipe's model, batch, steps, tokens and FLOPs at the target
budget, sized compute-optimally by approach 2's N*(C) unless a width is given), predicts its final validation
loss with one method, and gives an interval: the bootstrap replicates' predictions, each perturbed by a
residual drawn from the fit (so the interval covers the fit's uncertainty and the scatter of single runs
around the law). `forecast.json` records when it was written and the fit's inputs, and the fit's backtest for
the method: its error predicting the largest fitted budget from the smaller ones, and that error scaled to the
forecast's reach (times log(target / largest) / log(largest / next largest): a misfit growing linearly in log
compute), which the bootstrap interval does not cover.

`score_forecast` reads the run's final loss, the error in percent and whether it fell inside the interval,
and checks the registration: that the forecast was written before the run's first step.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schooner.cluster import StepHandle, step

from ._approach2 import PowerLaw
from ._bootstrap import percentile_interval
from ._fit import LAW_METHODS, fitted_law, read_fit
from ._law import ScalingLaw, ScalingRun
from ._recipe import Recipe, ScalingRecipe

__all__ = ["ForecastConfig", "ScoreConfig", "forecast", "predict", "score", "score_forecast"]

METHODS = (*LAW_METHODS, "frontier")
FORECAST_VERSION = "scaling-forecast-v1"
SCORE_VERSION = "scaling-score-v1"


def target_run(
    fit: Mapping[str, Any], budget: float, recipe: ScalingRecipe, width: int | None = None
) -> Recipe:
    """The run a forecast is about: the recipe's run at `budget` of `width`, else of the family member closest
    to approach 2's compute-optimal N*(budget), else (approach 2 failed) of the member whose loss the variable
    projection law (approach 3's if that failed) predicts lowest."""
    if width is not None:
        return recipe.run(budget, width)
    if "error" not in fit["approach2"]:
        n_opt = PowerLaw(**fit["approach2"]["params_law"])(budget)
        return recipe(budget, params=float(n_opt))
    method = next((m for m in ("varpro", "approach3") if "error" not in fit[m]), "varpro")
    law = fitted_law(fit, method)  # raises, naming the errors, when every fit failed
    return min(recipe.candidates(budget), key=lambda r: float(law.loss(r.params, r.tokens)))


def predict(
    fit: Mapping[str, Any],
    method: str,
    params: float,
    tokens: float,
    flops: float,
    *,
    level: float = 0.9,
    seed: int = 0,
) -> dict[str, Any]:
    """The predicted final loss of a run of `params` and `tokens` (`flops` for the frontier) with `method`,
    and its `level` interval from the bootstrap replicates plus resampled residuals."""
    rng = np.random.default_rng(seed)
    if method in LAW_METHODS:
        point = float(fitted_law(fit, method).loss(params, tokens))
        reps = np.array([float(ScalingLaw(**r).loss(params, tokens)) for r in fit[method]["replicates"]])
        residuals = np.asarray(fit[method]["log_residuals"])
    elif method == "frontier":
        a2 = fit["approach2"]
        if "error" in a2:
            raise ValueError(f"the frontier forecast needs approach 2, which failed: {a2['error']}")
        point = float(PowerLaw(**a2["loss_law"])(flops))
        reps = np.array([float(PowerLaw(**r["loss_law"])(flops)) for r in a2["replicates"]])
        residuals = np.asarray(a2["loss_law_log_residuals"])
    else:
        raise ValueError(f"forecast method must be one of {METHODS}; got {method!r}")
    noisy = reps * np.exp(rng.choice(residuals, size=reps.size)) if reps.size else np.array([point])
    return {
        "method": method,
        "loss": point,
        "interval": percentile_interval(noisy, level).to_dict(),
        "replicates": int(reps.size),
    }


@dataclass(frozen=True)
class ForecastConfig:
    """Config of the `forecast` step."""

    fit: Any
    """The fit step (a path when the step runs)."""
    budget: float
    """The target compute budget (FLOPs)."""
    recipe: ScalingRecipe = field(default_factory=ScalingRecipe)
    """The rules that turn the budget into the target run."""
    method: str = "varpro"
    """"varpro", "approach3" (the law at the target's N and D) or "frontier" (approach 2's L*(C))."""
    level: float = 0.9
    width: int | None = None
    """Fix the target's width instead of sizing it by approach 2's N*(C)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"ForecastConfig.method must be one of {METHODS}; got {self.method!r}")
        if not (math.isfinite(self.budget) and self.budget > 0) or not 0 < self.level < 1:
            raise ValueError(
                f"ForecastConfig needs budget > 0 and 0 < level < 1; got {self.budget=}, {self.level=}"
            )


def forecast(
    name: str,
    fit: StepHandle | str,
    *,
    budget: float,
    recipe: ScalingRecipe | None = None,
    method: str = "varpro",
    level: float = 0.9,
    width: int | None = None,
    seed: int = 0,
) -> StepHandle:
    """A step registering a forecast of the final loss of the recipe's compute-optimal run at `budget`.

    Its folder holds `forecast.json` (the prediction, interval, method, target run, the fit's inputs and
    when it was written) and `forecast.png`; its result names the target so the run can be declared from it:
    `train_lm(name, **recipe.run(budget, result["target"]["width"]), ...)`.
    """
    config = ForecastConfig(
        fit=fit, budget=float(budget), recipe=recipe or ScalingRecipe(), method=method, level=level,
        width=width, seed=seed,
    )  # fmt: skip
    return step(
        name,
        _run_forecast,
        config,
        version=FORECAST_VERSION,
        description=f"{method} forecast at C={budget:.3g}",
    )


def _run_forecast(config: ForecastConfig, output_path: str) -> dict[str, Any]:
    from ._plots import plot_forecast

    fit = read_fit(str(config.fit))
    target = target_run(fit, config.budget, config.recipe, config.width)
    pred = predict(
        fit, config.method, target.params, target.tokens, target.flops, level=config.level, seed=config.seed
    )
    largest = max(r["budget"] for r in fit["runs"])
    bt = fit.get("backtest", {})
    bt_method = bt.get("methods", {}).get(config.method, {})
    backtest = (
        {
            **bt_method,
            "held_out_budget": bt["held_out_budget"],
            "extrapolation": bt["extrapolation"],
            "scaled_error_pct": bt_method["error_pct"]
            * math.log(config.budget / largest)
            / math.log(bt["extrapolation"]),
        }
        if "error_pct" in bt_method
        else {"error": bt_method.get("error") or bt.get("error", "the fit has no backtest")}
    )
    record = {
        **pred,
        "created_unix": time.time(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "budget": config.budget,
        "extrapolation": config.budget / largest,
        "target": target.summary(),
        "backtest": backtest,
        "fit": {
            "path": str(config.fit),
            "law": fit[config.method]["law"]
            if config.method in LAW_METHODS
            else fit["approach2"]["loss_law"],
            "runs": fit["runs"],
            "samples": fit["samples"],
        },
    }
    os.makedirs(output_path, exist_ok=True)
    with open(f"{output_path}/forecast.json", "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
    plot_forecast([ScalingRun.from_dict(r) for r in fit["runs"]], record, f"{output_path}/forecast.png")
    return {
        "method": config.method,
        "loss": round(pred["loss"], 5),
        "interval": [round(pred["interval"]["low"], 5), round(pred["interval"]["high"], 5)],
        "level": config.level,
        "budget": config.budget,
        "extrapolation": round(record["extrapolation"], 2),
        "created_at": record["created_at"],
        "backtest_error_pct": round(backtest["error_pct"], 3) if "error_pct" in backtest else None,
        "backtest_scaled_error_pct": round(backtest["scaled_error_pct"], 3)
        if "error_pct" in backtest
        else None,
        "target": {
            k: target.summary()[k]
            for k in ("width", "layers", "params", "tokens", "flops", "batch_size", "steps")
        },
    }


def score(prediction: Mapping[str, Any], actual: float) -> dict[str, Any]:
    """How a forecast (`forecast.json`'s content) fared against the actual final loss."""
    iv = prediction["interval"]
    return {
        "method": prediction["method"],
        "predicted": float(prediction["loss"]),
        "actual": float(actual),
        "error_pct": 100.0 * (float(prediction["loss"]) - float(actual)) / float(actual),
        "interval": [float(iv["low"]), float(iv["high"])],
        "level": float(iv["level"]),
        "inside_interval": bool(iv["low"] <= actual <= iv["high"]),
    }


@dataclass(frozen=True)
class ScoreConfig:
    """Config of the `score_forecast` step."""

    forecast: Any
    """The forecast step (a path when the step runs)."""
    run: Any
    """The target's `train_lm` step."""
    evaluation: Any = None
    """An evaluation step of the run whose `results.json` gives the loss (None: the run's own final eval)."""
    metric: str = "eval/loss"


def score_forecast(
    name: str,
    forecast: StepHandle | str,
    *,
    run: StepHandle | str,
    evaluation: StepHandle | str | None = None,
) -> StepHandle:
    """A step scoring a registered forecast against the finished run (`score.json`, `forecast.png`)."""
    config = ScoreConfig(forecast=forecast, run=run, evaluation=evaluation)
    return step(name, _run_score, config, version=SCORE_VERSION, description="score a registered forecast")


def _first_step_time(train_path: str) -> float | None:
    import fsspec

    with fsspec.open(f"{train_path}/metrics.jsonl", "r") as f:
        for line in f:
            t = json.loads(line).get("time")
            if t is not None:
                return float(t)
    return None


def _run_score(config: ScoreConfig, output_path: str) -> dict[str, Any]:
    from ._plots import plot_forecast
    from ._sweep import run_counts, run_loss

    with open(f"{config.forecast}/forecast.json") as f:
        prediction = json.load(f)
    actual = run_loss(str(config.run), config.evaluation and str(config.evaluation), config.metric)
    counts = run_counts(str(config.run))
    started = _first_step_time(str(config.run))
    target = prediction["target"]
    result = {
        **score(prediction, actual["loss"]),
        "budget": prediction["budget"],
        "extrapolation": prediction["extrapolation"],
        "forecast_written": prediction["created_at"],
        "registered_before_run": started is not None and prediction["created_unix"] < started,
        "matches_target": counts["params"] == target["params"] and counts["tokens"] == target["tokens"],
        "actual_bpb": actual.get("bpb"),
        "backtest_error_pct": prediction.get("backtest", {}).get("error_pct"),
        "backtest_scaled_error_pct": prediction.get("backtest", {}).get("scaled_error_pct"),
    }
    os.makedirs(output_path, exist_ok=True)
    with open(f"{output_path}/score.json", "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    runs = [ScalingRun.from_dict(r) for r in prediction["fit"]["runs"]]
    plot_forecast(runs, prediction, f"{output_path}/forecast.png", actual=actual["loss"])
    return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in result.items()}
