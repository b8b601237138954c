"""Fitting a sweep: approach 2, approach 3 and variable projection with bootstrap intervals, as a function
(`fit_runs`) and as a step (`fit_scaling_law`) that writes `fit.json` and the plots.

`fit.json` keeps the bootstrap replicates (each replicate's law, or approach 2's power laws), so a forecast
reads its interval from them without refitting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schooner.cluster import StepHandle, step, storage

from ._approach2 import fit_approach2
from ._approach3 import Approach3Config, fit_approach3
from ._bootstrap import bootstrap, percentile_interval, replicates_shortfall
from ._delphi import fit_delphi
from ._law import ScalingLaw, ScalingRun, budget_groups
from ._varpro import VarProConfig, fit_varpro

__all__ = ["FitConfig", "backtest", "delphi_from_dict", "fit_runs", "fit_scaling_law", "read_fit"]

VERSION = "scaling-fit-v8"  # v2: the backtest; v3: no intervals from too few replicates, flags; v4: runaway; v5: the runs' data; v6: the Delphi fit; v7: the optima's standard errors; v8: their lack of fit
LAW_METHODS = ("approach3", "varpro")
FRONTIER_METHODS = ("delphi",)
"""Methods that forecast the compute-optimal loss L*(C) from a law in compute alone (besides approach 2's
frontier): "delphi" (`_delphi`: parabolas in log tokens, E + A C^-alpha through the optima, bootstrap over
budgets)."""
_LAW_KEYS = ("E", "A", "B", "alpha", "beta", "a", "b")


def _law_summary(law: ScalingLaw) -> dict[str, float]:
    return {**law.to_dict(), "a": law.a, "b": law.b}


def _intervals(
    rows: Sequence[dict[str, float]], keys: Sequence[str], level: float, samples: int
) -> dict[str, Any]:
    """`intervals` of `keys` over the replicates' `rows`, or `intervals_error` when too few succeeded."""
    shortfall = replicates_shortfall(len(rows), samples)
    if shortfall is not None:
        return {"intervals_error": shortfall}
    return {"intervals": {k: percentile_interval([r[k] for r in rows], level).to_dict() for k in keys}}


def log_residuals(runs: Sequence[ScalingRun], law: ScalingLaw) -> list[float]:
    """ln(observed) - ln(fitted) per run."""
    pred = law.loss([r.params for r in runs], [r.tokens for r in runs])
    return (np.log([r.loss for r in runs]) - np.log(pred)).tolist()


def _approach2_summary(
    runs: Sequence[ScalingRun], *, samples: int, level: float, seed: int
) -> dict[str, Any]:
    a2 = fit_approach2(runs)
    reps, failed = bootstrap(runs, fit_approach2, samples=samples, seed=seed)
    rows = [{"a": f.a, "b": f.b, "loss_exponent": f.loss_law.exponent} for f in reps]
    return {
        **a2.to_dict(),
        **_intervals(rows, ("a", "b", "loss_exponent"), level, samples),
        "failed": failed,
        "replicates": [
            {
                "params_law": f.params_law.to_dict(),
                "tokens_law": f.tokens_law.to_dict(),
                "loss_law": f.loss_law.to_dict(),
            }
            for f in reps
        ],
        "loss_law_log_residuals": (
            np.log([p.min_loss for p in a2.params_parabolas]) - np.log(a2.loss_law(np.asarray(a2.budgets)))
        ).tolist(),
    }


def _delphi_summary(
    runs: Sequence[ScalingRun], *, samples: int, level: float, seed: int, skip_unbracketed: bool
) -> dict[str, Any]:
    """The Delphi fit as `fit.json` keeps it: `fit_delphi`'s record plus every bootstrap replicate's
    (E, A, alpha) under `replicate_laws` (a forecast's interval is their predictions' percentiles)."""
    fit = fit_delphi(runs, samples=samples, seed=seed, level=level, skip_unbracketed=skip_unbracketed)
    return {
        **fit.to_dict(),
        "replicate_laws": [{"E": float(e), "A": float(a), "alpha": float(al)} for e, a, al in fit.replicates],
        "samples": samples,
        "level": level,
    }


