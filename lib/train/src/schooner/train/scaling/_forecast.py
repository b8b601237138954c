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
and checks the registration: that the forecast was written before the run's first step. It also checks the
data: `forecast.json` records what the fitted runs trained and were evaluated on (`_sweep.run_data`: the
tokenizer's fingerprint, the training caches and the validation sets, by content), and a target run on other
data, another tokenizer or other evaluation sets is refused, naming what differs (`accept_other_data=True`
scores it anyway, flagged): its loss is not the one the law predicts.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schooner.cluster import StepHandle, records, step, storage

from ._approach2 import PowerLaw
from ._bootstrap import percentile_interval, replicates_shortfall
from ._delphi_precision import forecast_noise
from ._fit import FRONTIER_METHODS, LAW_METHODS, fitted_law, read_fit
from ._law import ScalingLaw, ScalingRun
from ._recipe import Recipe, ScalingRecipe

__all__ = ["ForecastConfig", "ScoreConfig", "forecast", "predict", "run_started", "score", "score_forecast"]

METHODS = (*LAW_METHODS, "frontier", *FRONTIER_METHODS)
FORECAST_VERSION = "scaling-forecast-v6"  # v5: the optima's noise beside the Delphi interval; v6: in the step's result too; v4: the Delphi method  # v2: the target's whole training config, the recipe checked; v3: the fitted runs' data
SCORE_VERSION = "scaling-score-v4"  # v2: finished runs only, the run's start, the whole config compared; v3: the start is the earliest evidence (a killed attempt leaves no history line); v4: the data compared, a difference refused


def target_run(
    fit: Mapping[str, Any],
    budget: float,
    recipe: ScalingRecipe,
    width: int | None = None,
    method: str | None = None,
) -> Recipe:
    """The run a forecast is about: the recipe's run at `budget` of `width`, else (`method="delphi"`) of the
    member closest to the Delphi fit's N*(budget), else of the family member closest
    to approach 2's compute-optimal N*(budget), else (approach 2 failed) of the member whose loss the variable
    projection law (approach 3's if that failed) predicts lowest."""
    if width is not None:
        return recipe.run(budget, width)
    if method == "delphi":
        delphi = fit.get("delphi", {"error": "the fit has no Delphi entry (fitted before scaling-fit-v6)"})
        if "error" in delphi:
            raise ValueError(f"the Delphi forecast needs the Delphi fit, which failed: {delphi['error']}")
        return recipe(budget, params=float(PowerLaw(**delphi["params_law"])(budget)))
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
    """The predicted final loss of a run of `params` and `tokens` (`flops` for the frontier and Delphi) with
    `method`, and its `level` interval: the bootstrap replicates plus resampled residuals, or for "delphi"
    the percentiles of the replicates' L*(flops) (bootstrap over budgets)."""
    rng = np.random.default_rng(seed)
    if method in LAW_METHODS:
        point = float(fitted_law(fit, method).loss(params, tokens))
        reps = np.array([float(ScalingLaw(**r).loss(params, tokens)) for r in fit[method]["replicates"]])
        residuals = np.asarray(fit[method]["log_residuals"])
    elif method == "delphi":
        delphi = fit.get("delphi", {"error": "the fit has no Delphi entry (fitted before scaling-fit-v6)"})
        if "error" in delphi:
            raise ValueError(f"the Delphi forecast needs the Delphi fit, which failed: {delphi['error']}")
        law = delphi["law"]
        point = float(law["E"] + law["A"] * float(flops) ** (-law["alpha"]))
        reps = np.array([r["E"] + r["A"] * float(flops) ** (-r["alpha"]) for r in delphi["replicate_laws"]])
        noise = forecast_noise(delphi["optima"], float(flops), level=level)  # optima_noise (or why not)
        base = {"method": method, "loss": point, "replicates": int(reps.size), **noise}
        shortfall = replicates_shortfall(int(reps.size), int(delphi["samples"]))
        if shortfall is not None:
            return base | {"interval": None, "interval_error": f"the delphi fit: {shortfall}"}
        # Delphi's interval: the replicates' predictions alone (whole budgets resampled: the scatter of the
        # optima around the law is already what the replicates see)
        return base | {"interval": percentile_interval(reps, level).to_dict()}
    elif method == "frontier":
        a2 = fit["approach2"]
        if "error" in a2:
            raise ValueError(f"the frontier forecast needs approach 2, which failed: {a2['error']}")
        point = float(PowerLaw(**a2["loss_law"])(flops))
        reps = np.array([float(PowerLaw(**r["loss_law"])(flops)) for r in a2["replicates"]])
        residuals = np.asarray(a2["loss_law_log_residuals"])
    else:
        raise ValueError(f"forecast method must be one of {METHODS}; got {method!r}")
    out: dict[str, Any] = {"method": method, "loss": point, "replicates": int(reps.size)}
    shortfall = replicates_shortfall(int(reps.size), int(fit["samples"]))
    if shortfall is not None:  # no interval rather than one that only looks like one (zero width from none)
        out["interval"] = None
        out["interval_error"] = f"the {method} fit: {shortfall}"
        return out
    noisy = reps * np.exp(rng.choice(residuals, size=reps.size))
    out["interval"] = percentile_interval(noisy, level).to_dict()
    return out


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
    """"varpro", "approach3" (the law at the target's N and D), "frontier" (approach 2's L*(C)) or "delphi"
    (the Delphi fit's L*(C) = E + A C^-alpha, its target sized by the Delphi N*(C))."""
    level: float = 0.9
    width: int | None = None
    """Fix the target's width instead of sizing it by approach 2's N*(C)."""
    seed: int = 0
    check_recipe: bool = True
    """Refuse a recipe that did not make the fitted runs (each fitted run's N and D must be one of the recipe's
    runs at its budget); False for runs no recipe made (published or synthetic ones)."""

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
    check_recipe: bool = True,
) -> StepHandle:
    """A step registering a forecast of the final loss of the recipe's compute-optimal run at `budget`.

    Its folder holds `forecast.json` (the prediction, interval, method, target run, the fit's inputs and
    when it was written) and `forecast.png`; its result names the target so the run can be declared from it:
    `train_lm(name, **recipe.run(budget, result["target"]["width"]), ...)`.
    """
    config = ForecastConfig(
        fit=fit, budget=float(budget), recipe=recipe or ScalingRecipe(), method=method, level=level,
        width=width, seed=seed, check_recipe=check_recipe,
    )  # fmt: skip
    return step(
        name,
        _run_forecast,
        config,
        version=FORECAST_VERSION,
        description=f"{method} forecast at C={budget:.3g}",
    )


