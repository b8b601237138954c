"""Bootstrap over runs: resampling within budgets, percentile intervals, failures, `fit_runs` (the spread
against the noise is checked in test_scaling_fits.py)."""

from __future__ import annotations

import numpy as np
import pytest

from schooner.train.scaling import (
    CHINCHILLA,
    Approach3Config,
    Interval,
    VarProConfig,
    bootstrap,
    fit_runs,
    percentile_interval,
    resample_runs,
    synthetic_runs,
)

BUDGETS = [1e18, 1e19, 1e20, 1e21, 1e22]
# A coarse grid of approach-3 starts (72 instead of Hoffmann's 4,500, whose screening alone takes seconds).
COARSE = {
    "alpha": (0.0, 0.5, 1.0),
    "beta": (0.0, 0.5, 1.0),
    "e": (0.0, 0.5),
    "a": (5.0, 10.0),
    "b": (5.0, 10.0),
}


def test_percentile_interval_is_numpys_percentiles() -> None:
    values = np.random.default_rng(0).normal(size=1001)
    iv = percentile_interval(values, 0.8)
    assert (iv.low, iv.high) == pytest.approx(tuple(np.percentile(values, [10, 90])))
    assert 0.0 in iv and 5.0 not in iv
    with pytest.raises(ValueError, match="every replicate failed"):
        percentile_interval([float("nan")])
    with pytest.raises(ValueError, match="level"):
        Interval(0.0, 1.0, level=1.0)


def test_resampling_keeps_every_budget_and_its_size() -> None:
    runs = synthetic_runs(CHINCHILLA, BUDGETS[:3], sizes_per_budget=5)
    sample = resample_runs(runs, np.random.default_rng(1))
    for budget in BUDGETS[:3]:
        drawn = [r for r in sample if r.budget == budget]
        assert len(drawn) == 5
        assert all(r in runs and r.budget == budget for r in drawn)


def test_failed_replicates_are_counted_and_other_errors_propagate() -> None:
    runs = synthetic_runs(CHINCHILLA, BUDGETS[:2], sizes_per_budget=3)
    calls = iter(range(10))

    def flaky(rs):
        if next(calls) % 2:
            raise ValueError("degenerate")
        return len(rs)

    results, failed = bootstrap(runs, flaky, samples=10, seed=0)
    assert (len(results), failed) == (5, 5)
    with pytest.raises(ZeroDivisionError):
        bootstrap(runs, lambda rs: 1 / 0, samples=2)


def test_fit_runs_reports_every_method_with_intervals_around_the_estimate() -> None:
    # 7 sizes per budget: a resample keeps 3 distinct sizes in all 4 budgets with probability 0.99, so the
    # 24 replicates give each method the 20 an interval needs.
    runs = synthetic_runs(CHINCHILLA, BUDGETS[:4], sizes_per_budget=7, span=4.0, noise=0.003, seed=2)
    fit = fit_runs(
        runs,
        samples=24,
        level=0.9,
        approach3=Approach3Config(**COARSE, top_k=4),
        varpro=VarProConfig(points=40),
    )
    assert set(fit) >= {"runs", "approach2", "approach3", "varpro"}
    assert len(fit["varpro"]["replicates"]) + fit["varpro"]["failed"] == 24
    for method in ("approach3", "varpro"):
        iv = fit[method]["intervals"]["alpha"]
        assert iv["low"] <= iv["high"] and iv["level"] == 0.9
        assert len(fit[method]["log_residuals"]) == len(runs)
    assert fit["approach2"]["intervals"]["a"]["low"] <= fit["approach2"]["a"] + 0.05


def test_fit_runs_keeps_the_parametric_fits_when_approach2_fails() -> None:
    runs = synthetic_runs(CHINCHILLA, BUDGETS[:3], sizes_per_budget=2, span=4.0)  # 2 sizes: no parabola
    fit = fit_runs(runs, samples=3)
    assert "distinct N" in fit["approach2"]["error"]
    assert fit["varpro"]["law"]["alpha"] > 0