def backtest(
    runs: Sequence[ScalingRun],
    *,
    approach3: Approach3Config | None = None,
    varpro: VarProConfig | None = None,
    delphi_skip_unbracketed: bool = False,
) -> dict[str, Any]:
    """Each method fitted on every budget but the largest, predicting the best run of the largest: the
    extrapolation error a forecast's bootstrap interval does not see (it covers the noise of the runs, not a
    law that bends away from the fitted form). A forecast extrapolating k times further (in log compute)
    should expect about k times this error.

    Returns `held_out_budget`, `fitted_budgets`, `extrapolation` (held-out budget / largest fitted one), the
    held-out best run, and per method ("varpro", "approach3", "frontier") its `predicted` loss and
    `error_pct`, or the `error` that stopped the fit. Needs three or more budgets.
    """
    runs = list(runs)
    groups = budget_groups([r.budget for r in runs])  # budgets within float noise are one group
    if len(groups) < 3:
        return {"error": f"a backtest needs runs at three or more budgets; got {len(groups)}"}
    budgets = [b for b, _ in groups]
    held = budgets[-1]
    fitted = [runs[i] for _, idx in groups[:-1] for i in idx]
    best = min((runs[i] for i in groups[-1][1]), key=lambda r: r.loss)
    out: dict[str, Any] = {
        "held_out_budget": held,
        "fitted_budgets": budgets[:-1],
        "extrapolation": held / budgets[-2],
        "held_out_best": best.to_dict(),
        "methods": {},
    }
    fitters = {
        "varpro": lambda: float(
            fit_varpro(fitted, varpro or VarProConfig()).law.loss(best.params, best.tokens)
        ),
        "approach3": lambda: float(
            fit_approach3(fitted, approach3 or Approach3Config()).law.loss(best.params, best.tokens)
        ),
        "frontier": lambda: float(fit_approach2(fitted).loss_law(held)),
        "delphi": lambda: float(
            fit_delphi(fitted, samples=1, skip_unbracketed=delphi_skip_unbracketed).predict(held)
        ),
    }
    for method, predict_best in fitters.items():
        try:
            predicted = predict_best()
        except ValueError as e:
            out["methods"][method] = {"error": str(e)}
            continue
        out["methods"][method] = {
            "predicted": predicted,
            "error_pct": 100.0 * (predicted - best.loss) / best.loss,
        }
    return out