def _check_recipe(fit: Mapping[str, Any], recipe: ScalingRecipe) -> None:
    """Refuse a recipe that did not make the fitted runs (another family, vocabulary, sequence length or
    rules than the sweep's): its target run would not be the run the fit describes. Each fitted run's N and D
    must be those of one of the recipe's runs at that budget."""
    for budget in sorted({float(r["budget"]) for r in fit["runs"]}):
        made = {(c.params, c.tokens) for c in recipe.candidates(budget)}
        for r in fit["runs"]:
            if float(r["budget"]) == budget and (int(r["params"]), int(r["tokens"])) not in made:
                raise ValueError(
                    f"forecast: the recipe does not make the fitted run {r.get('name') or '(unnamed)'} (N={r['params']:.0f}, "
                    f"D={r['tokens']:.0f} at budget {budget:.3g}): pass the recipe the sweep used "
                    "(isoflop_sweep(recipe=...)); its family, vocabulary, seq_len or rules differ (runs that no "
                    "recipe made, e.g. published ones: check_recipe=False)"
                )


def _train_config(target: Recipe) -> dict[str, Any]:
    """What the target run must train with, as its `run.json` records it (model and optimizer serialised
    the way the train loop does)."""
    from schooner.train._run_info import config_to_json

    return {
        "model_config": config_to_json(target.model),
        "optimizer": config_to_json(target.optimizer),
        "batch_size": target.batch_size,
        "seq_len": target.seq_len,
        "num_train_steps": target.num_train_steps,
    }


