"""The Delphi fit as a method of `fit_runs` / `forecast` / `score`: checked against numpy formulas on synthetic
isoFLOP runs drawn from a known law L*(C) = E + A C^-alpha."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from schooner.train.scaling import (
    Approach3Config,
    ScalingRun,
    VarProConfig,
    delphi_from_dict,
    fit_runs,
    optima_noise,
    predict,
    score,
)
from schooner.train.scaling._fit import fit_summary
from schooner.train.scaling._forecast import ForecastConfig, _run_forecast
from schooner.train.scaling._horizon import HorizonFamily, HorizonRecipe

TRUE = {"E": 1.8, "A": 60.0, "alpha": 0.09}
BUDGETS = [1e12 * 3**i for i in range(5)]


def _runs(
    noise: float = 0.0, seed: int = 0, budgets=BUDGETS, low_side: float | None = None
) -> list[ScalingRun]:
    """Five runs per budget: loss = L*(C) + 0.04 (ln D - ln D*)^2 (+ noise), D* = 0.3 C^0.5, N = C / 6D
    (`low_side`: the runs of that budget all below D*)."""
    rng = np.random.default_rng(seed)
    out = []
    for c in budgets:
        d_opt = 0.3 * c**0.5
        l_opt = TRUE["E"] + TRUE["A"] * c ** (-TRUE["alpha"])
        grid = np.geomspace(1 / 16, 1 / 2, 5) if c == low_side else np.geomspace(1 / 4, 4, 5)
        for i, d in enumerate(d_opt * grid):
            loss = l_opt + 0.04 * math.log(d / d_opt) ** 2 + noise * rng.standard_normal()
            out.append(
                ScalingRun(budget=c, params=c / (6 * d), tokens=float(d), loss=loss, name=f"{c:.0e}-{i}")
            )
    return out


# Approaches 2/3 and variable projection run too (fit_runs fits them all): approach 3 from a coarse grid keeps
# this file fast; their accuracy is test_scaling_fits.py's concern.
COARSE = Approach3Config(alpha=(0.2, 0.6), beta=(0.2, 0.6), e=(0.0, 1.0), a=(2.0, 8.0), b=(2.0, 8.0), top_k=1)


def _quick(runs, **kw):
    return fit_runs(runs, samples=25, approach3=COARSE, varpro=VarProConfig(points=12), **kw)


def test_fit_runs_holds_the_delphi_law_and_its_replicates() -> None:
    fit = _quick(_runs())
    d = fit["delphi"]
    assert d["law"] == pytest.approx(TRUE, rel=1e-5)
    assert len(d["replicate_laws"]) + d["failed"] == 25 and d["samples"] == 25
    assert [o["budget"] for o in d["optima"]] == pytest.approx(BUDGETS)
    json.dumps(fit)  # fit.json must be JSON
    summary = fit_summary(fit)
    assert summary["delphi.alpha"] == pytest.approx(0.09, rel=1e-3)
    # The backtest predicts the largest budget from the other four: exact data, exact law.
    bt = fit["backtest"]["methods"]["delphi"]
    best = min(r.loss for r in _runs() if r.budget == BUDGETS[-1])
    want = TRUE["E"] + TRUE["A"] * BUDGETS[-1] ** -TRUE["alpha"]
    assert bt["predicted"] == pytest.approx(want, rel=1e-6)
    assert bt["error_pct"] == pytest.approx(100 * (want - best) / best, rel=1e-4)


def test_the_delphi_forecast_is_the_law_and_its_interval_the_replicates_percentiles() -> None:
    fit = _quick(_runs(noise=0.003, seed=3))
    c = 30 * BUDGETS[-1]
    pred = predict(fit, "delphi", params=1.0, tokens=1.0, flops=c, level=0.8)
    law = fit["delphi"]["law"]
    assert pred["loss"] == pytest.approx(law["E"] + law["A"] * c ** -law["alpha"], rel=1e-12)
    reps = np.array([r["E"] + r["A"] * c ** -r["alpha"] for r in fit["delphi"]["replicate_laws"]])
    low, high = np.percentile(reps, [10, 90])
    assert (pred["interval"]["low"], pred["interval"]["high"]) == pytest.approx((low, high), rel=1e-12)
    assert pred["interval"]["low"] < pred["loss"] < pred["interval"]["high"]
    # The same through the `DelphiFit` rebuilt from fit.json
    rebuilt = delphi_from_dict(fit["delphi"])
    iv = rebuilt.interval(c, level=0.8)
    assert (iv.low, iv.high) == pytest.approx((low, high), rel=1e-12)
    # score(): error in percent of the actual, inside or not
    s = score(pred, actual=pred["loss"] * 1.01)
    assert s["error_pct"] == pytest.approx(100 * (1 / 1.01 - 1), rel=1e-9)
    assert s["inside_interval"] == (low <= pred["loss"] * 1.01 <= high)


def test_a_failed_delphi_fit_is_recorded_and_skip_unbracketed_drops_the_budget() -> None:
    # the largest budget's runs all on one side of its optimum: no bracketed minimum there
    bad = _runs(low_side=BUDGETS[-1])
    fit = _quick(bad)
    assert (
        "do not bracket a minimum" in fit["delphi"]["error"]
        and f"{BUDGETS[-1]:.4g}" in fit["delphi"]["error"]
    )
    with pytest.raises(ValueError, match="the Delphi forecast needs the Delphi fit, which failed"):
        predict(fit, "delphi", 1.0, 1.0, flops=1e18)
    kept = _quick(bad, delphi_skip_unbracketed=True)
    assert [d["budget"] for d in kept["delphi"]["dropped"]] == [BUDGETS[-1]]
    assert kept["delphi"]["law"] == pytest.approx(TRUE, rel=1e-4)  # four exact budgets still pin it


def test_the_forecast_step_registers_the_delphi_prediction(tmp_path) -> None:
    fit = _quick(_runs(noise=0.002, seed=1))
    (tmp_path / "fit").mkdir()
    (tmp_path / "fit" / "fit.json").write_text(json.dumps(fit))
    recipe = HorizonRecipe(family=HorizonFamily(vocab_size=256, min_width=32, max_width=128))
    budget = 3e14
    out = tmp_path / "forecast"
    out.mkdir()
    result = _run_forecast(
        ForecastConfig(
            fit=str(tmp_path / "fit"), budget=budget, recipe=recipe, method="delphi", check_recipe=False
        ),
        str(out),
    )
    record = json.loads((out / "forecast.json").read_text())
    law = fit["delphi"]["law"]
    flops = record["target"]["flops"]
    assert record["method"] == "delphi" and record["fit"]["law"] == law
    assert record["loss"] == pytest.approx(law["E"] + law["A"] * flops ** -law["alpha"], rel=1e-12)
    # The target is the family member closest to the Delphi fit's N*(C)
    n_opt = fit["delphi"]["params_law"]["coefficient"] * budget ** fit["delphi"]["params_law"]["exponent"]
    cands = recipe.candidates(budget)
    assert record["target"]["width"] == min(cands, key=lambda r: abs(math.log(r.params / n_opt))).width
    assert result["interval"][0] < result["loss"] < result["interval"][1]
    assert (out / "forecast.png").exists()
    # the spread the optima's noise leaves, from their standard errors in fit.json, in the record and the result
    optima = fit["delphi"]["optima"]
    expected = optima_noise(
        [o["budget"] for o in optima], [o["loss"] for o in optima], [o["loss_se"] for o in optima], flops
    )
    assert record["optima_noise"] == expected
    assert result["optima_noise_sd_pct"] == round(expected["sd_pct"], 3) and expected["sd_pct"] > 0


def test_repeated_seeds_per_point_give_the_vertex_of_their_mean_losses() -> None:
    """A sweep with seeds (isoflop_sweep(seeds=...)) gives each budget's parabola several runs at each token
    count; their least-squares vertex must be the vertex of the per-point mean losses (numpy's polyfit in ln D)."""
    from schooner.train.scaling import fit_delphi

    base = _runs()
    rng = np.random.default_rng(7)
    noisy = []
    for r in base:  # three seeds a point, each with its own noise
        for s, eps in enumerate(0.03 * rng.standard_normal(3)):
            noisy.append(ScalingRun(budget=r.budget, params=r.params, tokens=r.tokens, loss=r.loss + eps,
                                    name=f"{r.name}-s{s}"))  # fmt: skip
    fit = fit_delphi(noisy, samples=20)
    for opt in fit.optima:
        runs = [r for r in noisy if r.budget == opt.budget]
        tokens = sorted({r.tokens for r in runs})
        means = [np.mean([r.loss for r in runs if r.tokens == t]) for t in tokens]
        c2, c1, c0 = np.polyfit(np.log(tokens), means, 2)
        u = -c1 / (2 * c2)
        assert opt.tokens == pytest.approx(math.exp(u), rel=1e-9)
        assert opt.loss == pytest.approx(c2 * u * u + c1 * u + c0, rel=1e-9)


def test_the_forecast_step_reports_the_optima_noise_or_why_it_has_none() -> None:
    """The Delphi step's forecast carries the same optima_noise as `DelphiFit.forecast`; without it (a budget of
    three runs, a fit from before the standard errors) both say why instead of a bare None."""
    from schooner.train.scaling import fit_delphi

    runs = _runs(noise=0.003, seed=3)
    fit = _quick(runs)
    c = 30 * BUDGETS[-1]
    pred = predict(fit, "delphi", params=1.0, tokens=1.0, flops=c, level=0.8)
    mine = fit_delphi(runs, samples=25, level=0.8).forecast(c)
    assert pred["optima_noise"] == mine["optima_noise"] and pred["optima_noise"]["sd"] > 0
    assert "optima_noise_error" not in pred and "optima_noise_error" not in mine

    old = json.loads(json.dumps(fit))
    for o in old["delphi"]["optima"]:
        del o["loss_se"]  # fit.json before scaling-fit-v7
    pred = predict(old, "delphi", params=1.0, tokens=1.0, flops=c)
    rebuilt = delphi_from_dict(old["delphi"]).forecast(c)  # loss_se None on optima of five runs
    for out in (pred, rebuilt):
        assert out["optima_noise"] is None
        assert "scaling-fit-v7" in out["optima_noise_error"] and "rerun the fit" in out["optima_noise_error"]

    three = [r for r in runs if not (r.budget == BUDGETS[1] and r.name.endswith(("-0", "-4")))]
    for out in (
        fit_delphi(three, samples=25).forecast(c),
        predict(_quick(three), "delphi", 1.0, 1.0, flops=c),
    ):
        assert out["optima_noise"] is None
        assert "budget 3e+12 has 3 runs" in out["optima_noise_error"], out["optima_noise_error"]