def fit_runs(
    runs: Sequence[ScalingRun],
    *,
    samples: int = 200,
    level: float = 0.9,
    seed: int = 0,
    approach3: Approach3Config | None = None,
    varpro: VarProConfig | None = None,
    delphi_skip_unbracketed: bool = False,
    delphi_samples: int | None = None,
) -> dict[str, Any]:
    """Approach 2, approach 3, variable projection and the Delphi fit on `runs`, each with `level` bootstrap intervals over
    `samples` resamplings of the runs (`_bootstrap`). A JSON-able dict (the content of `fit.json`). When
    approach 2 cannot fit (a budget whose runs do not bracket a minimum), or approach 3 converges to a negative
    exponent, that method's entry holds the `error` and the other fits still run.

    Approach 3's replicates restart L-BFGS from the full fit's eight best end points rather than the whole
    grid (the full fit already located the basins; this keeps the bootstrap affordable). `backtest` holds
    each method's error predicting the largest budget from the others (see `backtest`).

    Each method keeps its `replicates` and the count that `failed`; when too few succeeded for an interval
    (fewer than 20, or than half of `samples`: `replicates_shortfall`) it has no `intervals` but an
    `intervals_error` saying so. The parametric fits need 5 runs at 2 or more budgets, and flag `degenerate`
    terms (A or B zero); variable projection flags an exponent `on_grid_edge`, approach 3 a `runaway` one (far
    beyond its grid of starts: `Approach3Config.runaway`).

    The Delphi fit (`delphi`, see `fit_delphi`) resamples whole budgets' optima, not runs; its entry holds the
    law, the optima, the penalties and the `replicate_laws`, or the `error` that stopped it
    (`delphi_skip_unbracketed`: drop a budget whose parabola fails instead, recorded in `dropped`;
    `delphi_samples`: its bootstrap replicates, default `samples`: they cost milliseconds, approach 3's do not).
    """
    runs = list(runs)
    approach3 = approach3 or Approach3Config()
    varpro = varpro or VarProConfig()
    out: dict[str, Any] = {
        "runs": [r.to_dict() for r in runs],
        "samples": samples,
        "level": level,
        "seed": seed,
    }

    try:
        out["approach2"] = _approach2_summary(runs, samples=samples, level=level, seed=seed)
    except ValueError as e:  # a budget without a bracketed minimum: the parametric fits still run
        out["approach2"] = {"error": str(e)}

    fits = {}
    for method, first in (
        ("approach3", lambda: fit_approach3(runs, approach3)),
        ("varpro", lambda: fit_varpro(runs, varpro)),
    ):
        try:
            fits[method] = first()
        except ValueError as e:  # e.g. approach 3 at a negative exponent: the other fits still run
            out[method] = {"error": str(e)}
    refits = {
        "approach3": lambda rs: fit_approach3(rs, approach3, starts=fits["approach3"].extra["best_starts"]),
        "varpro": lambda rs: fit_varpro(rs, varpro),
    }
    for method, full in fits.items():
        refit = refits[method]
        reps, failed = bootstrap(runs, refit, samples=samples, seed=seed)
        rows = [_law_summary(f.law) for f in reps]
        out[method] = {
            **full.to_dict(),
            **_intervals(rows, _LAW_KEYS, level, samples),
            "failed": failed,
            "replicates": [f.law.to_dict() for f in reps],
            "log_residuals": log_residuals(runs, full.law),
        }
    try:
        out["delphi"] = _delphi_summary(
            runs, samples=delphi_samples or samples, level=level, seed=seed,
            skip_unbracketed=delphi_skip_unbracketed,
        )  # fmt: skip
    except ValueError as e:  # e.g. a budget whose runs do not bracket a minimum: the other fits still stand
        out["delphi"] = {"error": str(e)}
    out["backtest"] = backtest(
        runs, approach3=approach3, varpro=varpro, delphi_skip_unbracketed=delphi_skip_unbracketed
    )
    return out


def read_fit(path: str) -> dict[str, Any]:
    """The `fit.json` of a fit step's folder (or the file itself)."""
    file = path if path.endswith(".json") else f"{path.rstrip('/')}/fit.json"
    fit: dict[str, Any] = storage.read_json(file)
    return fit


def fitted_law(fit: Mapping[str, Any], method: str) -> ScalingLaw:
    """The law of `method` ("approach3" or "varpro") in a `fit_runs` result."""
    if method not in LAW_METHODS:
        raise ValueError(f"method must be one of {LAW_METHODS}; got {method!r}")
    if "error" in fit[method]:
        raise ValueError(f"the {method} fit failed, so it cannot predict: {fit[method]['error']}")
    return ScalingLaw(**fit[method]["law"])


def write_plots(fit: dict[str, Any], output_path: str, up_to: float | None = None) -> None:
    """isoflops.png, frontier.png, fit_vs_observed.png and residuals.png of a `fit_runs` result."""
    from ._plots import plot_fit, plot_frontier, plot_isoflops, plot_residuals

    runs = [ScalingRun.from_dict(r) for r in fit["runs"]]
    a2 = None if "error" in fit["approach2"] else fit_approach2(runs)
    laws = {m: fitted_law(fit, m) for m in LAW_METHODS if m in fit and "error" not in fit[m]}
    plot_isoflops(runs, f"{output_path}/isoflops.png", a2)
    if a2 is not None:
        plot_frontier(a2, f"{output_path}/frontier.png", laws=laws, up_to=up_to)
    plot_fit(runs, laws, f"{output_path}/fit_vs_observed.png")
    plot_residuals(runs, laws, f"{output_path}/residuals.png")
    if "error" not in fit.get("delphi", {"error": ""}):
        from ._delphi import plot_delphi

        plot_delphi(delphi_from_dict(fit["delphi"]), f"{output_path}/delphi.png", runs=runs, up_to=up_to)