def _backtest(fit: Mapping[str, Any], method: str, budget: float, largest: float) -> dict[str, Any]:
    """The fit's backtest of `method`, with its error scaled to this forecast's reach, or why there is none."""
    bt = fit.get("backtest", {"error": "the fit has no backtest (fitted before scaling-fit-v2)"})
    if "error" in bt:
        return {"error": bt["error"]}
    m = bt["methods"].get(method, {"error": f"the backtest has no {method}"})
    if "error_pct" not in m:
        return {"error": m.get("error", "no error_pct")}
    reach = math.log(budget / largest) / math.log(bt["extrapolation"])
    return {
        **m,
        "held_out_budget": bt["held_out_budget"],
        "extrapolation": bt["extrapolation"],
        "scaled_error_pct": m["error_pct"] * reach,
    }


def _run_forecast(config: ForecastConfig, output_path: str) -> dict[str, Any]:
    from ._plots import plot_forecast

    fit = read_fit(str(config.fit))
    if config.check_recipe:
        _check_recipe(fit, config.recipe)
    target = target_run(fit, config.budget, config.recipe, config.width, method=config.method)
    pred = predict(
        fit, config.method, target.params, target.tokens, target.flops, level=config.level, seed=config.seed
    )
    largest = max(r["budget"] for r in fit["runs"])
    backtest = _backtest(fit, config.method, config.budget, largest)
    record = {
        **pred,
        "created_unix": time.time(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "budget": config.budget,
        "extrapolation": config.budget / largest,
        "target": target.summary(),
        "train": _train_config(target),
        "backtest": backtest,
        "data": fit.get("data", {"error": "the fit records no data (fitted before scaling-fit-v5)"}),
        "fit": {
            "path": str(config.fit),
            "law": fit[config.method]["law"]
            if config.method in (*LAW_METHODS, *FRONTIER_METHODS)
            else fit["approach2"]["loss_law"],
            "runs": fit["runs"],
            "samples": fit["samples"],
        },
    }
    storage.write_json(f"{output_path}/forecast.json", record)
    plot_forecast([ScalingRun.from_dict(r) for r in fit["runs"]], record, f"{output_path}/forecast.png")
    iv = pred["interval"]
    return {
        "method": config.method,
        "loss": round(pred["loss"], 5),
        "interval": None if iv is None else [round(iv["low"], 5), round(iv["high"], 5)],
        **({"interval_error": pred["interval_error"]} if iv is None else {}),
        **({"optima_noise_sd_pct": _sd_pct(pred["optima_noise"])} if "optima_noise" in pred else {}),
        "level": config.level,
        "budget": config.budget,
        "extrapolation": round(record["extrapolation"], 2),
        "created_at": record["created_at"],
        "backtest_error_pct": round(backtest["error_pct"], 3) if "error_pct" in backtest else None,
        "backtest_scaled_error_pct": round(backtest["scaled_error_pct"], 3)
        if "error_pct" in backtest
        else None,
        **({"backtest_error": backtest["error"]} if "error" in backtest else {}),
        "target": {
            k: target.summary()[k]
            for k in ("width", "layers", "params", "tokens", "flops", "batch_size", "steps")
        },
    }


def _sd_pct(noise: Mapping[str, Any] | None) -> float | None:
    """The optima's noise at a forecast's target, in percent of the forecast (None: not measured)."""
    return None if noise is None else round(noise["sd_pct"], 3)


def score(prediction: Mapping[str, Any], actual: float) -> dict[str, Any]:
    """How a forecast (`forecast.json`'s content) fared against the actual final loss."""
    iv = prediction["interval"]
    return {
        "method": prediction["method"],
        "predicted": float(prediction["loss"]),
        "actual": float(actual),
        "error_pct": 100.0 * (float(prediction["loss"]) - float(actual)) / float(actual),
        "interval": None if iv is None else [float(iv["low"]), float(iv["high"])],
        "level": None if iv is None else float(iv["level"]),
        "inside_interval": None if iv is None else bool(iv["low"] <= actual <= iv["high"]),
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
    accept_other_data: bool = False
    """Score a run whose data, tokenizer or validation sets differ from the fitted runs' (flagged in
    `data_mismatches`); False: refuse it, naming what differs."""


def score_forecast(
    name: str,
    forecast: StepHandle | str,
    *,
    run: StepHandle | str,
    evaluation: StepHandle | str | None = None,
    accept_other_data: bool = False,
) -> StepHandle:
    """A step scoring a registered forecast against the finished run (`score.json`, `forecast.png`).

    A run whose training data, tokenizer or validation sets differ from those of the runs the forecast's law
    was fitted on is refused (the error names what differs); `accept_other_data=True` scores it, with
    `same_data: false` and the differences in `data_mismatches`."""
    config = ScoreConfig(
        forecast=forecast, run=run, evaluation=evaluation, accept_other_data=accept_other_data
    )
    return step(name, _run_score, config, version=SCORE_VERSION, description="score a registered forecast")


def run_started(train_path: str) -> tuple[float | None, str]:
    """When the run began (unix time) and where that was read: the earliest evidence of any attempt.

    Two sources, the earlier wins: the attempts' starts in the step's history (`.schooner/history.jsonl`:
    the step runner appends an attempt's line, with its start before compiling, when the attempt ends, and a
    SIGKILLed attempt's, as LOST, only when a later attempt takes the step over; folders written by older
    runners lack those), and the run's first metrics row (later than its attempt's start
    by the compile time; a resumed attempt appends to the rows of the attempts before it). A forecast written
    between a killed attempt and its resumption is therefore not "before the run".
    """
    found: list[tuple[float, str]] = []
    # through the records module: the runner's files are its own (a torn line, a writer killed mid-write, is
    # skipped there and says nothing)
    for attempt in records.read_history(train_path):
        with contextlib.suppress(TypeError, ValueError):
            if attempt.get("started") is not None:
                found.append((float(attempt["started"]), "step history"))
    for row in records.read_metrics(train_path):
        if row.get("time") is not None:
            found.append((float(row["time"]), "first metrics row"))
            break
    return min(found) if found else (None, "nothing recorded")


def _mismatches(expected: Any, got: Any, where: str = "") -> list[str]:
    """The fields in which a run's recorded config differs from the forecast's target, as `path: a != b`."""
    if isinstance(expected, Mapping) and isinstance(got, Mapping):
        out: list[str] = []
        for k in sorted(set(expected) | set(got)):
            out += _mismatches(expected.get(k), got.get(k), f"{where}.{k}" if where else str(k))
        return out
    return [] if expected == got else [f"{where}: forecast {expected!r}, run {got!r}"]


_DATA_PARTS = {"tokenizer": "tokenizer", "train": "training data", "validation": "validation sets"}


def _data_mismatches(recorded: Any, run: Mapping[str, Any]) -> tuple[list[str], str | None]:
    """`(differences, note)`: what differs between the fitted runs' data (`forecast.json`'s `data`) and the
    run's, one line per part, e.g. "training data: forecast {...}, run {...}"; the note says why nothing
    could be compared (a forecast written before scaling-forecast-v3, or fitted runs on mixed data)."""
    if not isinstance(recorded, Mapping) or "error" in recorded:
        why = recorded.get("error") if isinstance(recorded, Mapping) else "none recorded"
        return [], f"the forecast's data is unknown ({why}): not compared"
    out = []
    for key, what in _DATA_PARTS.items():
        if recorded.get(key) != run.get(key):
            out.append(f"{what}: forecast {recorded.get(key)!r}, run {run.get(key)!r}")
    return out, None


def _run_score(config: ScoreConfig, output_path: str) -> dict[str, Any]:
    from schooner.train._run_info import recorded_data

    from ._plots import plot_forecast
    from ._sweep import run_counts, run_data, run_loss

    prediction = storage.read_json(f"{config.forecast}/forecast.json")
    data_mismatches, data_note = _data_mismatches(prediction.get("data"), run_data(str(config.run)))
    if data_mismatches and not config.accept_other_data:
        raise ValueError(
            f"score_forecast: the run {config.run} did not train or evaluate on the data of the runs the "
            f"forecast {config.forecast} was fitted on, so its loss is not the predicted one: "
            + "; ".join(data_mismatches)
            + ". Train the target on the sweep's data, tokenizer and validation sets, or pass "
            "accept_other_data=True to score it anyway (flagged)"
        )
    counts = run_counts(str(config.run))
    actual = run_loss(
        str(config.run),
        config.evaluation and str(config.evaluation),
        config.metric,
        final_step=counts["steps"],
    )
    started, started_from = run_started(str(config.run))
    info = storage.read_json(f"{config.run}/run.json")
    recorded = {
        "model_config": info["model_config"],
        "optimizer": info["config"]["optimizer"],
        "batch_size": info["config"]["batch_size"],
        "seq_len": recorded_data(info["config"])["seq_len"],
        "num_train_steps": info["config"]["num_train_steps"],
    }
    target = prediction["target"]
    if "train" in prediction:
        mismatches = _mismatches(prediction["train"], recorded)
    else:  # a forecast written before scaling-forecast-v2 names only N and D
        mismatches = [
            f"{k}: forecast {target[k]!r}, run {counts[k]!r}"
            for k in ("params", "tokens")
            if counts[k] != target[k]
        ]
    backtest = prediction.get("backtest", {})
    result = {
        **score(prediction, actual["loss"]),
        "budget": prediction["budget"],
        "extrapolation": prediction["extrapolation"],
        "forecast_written": prediction["created_at"],
        "run_started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)) if started else None,
        "run_started_from": started_from,
        "registered_before_run": started is not None and prediction["created_unix"] < started,
        "matches_target": not mismatches,
        "mismatches": mismatches,
        "same_data": None if data_note else not data_mismatches,
        "data_mismatches": data_mismatches,
        **({"data_note": data_note} if data_note else {}),
        "run_flops": counts["flops"],
        "actual_bpb": actual.get("bpb"),
        "backtest_error_pct": backtest.get("error_pct"),
        "backtest_scaled_error_pct": backtest.get("scaled_error_pct"),
        **({"backtest_error": backtest["error"]} if "error" in backtest else {}),
    }
    storage.write_json(f"{output_path}/score.json", result)
    runs = [ScalingRun.from_dict(r) for r in prediction["fit"]["runs"]]
    plot_forecast(runs, prediction, f"{output_path}/forecast.png", actual=actual["loss"], outcome=result)
    summary = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in result.items()}
    summary["tables"] = [_score_table(result)]
    return summary


def _score_table(result: Mapping[str, Any]) -> dict[str, Any]:
    """The score as a table for `schooner report`."""
    iv = result["interval"]
    rows = [
        ["method", result["method"]],
        ["budget (FLOPs)", f"{result['budget']:.3g} ({result['extrapolation']:.3g}x the largest fitted)"],
        ["predicted loss", result["predicted"]],
        [
            f"{result['level']:.0%} interval" if iv else "interval",
            f"[{iv[0]:.4f}, {iv[1]:.4f}]" if iv else None,
        ],
        ["actual loss", result["actual"]],
        ["error %", result["error_pct"]],
        ["inside the interval", result["inside_interval"]],
        ["backtest error % (scaled to this reach)", result["backtest_scaled_error_pct"]],
        ["forecast written", result["forecast_written"]],
        ["run started", result["run_started"]],
        ["registered before the run", result["registered_before_run"]],
        ["the run is the forecast's target", result["matches_target"]],
        ["the fitted runs' data, tokenizer and validation sets", result["same_data"]],
    ]
    return {"title": "Forecast and outcome", "columns": ["", "value"], "rows": rows}
