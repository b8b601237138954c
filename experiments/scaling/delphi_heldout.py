"""The Delphi suite's second half: fits, forecasts registered as steps, then the held-out runs and the scores.

`held_out_phase` runs, in this order (the held-out runs are declared only once every forecast step has
written its file, so each forecast is registered before its run starts; `score_forecast` checks it):

1. `scaling/delphi-fit` (`fit_scaling_law`, every method; the Delphi fit drops and records a budget whose
   parabola fails), `scaling/delphi-forecast-{k}x` (the Delphi forecast of the loss at k x the largest
   fitted budget) and `scaling/delphi-downstream` (`downstream_fit`: per sweep run the cloze task's soft
   metrics, each fitted against compute with `fit_delphi`, the soft-to-hard sigmoid on the pool of runs, and
   the forecasts of every metric at the held-out budgets, in `downstream.json`; it needs the sweep runs'
   cloze scores, so their checkpoints), all written before any held-out run is declared;
2. the held-out runs (`scaling/delphi-heldout/{k}x-s{seed}`), their cloze evaluations, a `score_forecast`
   per run and `scaling/delphi-downstream-score` (each metric's forecast against each seed, and whether the
   downstream forecast was written before that seed's run started).

`SCHOONER_DELPHI_PHASE=heldout` (or `SCHOONER_DELPHI_DOWNSTREAM=0`) leaves the downstream fit and its scores
out (for a prefix whose sweep runs have no checkpoints: the v5e sweep's records); `=forecast` registers the
forecasts and stops.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from schooner.cluster import RunResult, StepHandle, StepRunner, step, storage
from schooner.train.scaling import (
    ScalingRun,
    fit_delphi,
    fit_scaling_law,
    fit_soft_to_hard,
    forecast,
    read_runs,
    run_started,
    score_forecast,
    soft_metrics,
)
from schooner.train.steps import train_lm

SOFT = ("choice_loss", "bpb")
TASK = "sp_cloze"
CHANCE = 0.25


def run_metrics(evaluation_path: str) -> dict[str, float]:
    """The cloze task's soft and hard metrics of one evaluated run (its documents file)."""
    results = storage.read_json(f"{evaluation_path}/results.json")
    docs_file = f"{evaluation_path}/{results['tasks'][TASK]['documents_file']}"
    docs = [json.loads(line) for line in storage.read_text(docs_file).splitlines() if line.strip()]
    return soft_metrics(docs)


@dataclass(frozen=True)
class DownstreamConfig:
    sweep: Any
    evaluations: dict
    """{run name: evaluation step}."""
    budgets: tuple
    """The held-out budgets to forecast."""
    samples: int = 1000
    level: float = 0.9