def delphi_from_dict(record: Mapping[str, Any]) -> Any:
    """The `DelphiFit` of a `fit.json`'s "delphi" entry (its replicates from `replicate_laws`)."""
    from ._approach2 import Parabola, PowerLaw
    from ._delphi import AsymptoticLaw, BudgetOptimum, DelphiFit, OvertrainingPenalty

    optima = tuple(
        BudgetOptimum(
            budget=o["budget"],
            tokens=o["tokens"],
            loss=o["loss"],
            params=o["params"],
            parabola=Parabola(**o["parabola"]),
            runs=o["runs"],
            loss_se=o.get("loss_se"),  # fits before scaling-fit-v7 have none, before v8 no lack_of_fit
            lack_of_fit=o.get("lack_of_fit"),
        )  # fmt: skip
        for o in record["optima"]
    )
    penalties = tuple(
        OvertrainingPenalty(
            multiplier=p["multiplier"],
            budgets=tuple(p["budgets"]),
            per_budget=tuple(p["per_budget"]),
            law=None if p["law"] is None else PowerLaw(**p["law"]),
        )  # fmt: skip
        for p in record["penalties"]
    )
    reps = np.array([[r["E"], r["A"], r["alpha"]] for r in record["replicate_laws"]], dtype=np.float64)
    return DelphiFit(
        optima=optima, law=AsymptoticLaw(**record["law"]), tokens_law=PowerLaw(**record["tokens_law"]),
        params_law=PowerLaw(**record["params_law"]), replicates=reps.reshape(-1, 3), failed=record["failed"],
        level=record.get("level", 0.9), penalties=penalties,
        dropped=tuple(record.get("dropped", ())),
    )  # fmt: skip


@dataclass(frozen=True)
class FitConfig:
    """Config of the `fit_scaling_law` step."""

    sweep: Any
    """The sweep-results step (a path when the step runs)."""
    samples: int = 200
    """Bootstrap resamplings."""
    level: float = 0.9
    """Coverage of the intervals."""
    seed: int = 0
    approach3: Approach3Config = field(default_factory=Approach3Config)
    varpro: VarProConfig = field(default_factory=VarProConfig)
    delphi_skip_unbracketed: bool = False
    """Drop (and record) a budget whose Delphi parabola fails instead of failing the Delphi fit."""
    delphi_samples: int | None = None
    """The Delphi fit's bootstrap replicates (None: `samples`)."""

    def __post_init__(self) -> None:
        if self.samples < 1 or not 0 < self.level < 1:
            raise ValueError(
                f"FitConfig needs samples >= 1 and 0 < level < 1; got {self.samples=}, {self.level=}"
            )


def fit_scaling_law(
    name: str,
    sweep: StepHandle | str,
    *,
    samples: int = 200,
    level: float = 0.9,
    seed: int = 0,
    approach3: Approach3Config | None = None,
    varpro: VarProConfig | None = None,
    delphi_skip_unbracketed: bool = False,
    delphi_samples: int | None = None,
) -> StepHandle:
    """A step fitting a sweep's runs (see `fit_runs`); its folder holds `fit.json` and the PNG plots (the
    four of approaches 2/3 and variable projection, and `delphi.png`)."""
    config = FitConfig(
        sweep=sweep, samples=samples, level=level, seed=seed,
        approach3=approach3 or Approach3Config(), varpro=varpro or VarProConfig(),
        delphi_skip_unbracketed=delphi_skip_unbracketed, delphi_samples=delphi_samples,
    )  # fmt: skip
    return step(
        name, _run_fit, config, version=VERSION,
        description="approach 2, approach 3, variable projection, Delphi",
    )  # fmt: skip