def test_fit_runs_keeps_the_other_fits_when_approach3_fails(tmp_path) -> None:
    # Loss that grows with N (A N^+0.2): approach 3 converges to alpha < 0 and reports it; variable projection
    # (non-negative A, alpha on its grid) still fits, approach 2 reports that no budget brackets its minimum
    # (the loss rises across every group), and a forecast by approach 3 is refused.
    from schooner.train.scaling import ScalingRun, predict

    base = synthetic_runs(CHINCHILLA, BUDGETS[:3], sizes_per_budget=5, span=4.0)
    runs = [
        ScalingRun(budget=r.budget, params=r.params, tokens=r.tokens, flops=r.flops,
                   loss=2.0 + 0.01 * r.params**0.2 + 400.0 * r.tokens**-0.28)
        for r in base
    ]  # fmt: skip
    fit = fit_runs(runs, samples=3)
    assert "negative exponent" in fit["approach3"]["error"]
    assert fit["varpro"]["law"]["A"] == 0.0 and "lies below the sampled range" in fit["approach2"]["error"]
    with pytest.raises(ValueError, match="approach3 fit failed.*negative exponent"):
        predict(fit, "approach3", 1e9, 2e10, 1.2e20)
    assert predict(fit, "varpro", 1e9, 2e10, 1.2e20)["loss"] > 2.0
    # The plots skip what failed: no frontier without approach 2's vertices.
    from schooner.train.scaling._fit import write_plots

    write_plots(fit, str(tmp_path))
    assert {p.name for p in tmp_path.iterdir()} == {
        "isoflops.png", "fit_vs_observed.png", "residuals.png"
    }  # fmt: skip
    # A law without a model term (A = 0) has no optimum on the frontier: the plot skips it.
    from schooner.train.scaling import fit_approach2
    from schooner.train.scaling._fit import fitted_law
    from schooner.train.scaling._plots import plot_frontier

    plot_frontier(
        fit_approach2(base), str(tmp_path / "frontier.png"), laws={"varpro": fitted_law(fit, "varpro")}
    )
    assert (tmp_path / "frontier.png").stat().st_size > 0


def test_approach2_refuses_a_nearly_flat_parabola() -> None:
    from schooner.train.scaling import ScalingRun, fit_approach2

    runs = [
        ScalingRun(budget=c, params=n, tokens=c / (6 * n), loss=3.0 + 1e-6 * (np.log(n) - 800.0) ** 2)
        for c in (1e18, 1e19)
        for n in np.geomspace(1e6, 1e8, 5)
    ]
    with pytest.raises(ValueError, match="nearly flat"):
        fit_approach2(runs)


def test_too_few_successful_replicates_give_no_interval_and_the_summary_says_so() -> None:
    from schooner.train.scaling import ScalingLaw
    from schooner.train.scaling._bootstrap import MIN_REPLICATES, replicates_shortfall
    from schooner.train.scaling._fit import fit_summary

    assert replicates_shortfall(100, 200) is None and replicates_shortfall(20, 24) is None
    assert "99 of 200" in replicates_shortfall(99, 200) and "(100 here)" in replicates_shortfall(99, 200)
    assert f"at least {MIN_REPLICATES}" in replicates_shortfall(19, 19)
    # 3 sizes per budget: a resample keeps 3 distinct sizes with probability 6/27, so approach 2's replicates
    # almost all fail (all three budgets must keep theirs).
    law = ScalingLaw(E=2.1, A=900.0, B=3000.0, alpha=0.45, beta=0.30)
    runs = synthetic_runs(law, [1e17, 1e18, 1e19], sizes_per_budget=3, span=3.0, noise=0.01, seed=0)
    cheap = {
        "approach3": Approach3Config(**COARSE, top_k=1, max_iterations=50),
        "varpro": VarProConfig(points=10, refine=False),
    }
    fit = fit_runs(runs, samples=40, **cheap)
    a2 = fit["approach2"]
    assert len(a2["replicates"]) + a2["failed"] == 40 and len(a2["replicates"]) < 20
    assert "intervals" not in a2 and f"{a2['failed']} failed" in a2["intervals_error"]
    summary = fit_summary(fit)
    assert summary["approach2.failed"] == f"{a2['failed']} of 40"
    assert summary["approach2.intervals_error"] == a2["intervals_error"]
    assert not any(k.startswith("approach2.") and k.endswith("_interval") for k in summary)
    assert summary["varpro.failed"] == f"{fit['varpro']['failed']} of 40"
