"""The backtest: each method, fitted on every budget but the largest, predicts the largest budget's best run.

Expected values come from the law that drew the runs (Chinchilla's published one), not from the fits: the
parametric fits can express it, so they backtest to the run itself; approach 2's frontier is a pure power law
in C, which cannot follow the law's bend towards its floor E, so it must undershoot.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from schooner.train.scaling import CHINCHILLA, Approach3Config, backtest, fit_runs, synthetic_runs
from schooner.train.scaling._bootstrap import MIN_REPLICATES, replicates_shortfall
from schooner.train.scaling._forecast import ForecastConfig, _run_forecast, predict

BUDGETS = [1e18, 1e19, 1e20, 1e21]
FAST = Approach3Config(top_k=8)


def _runs():
    return synthetic_runs(CHINCHILLA, BUDGETS, sizes_per_budget=7, span=8.0)


def _best(runs, budget):
    return min((r for r in runs if r.budget == budget), key=lambda r: r.loss)


def test_fits_that_can_express_the_law_backtest_to_the_held_out_run_and_the_frontier_undershoots() -> None:
    runs = _runs()
    bt = backtest(runs, approach3=FAST)
    assert bt["held_out_budget"] == 1e21 and bt["fitted_budgets"] == BUDGETS[:3]
    assert bt["extrapolation"] == pytest.approx(10.0)
    best = _best(runs, 1e21)
    assert bt["held_out_best"]["loss"] == best.loss
    for method in ("varpro", "approach3"):
        assert bt["methods"][method]["predicted"] == pytest.approx(CHINCHILLA.loss(best.params, best.tokens))
        assert abs(bt["methods"][method]["error_pct"]) < 1e-3
    frontier = bt["methods"]["frontier"]
    assert frontier["error_pct"] < -1.0  # a power law through a curve flattening towards E lands below it
    assert frontier["error_pct"] == pytest.approx(100 * (frontier["predicted"] - best.loss) / best.loss)


def test_the_held_out_budget_is_not_seen_by_the_fits() -> None:
    runs = _runs()
    best = _best(runs, 1e21)
    # Every other run of the held-out budget 20% worse, its best run 10% worse: the predictions stay, the
    # errors follow the new best loss.
    changed = [
        dataclasses.replace(r, loss=r.loss * (1.1 if r is best else 1.2)) if r.budget == 1e21 else r
        for r in runs
    ]
    before, after = backtest(runs, approach3=FAST), backtest(changed, approach3=FAST)
    for method in ("varpro", "approach3", "frontier"):
        predicted = after["methods"][method]["predicted"]
        assert predicted == pytest.approx(before["methods"][method]["predicted"], rel=1e-9)
        assert after["methods"][method]["error_pct"] == pytest.approx(
            100 * (predicted / (1.1 * best.loss) - 1)
        )


def test_fewer_than_three_budgets_is_said_and_the_fit_still_runs() -> None:
    runs = [r for r in _runs() if r.budget <= 1e19]
    assert backtest(runs) == {"error": "a backtest needs runs at three or more budgets; got 2"}
    assert fit_runs(runs, samples=2, approach3=FAST)["backtest"]["error"].startswith("a backtest needs")


def test_a_forecast_records_its_methods_backtest_scaled_to_its_reach(tmp_path) -> None:
    fit = fit_runs(_runs(), samples=2, approach3=FAST)
    (tmp_path / "fit").mkdir()
    (tmp_path / "fit" / "fit.json").write_text(json.dumps(fit))
    # 1e23 is 100x the largest budget: twice the backtest's reach of 10x in log compute.
    result = _run_forecast(
        ForecastConfig(fit=str(tmp_path / "fit"), budget=1e23, method="frontier", check_recipe=False),
        str(tmp_path / "f"),
    )
    error = fit["backtest"]["methods"]["frontier"]["error_pct"]
    assert result["backtest_error_pct"] == pytest.approx(error, abs=1e-3)
    assert result["backtest_scaled_error_pct"] == pytest.approx(
        error * math.log(100) / math.log(10), abs=1e-3
    )
    recorded = json.loads((tmp_path / "f" / "forecast.json").read_text())["backtest"]
    assert recorded["held_out_budget"] == 1e21 and recorded["extrapolation"] == pytest.approx(10.0)


def test_a_forecast_from_too_few_bootstrap_refits_has_no_interval_and_says_why() -> None:
    """Found by a review: zero successful refits gave a zero-width interval labelled 90%."""
    fit = fit_runs(_runs(), samples=MIN_REPLICATES, approach3=FAST)
    enough = predict(fit, "varpro", 1e9, 2e10, 1.2e20)
    assert enough["replicates"] == MIN_REPLICATES and enough["interval"]["low"] <= enough["loss"]
    varpro = {**fit["varpro"], "replicates": fit["varpro"]["replicates"][:5], "failed": MIN_REPLICATES - 5}
    few = predict({**fit, "varpro": varpro}, "varpro", 1e9, 2e10, 1.2e20)
    assert few["interval"] is None and few["replicates"] == 5 and few["loss"] == enough["loss"]
    assert (
        "the varpro fit: only 5 of 20 bootstrap replicates could be fitted (15 failed)"
        in few["interval_error"]
    )
    # Enough replicates by count, but fewer than half of the samples: the fit's rule withholds the interval,
    # and so does the forecast (a count-only rule, as the forecast once had, gives one).
    half = predict({**fit, "samples": 2 * MIN_REPLICATES + 2}, "varpro", 1e9, 2e10, 1.2e20)
    assert half["interval"] is None and half["replicates"] == MIN_REPLICATES
    assert f"at least half of the samples ({MIN_REPLICATES + 1} here)" in half["interval_error"]
    assert (
        half["interval_error"]
        == f"the varpro fit: {replicates_shortfall(MIN_REPLICATES, 2 * MIN_REPLICATES + 2)}"
    )


def test_budgets_that_differ_by_float_noise_are_one_group() -> None:
    runs = [dataclasses.replace(r, budget=r.budget * (1 + 1e-9 * i)) for i, r in enumerate(_runs())]
    bt = backtest(runs, approach3=FAST)
    assert len(bt["fitted_budgets"]) == 3 and bt["held_out_budget"] == pytest.approx(1e21)
    assert abs(bt["methods"]["varpro"]["error_pct"]) < 1e-3


def test_a_fit_holding_nan_is_refused_by_name_and_no_forecast_is_written(tmp_path) -> None:
    """A fit file written with Python's NaN token (not JSON: jq and JSON.parse refuse it) was read, and its
    NaN copied into forecast.json; it is refused, naming the file, and nothing is written."""
    fit = fit_runs(_runs(), samples=2, approach3=FAST)
    fit["backtest"]["methods"]["frontier"]["error_pct"] = math.nan
    (tmp_path / "fit").mkdir()
    (tmp_path / "fit" / "fit.json").write_text(json.dumps(fit, indent=1))
    config = ForecastConfig(fit=str(tmp_path / "fit"), budget=1e23, method="frontier", check_recipe=False)
    with pytest.raises(ValueError, match=r"fit\.json: line \d+, column \d+ holds NaN, which is not JSON"):
        _run_forecast(config, str(tmp_path / "f"))
    assert not (tmp_path / "f" / "forecast.json").exists()