def _downstream(config: DownstreamConfig, output_path: str) -> dict[str, Any]:
    runs = read_runs(str(config.sweep))
    rows = []
    for r in runs:
        m = run_metrics(str(config.evaluations[r.name]))
        rows.append({"name": r.name, "budget": r.budget, "params": r.params, "tokens": r.tokens, **m})
    out: dict[str, Any] = {"runs": rows, "metrics": {}, "level": config.level}
    for metric in SOFT:
        pts = [
            ScalingRun(
                budget=x["budget"], params=x["params"], tokens=x["tokens"], loss=x[metric], name=x["name"]
            )
            for x in rows
        ]
        try:
            fit = fit_delphi(pts, samples=config.samples, level=config.level, skip_unbracketed=True)
        except ValueError as e:
            out["metrics"][metric] = {"error": str(e)}
            continue
        forecasts = {}
        for c in config.budgets:
            iv = fit.interval(c)
            forecasts[f"{c:.4g}"] = {
                "compute": c,
                "value": float(fit.predict(c)),
                "interval": None if iv is None else iv.to_dict(),
            }
        out["metrics"][metric] = {"fit": fit.to_dict(), "forecasts": forecasts}
    hard = fit_soft_to_hard([x["choice_loss"] for x in rows], [x["acc"] for x in rows], chance=CHANCE)
    out["soft_to_hard"] = {"soft": "choice_loss", **hard.to_dict()}
    cl = out["metrics"]["choice_loss"]
    if "error" not in cl:
        out["acc_forecasts"] = {
            key: {
                "compute": f["compute"],
                "value": float(hard(f["value"])),
                # the map falls with the soft metric: the soft interval's high end is accuracy's low end
                "interval": None
                if f["interval"] is None
                else {
                    "low": float(hard(f["interval"]["high"])),
                    "high": float(hard(f["interval"]["low"])),
                    "level": f["interval"]["level"],
                },
            }
            for key, f in cl["forecasts"].items()
        }
    out["created_unix"] = time.time()
    out["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    storage.makedirs(output_path)
    storage.write_text(f"{output_path}/downstream.json", json.dumps(out, indent=1, sort_keys=True))
    return {m: out["metrics"][m].get("forecasts", out["metrics"][m].get("error")) for m in SOFT} | {
        "soft_to_hard": out["soft_to_hard"]
    }


def downstream_fit(name: str, sweep: StepHandle, evaluations: dict, budgets: tuple) -> StepHandle:
    cfg = DownstreamConfig(sweep=sweep, evaluations=evaluations, budgets=tuple(float(b) for b in budgets))
    return step(name, _downstream, cfg, version="delphi-downstream-v1", description="downstream forecasts")


@dataclass(frozen=True)
class DownstreamScoreConfig:
    downstream: Any
    heldout: list
    """[{"budget": C, "seed": s, "train": handle, "evaluation": handle}]."""


def _downstream_score(config: DownstreamScoreConfig, output_path: str) -> dict[str, Any]:
    registered = storage.read_json(f"{config.downstream}/downstream.json")
    rows = []
    for h in config.heldout:
        m = run_metrics(str(h["evaluation"]))
        started, _ = run_started(str(h["train"]))
        key = f"{float(h['budget']):.4g}"
        row = {"budget": h["budget"], "seed": h["seed"], **m}
        row["registered_before_run"] = started is not None and registered["created_unix"] < started
        for metric in SOFT:
            f = registered["metrics"][metric].get("forecasts", {}).get(key)
            if f is None:
                continue
            iv = f["interval"]
            row[f"{metric}_forecast"] = f["value"]
            row[f"{metric}_error_pct"] = 100.0 * (f["value"] - m[metric]) / m[metric]
            row[f"{metric}_inside"] = None if iv is None else bool(iv["low"] <= m[metric] <= iv["high"])
        f = registered.get("acc_forecasts", {}).get(key)
        if f is not None:
            row["acc_forecast"] = f["value"]
            row["acc_error_points"] = 100.0 * (f["value"] - m["acc"])
            iv = f["interval"]
            row["acc_inside"] = None if iv is None else bool(iv["low"] <= m["acc"] <= iv["high"])
        rows.append(row)
    storage.makedirs(output_path)
    storage.write_text(f"{output_path}/score.json", json.dumps(rows, indent=1, sort_keys=True))
    return {"rows": len(rows)}


def loss_fit(name: str, sweep: StepHandle) -> StepHandle:
    """The suite's fit step (every method; the Delphi fit with 1,000 bootstrap replicates over budgets)."""
    return fit_scaling_law(
        name, sweep, samples=60, level=0.9, delphi_skip_unbracketed=True, delphi_samples=1000
    )


def loss_forecast(k: int, fit: StepHandle) -> StepHandle:
    """The suite's registered Delphi forecast at k x its largest fitted budget."""
    from experiments.scaling import delphi_suite as suite

    return forecast(
        f"scaling/delphi-forecast-{k}x",
        fit,
        budget=k * max(suite.BUDGETS),
        recipe=suite.RECIPE,
        method="delphi",
    )


def held_out_run(k: int, seed: int, width: int) -> StepHandle:
    """The suite's held-out run at k x its largest fitted budget, at the forecast target's width."""
    from experiments.scaling import delphi_suite as suite

    largest = max(suite.BUDGETS)
    return train_lm(
        f"scaling/delphi-heldout/{k}x-s{seed}",
        **suite.RECIPE.run(k * largest, width),
        datasets=suite.DATA,
        seed=seed,
        **suite.TRAIN,
    )


def held_out_phase(runner: StepRunner, sweep: StepHandle, runs: list, evals: list, cloze_path: str) -> None:
    from experiments.scaling import delphi_suite as suite

    largest = max(suite.BUDGETS)
    targets = [k * largest for k in suite.HELD_OUT]
    fit = loss_fit("scaling/delphi-fit", sweep)
    down = downstream_fit(
        "scaling/delphi-downstream",
        sweep,
        {r.train.name: e for r, e in zip(runs, evals, strict=True)},
        targets,
    )
    guesses = {k: loss_forecast(k, fit) for k in suite.HELD_OUT}
    loss_only = (
        os.environ.get("SCHOONER_DELPHI_PHASE") == "heldout"
        or os.environ.get("SCHOONER_DELPHI_DOWNSTREAM") == "0"
    )
    # every forecast, the downstream ones included, is written before any held-out run is declared
    registered = runner.main([fit, *guesses.values(), *([] if loss_only else [down])])
    if os.environ.get("SCHOONER_DELPHI_PHASE") == "forecast":  # register now, run the held-out runs later
        print("\nfit:", json.dumps(registered[fit].result, indent=1))
        for k, guess in guesses.items():
            print(f"forecast {k}x:", json.dumps(registered[guess].result, indent=1))
        if not loss_only:  # SCHOONER_DELPHI_DOWNSTREAM=0 registers the loss forecasts alone
            print("downstream forecasts:", json.dumps(registered[down].result, indent=1))
        return
    heldout, scores = [], []
    for k, guess in guesses.items():
        if k not in suite.TRAIN_HELD_OUT:  # registered, trained in another session
            continue
        width = registered[guess].result["target"]["width"]
        for seed in suite.SEEDS:
            run = held_out_run(k, seed, width)
            ev = suite.cloze_eval(f"{run.name}-cloze", run, cloze_path)
            heldout.append({"budget": k * largest, "seed": seed, "train": run, "evaluation": ev})
            scores.append(score_forecast(f"scaling/delphi-forecast-{k}x-score-s{seed}", guess, run=run))
    down_score = step(
        "scaling/delphi-downstream-score",
        _downstream_score,
        DownstreamScoreConfig(downstream=down, heldout=heldout),
        version="delphi-downstream-score-v1",
    )
    if loss_only:  # the loss forecasts' runs and scores only
        scored = runner.main(scores)
        print_summary(registered, scored, fit, guesses, scores, None)
        return
    scored = runner.main([*scores, down, down_score])
    print_summary(registered, scored, fit, guesses, scores, down_score)


def print_scores(scored: RunResult, scores: list) -> None:
    """One line per `score_forecast` step: the forecast, its interval, the run's loss and the error."""
    for s in scores:
        r = scored[s].result
        print(
            f"{s.name}: predicted {r['predicted']:.4f} {r['interval']} actual {r['actual']:.4f} "
            f"error {r['error_pct']:+.2f}% inside {r['inside_interval']} registered {r['registered_before_run']}"
        )


def print_summary(registered: RunResult, scored: RunResult, fit, guesses, scores, down_score=None) -> None:
    print("\nfit:", json.dumps(registered[fit].result, indent=1))
    print_scores(scored, scores)
    if down_score is not None:
        path = scored[down_score].output_path
        for row in storage.read_json(f"{path}/score.json"):
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    losses = {}
    for s in scores:
        r = scored[s].result
        losses.setdefault(r["budget"], []).append(r["actual"])
    for b, v in losses.items():
        if len(v) < 2:  # a spread needs two seeds
            continue
        print(
            f"seed spread at {b:.3g}: {100 * np.std(v, ddof=1) / np.mean(v):.3f}% (std/mean), range {min(v):.4f}..{max(v):.4f}"
        )