def _run_fit(config: FitConfig, output_path: str) -> dict[str, Any]:
    from ._sweep import read_run_data, read_runs

    runs = read_runs(str(config.sweep))
    data = read_run_data(str(config.sweep))
    fit = fit_runs(
        runs, samples=config.samples, level=config.level, seed=config.seed,
        approach3=config.approach3, varpro=config.varpro,
        delphi_skip_unbracketed=config.delphi_skip_unbracketed, delphi_samples=config.delphi_samples,
    )  # fmt: skip
    fit["data"] = fitted_data(data, runs)
    storage.makedirs(output_path)
    storage.write_json(f"{output_path}/fit.json", fit)
    write_plots(fit, output_path)
    return fit_summary(fit)


def fitted_data(data: Sequence[Mapping[str, Any] | None], runs: Sequence[ScalingRun]) -> dict[str, Any]:
    """The data the fitted runs trained on (`_sweep.run_data`), which they must share: that, or an `error`
    naming the runs that differ or record none (a sweep collected before isoflop-results-v3)."""
    missing = [r.name or f"run {i}" for i, (r, d) in enumerate(zip(runs, data, strict=True)) if d is None]
    if missing:
        return {"error": f"runs record no data (collected before isoflop-results-v3): {', '.join(missing)}"}
    first = data[0]
    assert first is not None
    other = [r.name or f"run {i}" for i, (r, d) in enumerate(zip(runs, data, strict=True)) if d != first]
    if other:
        return {
            "error": f"the runs trained on different data: {', '.join(other)} differ from {runs[0].name!r}"
        }
    return dict(first)


def fit_summary(fit: Mapping[str, Any]) -> dict[str, Any]:
    """The fit step's result (shown by `schooner report`): per method its exponents with intervals, how many
    of the bootstrap `samples` failed, why there is no interval, and the flags of an unconstrained law."""
    summary: dict[str, Any] = {"runs": len(fit["runs"]), "samples": fit["samples"]}
    for method in ("approach2", *LAW_METHODS):
        result = fit[method]
        if "error" in result:
            summary[f"{method}.error"] = result["error"]
            continue
        keys = ("a", "b") if method == "approach2" else ("alpha", "beta", "E", "a", "b")
        for k in keys:
            value = result["law"][k] if k in result.get("law", {}) else result[k]
            iv = result.get("intervals", {}).get(k)
            summary[f"{method}.{k}"] = round(float(value), 4)
            if iv:
                summary[f"{method}.{k}_interval"] = [round(iv["low"], 4), round(iv["high"], 4)]
        summary[f"{method}.failed"] = f"{result['failed']} of {fit['samples']}"
        for flag in ("intervals_error", "on_grid_edge", "degenerate", "runaway"):
            if result.get(flag):
                summary[f"{method}.{flag}"] = result[flag]
    delphi = fit.get("delphi")
    if delphi is not None and "error" in delphi:
        summary["delphi.error"] = delphi["error"]
    elif delphi is not None:
        for k in ("E", "A", "alpha"):
            summary[f"delphi.{k}"] = float(f"{delphi['law'][k]:.4g}")
            iv = (delphi.get("intervals") or {}).get(k)
            if iv:
                summary[f"delphi.{k}_interval"] = [float(f"{iv['low']:.4g}"), float(f"{iv['high']:.4g}")]
        summary["delphi.failed"] = f"{delphi['failed']} of {delphi['samples']}"
        if delphi.get("dropped"):
            summary["delphi.dropped"] = [d["budget"] for d in delphi["dropped"]]
        if delphi.get("interval_problem"):
            summary["delphi.intervals_error"] = delphi["interval_problem"]
    return summary
