"""Approach 2, approach 3 and variable projection on runs drawn from Chinchilla's published law.

Expected values: the published parameters (E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28), the exponents
a = beta/(alpha+beta) and b = alpha/(alpha+beta), and the optimum N*(C) found by scipy along the isoFLOP curve.

Tolerances under noise are derived, not tuned: with multiplicative noise of size sigma, the least-squares
estimate on log loss has covariance sigma^2 (J'J)^-1, J the Jacobian of ln L in (E, ln A, ln B, alpha, beta)
at the true law (computed here with numpy from the formula). Variable projection minimises relative errors,
which is least squares on log loss to first order. Approach 3's Huber loss with delta far below sigma is a
median regression, whose variance is pi/2 times that of least squares under Gaussian noise. Each parameter
must land within 4 standard errors (a two-sided 6e-5 chance per parameter if the linearisation holds).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import nnls

from schooner.train.scaling import (
    CHINCHILLA,
    Approach3Config,
    VarProConfig,
    bootstrap,
    fit_approach2,
    fit_approach3,
    fit_varpro,
    huber,
    synthetic_runs,
)
from schooner.train.scaling._varpro import _grid_nnls

BUDGETS = [1e18, 1e19, 1e20, 1e21, 1e22]
NOISE = 0.005
TRUE = {"E": 1.69, "lnA": math.log(406.4), "lnB": math.log(410.7), "alpha": 0.34, "beta": 0.28}


def _standard_errors(runs, sigma: float) -> dict[str, float]:
    """sigma sqrt(diag((J'J)^-1)) for least squares on ln L, J from the published law's formula."""
    e, a, b, al, be = 1.69, 406.4, 410.7, 0.34, 0.28
    n = np.array([r.params for r in runs])
    d = np.array([r.tokens for r in runs])
    na, db = a * n**-al, b * d**-be
    loss = e + na + db
    jac = np.stack([1 / loss, na / loss, db / loss, -na * np.log(n) / loss, -db * np.log(d) / loss], axis=1)
    se = sigma * np.sqrt(np.diag(np.linalg.inv(jac.T @ jac)))
    return dict(zip(TRUE, se, strict=True))


def _estimates(law) -> dict[str, float]:
    return {"E": law.E, "lnA": math.log(law.A), "lnB": math.log(law.B), "alpha": law.alpha, "beta": law.beta}


def _optimum(c: float) -> float:
    from scipy.optimize import minimize_scalar

    law = CHINCHILLA
    f = lambda u: law.A * math.exp(-law.alpha * u) + law.B * (c / (6 * math.exp(u))) ** -law.beta  # noqa: E731
    return math.exp(minimize_scalar(f, bounds=(0.0, 60.0), method="bounded", options={"xatol": 1e-10}).x)


def test_noise_free_runs_give_back_the_published_law() -> None:
    runs = synthetic_runs(CHINCHILLA, BUDGETS, sizes_per_budget=9, span=8.0)
    for fit in (fit_varpro(runs), fit_approach3(runs)):
        got = _estimates(fit.law)
        for k, v in TRUE.items():
            assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-6), (fit.method, k)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_varpro_recovers_the_law_within_four_standard_errors(seed: int) -> None:
    runs = synthetic_runs(CHINCHILLA, BUDGETS, sizes_per_budget=9, span=8.0, noise=NOISE, seed=seed)
    se = _standard_errors(runs, NOISE)
    got = _estimates(fit_varpro(runs).law)
    for k, v in TRUE.items():
        assert abs(got[k] - v) <= 4 * se[k], (k, got[k], v, se[k])


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_approach3_recovers_the_law_within_four_median_regression_standard_errors(seed: int) -> None:
    runs = synthetic_runs(CHINCHILLA, BUDGETS, sizes_per_budget=9, span=8.0, noise=NOISE, seed=seed)
    se = _standard_errors(runs, NOISE)
    got = _estimates(fit_approach3(runs).law)
    for k, v in TRUE.items():
        assert abs(got[k] - v) <= 4 * math.sqrt(math.pi / 2) * se[k], (k, got[k], v, se[k])


def test_bootstrap_spread_matches_the_sampling_spread_from_the_noise() -> None:
    runs = synthetic_runs(CHINCHILLA, BUDGETS, sizes_per_budget=9, span=8.0, noise=NOISE, seed=11)
    reps, failed = bootstrap(runs, fit_varpro, samples=60, seed=0)
    spread = float(np.std([f.law.alpha for f in reps], ddof=1))
    se_alpha = _standard_errors(runs, NOISE)["alpha"]
    assert failed == 0
    # 60 replicates estimate a standard deviation to about 9%; the factor 2 also allows for the bootstrap's
    # small-sample bias (45 runs, 5 parameters).
    assert se_alpha / 2 < spread < se_alpha * 2


def test_approach3_is_robust_to_an_outlying_run_where_least_squares_is_not() -> None:
    runs = synthetic_runs(CHINCHILLA, BUDGETS, sizes_per_budget=9, span=8.0)
    bad = runs[20]
    runs[20] = type(bad)(**{**bad.to_dict(), "loss": bad.loss * 1.3})  # one diverged run, 30% high
    a3, vp = fit_approach3(runs).law, fit_varpro(runs).law
    assert a3.alpha == pytest.approx(0.34, abs=1e-3) and a3.beta == pytest.approx(0.28, abs=1e-3)
    assert abs(vp.alpha - 0.34) + abs(vp.beta - 0.28) > 1e-2  # least squares is pulled by the outlier


def test_grid_nnls_matches_scipy_nnls() -> None:
    rng = np.random.default_rng(0)
    runs = synthetic_runs(CHINCHILLA, BUDGETS[:3], sizes_per_budget=5, span=30.0, noise=0.05, seed=1)
    n = np.array([r.params for r in runs]) / 1e8
    d = np.array([r.tokens for r in runs]) / 1e9
    loss = np.array([r.loss for r in runs])
    alphas, betas = rng.uniform(0.02, 2.0, 7), rng.uniform(0.02, 2.0, 6)
    rss, coef = _grid_nnls(alphas, betas, n, d, loss)
    for i, al in enumerate(alphas):
        for j, be in enumerate(betas):
            x = np.stack([np.ones_like(n), n**-al, d**-be], axis=1) / loss[:, None]
            ref, rnorm = nnls(x, np.ones_like(loss))
            assert rss[i, j] == pytest.approx(rnorm**2, rel=1e-7, abs=1e-12)
            np.testing.assert_allclose(coef[i, j], ref, rtol=1e-5, atol=1e-9)


def test_huber_is_quadratic_inside_and_linear_outside() -> None:
    r = np.array([-3e-3, -1e-3, 0.0, 5e-4, 2e-3])
    expected = [1e-3 * (3e-3 - 5e-4), 0.5e-6, 0.0, 0.5 * 25e-8, 1e-3 * (2e-3 - 5e-4)]
    np.testing.assert_allclose(huber(r, 1e-3), expected, rtol=1e-12)


# -- approach 2 ----------------------------------------------------------------------------------------


def test_approach2_exponents_are_exact_on_centred_grids_of_any_width() -> None:
    # Along an isoFLOP curve the law's shape around its optimum is the same at every budget up to a
    # factor, so a centred grid shifts every vertex by the same factor: the exponents stay unbiased.
    for span in (2.0, 8.0, 100.0):
        fit = fit_approach2(synthetic_runs(CHINCHILLA, BUDGETS, sizes_per_budget=9, span=span))
        assert fit.a == pytest.approx(0.28 / 0.62, abs=1e-9)
        assert fit.b == pytest.approx(0.34 / 0.62, abs=1e-9)


def test_approach2_optimum_is_biased_on_wide_grids_while_the_parametric_fits_are_not() -> None:
    errors = []
    for span in (1.5, 4.0, 16.0, 100.0):
        runs = synthetic_runs(CHINCHILLA, BUDGETS, sizes_per_budget=9, span=span)
        c = BUDGETS[-1]
        errors.append(fit_approach2(runs).params_law(c) / _optimum(c) - 1)
        assert fit_varpro(runs).law.optimal_allocation(c)[0] == pytest.approx(_optimum(c), rel=1e-5)
    assert abs(errors[0]) < 2e-3  # a narrow grid: the parabola is a good Taylor approximation
    assert all(abs(b) > abs(a) for a, b in zip(errors, errors[1:], strict=False))  # the bias grows with width
    assert errors[-1] > 0.05  # +-100x: N* overestimated by more than 5%


def test_approach2_exponents_are_biased_when_the_grid_drifts_off_the_optimum() -> None:
    # Grids centred ever further below the optimum as compute grows (0 at the first budget, /4 at the last),
    # as when a prior tokens-per-parameter is wrong.
    centre = [4.0 ** (-i / (len(BUDGETS) - 1)) for i in range(len(BUDGETS))]
    runs = synthetic_runs(CHINCHILLA, BUDGETS, sizes_per_budget=5, span=4.0, centre=centre)
    a2 = fit_approach2(runs)
    assert abs(a2.a - 0.28 / 0.62) > 0.005
    law = fit_varpro(runs).law
    assert law.a == pytest.approx(0.28 / 0.62, abs=1e-6)


def test_approach2_names_the_budget_that_cannot_be_fitted() -> None:
    runs = synthetic_runs(CHINCHILLA, BUDGETS[:2], sizes_per_budget=5, span=4.0)
    with pytest.raises(ValueError, match="distinct N"):
        fit_approach2(runs[:7])
    below = synthetic_runs(CHINCHILLA, BUDGETS[:2], sizes_per_budget=5, span=1.5, centre=[1.0, 40.0])
    with pytest.raises(ValueError, match="opens downwards|bracket"):
        # far off-centre, a noisy curve can bend the wrong way: force it with a flipped budget
        fit_approach2([*below[:5], *[type(r)(**{**r.to_dict(), "loss": 10 - r.loss}) for r in below[5:]]])


def test_configs_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="delta"):
        Approach3Config(delta=0.0)
    with pytest.raises(ValueError, match="low < high"):
        VarProConfig(low=1.0, high=0.5)


@pytest.mark.slow
def test_screened_starts_find_the_optimum_of_the_full_hoffmann_grid() -> None:
    runs = synthetic_runs(CHINCHILLA, BUDGETS, sizes_per_budget=9, span=8.0, noise=NOISE, seed=7)
    screened = fit_approach3(runs)
    full = fit_approach3(runs, Approach3Config(top_k=None))
    assert full.starts == 4500
    assert screened.objective == pytest.approx(full.objective, rel=1e-6)
    assert screened.law.alpha == pytest.approx(full.law.alpha, abs=1e-5)


@pytest.mark.parametrize(
    ("centre", "side", "fix"), [(30.0, "below", "smaller"), (1 / 30.0, "above", "larger")]
)
def test_approach2_refuses_a_budget_whose_runs_all_lie_on_one_side_of_the_optimum(
    centre: float, side: str, fix: str
) -> None:
    # A grid centred 30x off the optimum at the last budget: the loss rises (or falls) across the whole group,
    # and a convex parabola through it puts its vertex outside the sampled sizes (an extrapolation).
    runs = synthetic_runs(CHINCHILLA, BUDGETS[:3], sizes_per_budget=5, span=4.0, centre=[1.0, 1.0, centre])
    last = [r for r in runs if r.budget == BUDGETS[2]]
    losses = [r.loss for r in sorted(last, key=lambda r: r.params)]
    assert losses == sorted(losses, reverse=side == "above")  # monotone: no run brackets the minimum
    with pytest.raises(ValueError, match=rf"budget {re.escape(f'{BUDGETS[2]:.3g}')}.*{side}.*{fix}") as info:
        fit_approach2(runs)
    assert f"{min(r.params for r in last):.3g}" in str(info.value)  # the sampled range is named


def test_fit_runs_records_an_unbracketed_budget_as_approach2_s_error() -> None:
    from schooner.train.scaling._fit import fit_runs

    runs = synthetic_runs(CHINCHILLA, BUDGETS[:3], sizes_per_budget=5, span=4.0, centre=[1.0, 1.0, 30.0])
    fit = fit_runs(runs, samples=3)
    assert "bracket" in fit["approach2"]["error"] and f"{BUDGETS[2]:.3g}" in fit["approach2"]["error"]
    assert fit["varpro"]["law"]["alpha"] > 0


# -- what the parametric fits refuse and flag ----------------------------------------------------------

# Nine real runs (a 3x3 isoFLOP sweep on the test corpus, vocab 320, seq_len 32): the loss falls with D at
# every budget and barely depends on N, so variable projection drives alpha to the grid's low bound with A = 0.
MEASURED = [
    (2e9, 8496, 35072, 4.180659123718798), (2e9, 23648, 13056, 4.433254943796448),
    (2e9, 43152, 7168, 4.440278869138319), (4e9, 8496, 70400, 3.513412379807576),
    (4e9, 23648, 26112, 4.34461608814964), (4e9, 43152, 14592, 4.363014976465429),
    (8e9, 8496, 140800, 3.243429733579191), (8e9, 23648, 51968, 4.020044590978777),
    (8e9, 43152, 28928, 4.3842200358102845),
]  # fmt: skip


def test_parametric_fits_refuse_a_single_budget_or_fewer_runs_than_parameters() -> None:
    from schooner.train.scaling import fit_runs

    one = synthetic_runs(CHINCHILLA, [1e19], sizes_per_budget=9, span=8.0, noise=0.005, seed=1)
    four = synthetic_runs(CHINCHILLA, BUDGETS[:2], sizes_per_budget=2, span=3.0)
    for fit in (fit_varpro, lambda rs: fit_approach3(rs, Approach3Config(top_k=4))):
        with pytest.raises(ValueError, match=r"2 or more budgets.*got 1 \(1e\+19\)"):
            fit(one)
        with pytest.raises(ValueError, match=r"at least 5 runs.*got 4"):
            fit(four)
    fit = fit_runs(one, samples=2, approach3=Approach3Config(top_k=4))
    for method in ("varpro", "approach3"):
        assert "2 or more budgets" in fit[method]["error"]


def test_a_vanished_term_and_an_exponent_at_the_grid_bound_are_flagged() -> None:
    from schooner.train.scaling import ScalingLaw, ScalingRun, fit_runs
    from schooner.train.scaling._fit import fit_summary

    runs = [ScalingRun(budget=c, params=n, tokens=d, loss=loss) for c, n, d, loss in MEASURED]
    vp = fit_varpro(runs)
    assert vp.law.A == 0.0 and vp.law.alpha == pytest.approx(VarProConfig().low, rel=1e-6)
    assert vp.extra["on_grid_edge"] is True and vp.extra["degenerate"] == ["A"]
    # A law with no data term, fitted from runs drawn from it: B vanishes, the model term does not.
    law = ScalingLaw(E=2.0, A=400.0, B=0.0, alpha=0.34, beta=0.28)
    drawn = synthetic_runs(CHINCHILLA, BUDGETS[:3])
    no_data = [ScalingRun(budget=r.budget, params=r.params, tokens=r.tokens, loss=float(law.loss(r.params, r.tokens)))
               for r in drawn]  # fmt: skip
    assert fit_varpro(no_data).extra["degenerate"] == ["B"]
    assert fit_varpro(synthetic_runs(CHINCHILLA, BUDGETS, span=4.0)).extra == {
        "on_grid_edge": False, "degenerate": []
    }  # fmt: skip
    summary = fit_summary(
        fit_runs(runs, samples=2, approach3=Approach3Config(alpha=(0.5,), beta=(0.5,), top_k=4))
    )
    assert summary["varpro.on_grid_edge"] is True and summary["varpro.degenerate"] == ["A"]


# Nine more real runs (the review's second sweep: widths 16, 32, 48): approach 3's optimum is alpha = 3.86 with
# A = 9.6e12, a term worth 5% of the loss at the smallest model and 0.02% at the largest, from every grid tried.
MEASURED_STEEP = [
    (2e9, 3608, 81408, 3.761484029635239), (2e9, 8496, 35072, 4.0472048843227),
    (2e9, 14664, 20736, 4.412064253181506), (4e9, 3608, 162816, 3.4233195224897255),
    (4e9, 8496, 70400, 3.7530594262612116), (4e9, 14664, 41216, 4.079490053902646),
    (8e9, 3608, 325632, 3.357379473650499), (8e9, 8496, 140800, 3.3057423801030157),
    (8e9, 14664, 82688, 3.57436311416449),
]  # fmt: skip


def test_an_exponent_far_beyond_approach3_s_grid_of_starts_is_flagged_runaway() -> None:
    from schooner.train.scaling import ScalingLaw, ScalingRun, fit_runs
    from schooner.train.scaling._fit import fit_summary

    coarse = Approach3Config(
        alpha=(0.2, 0.6), beta=(0.2, 0.6), e=(0.0, 1.0), a=(2.0, 8.0), b=(2.0, 8.0), top_k=4
    )
    # The stated rule: beyond 1.5 x max(1, the grid's largest start) (3.0 for Hoffmann's grid, 1.5 here).
    law = lambda alpha, beta: ScalingLaw(E=2.0, A=400.0, B=400.0, alpha=alpha, beta=beta)  # noqa: E731
    assert Approach3Config().runaway_exponents(law(2.9, 3.1)) == ["beta"]
    assert coarse.runaway_exponents(law(1.6, 1.4)) == ["alpha"]
    assert Approach3Config(runaway=2.5).runaway_exponents(law(3.86, 0.4)) == []
    with pytest.raises(ValueError, match="runaway must be >= 1; got runaway=0.5"):
        Approach3Config(runaway=0.5)

    runs = [ScalingRun(budget=c, params=n, tokens=d, loss=loss) for c, n, d, loss in MEASURED_STEEP]
    steep = fit_approach3(runs, coarse)
    assert steep.law.alpha > 3.0 and steep.law.A > 1e12
    assert steep.extra["runaway"] == ["alpha"]
    assert steep.extra["degenerate"] == []  # the term has not vanished: `degenerate` alone missed this fit
    assert fit_approach3(synthetic_runs(CHINCHILLA, BUDGETS[:3]), coarse).extra["runaway"] == []
    fit = fit_runs(runs, samples=2, approach3=coarse, varpro=VarProConfig(points=20))
    assert fit["approach3"]["runaway"] == ["alpha"] and fit_summary(fit)["approach3.runaway"] == ["alpha"]


def test_approach2_groups_budgets_equal_within_a_relative_tolerance() -> None:
    from schooner.train.scaling import ScalingRun, resample_runs

    base = synthetic_runs(CHINCHILLA, BUDGETS[:3], sizes_per_budget=5, span=4.0)
    jittered = [
        ScalingRun(budget=r.budget * (1 + 1e-12 * i), params=r.params, tokens=r.tokens, loss=r.loss)
        for i, r in enumerate(base)
    ]
    assert fit_approach2(jittered).a == pytest.approx(fit_approach2(base).a, rel=1e-9)
    drawn = resample_runs(jittered, np.random.default_rng(0))
    for budget in BUDGETS[:3]:
        assert sum(abs(r.budget / budget - 1) < 1e-9 for r in drawn) == 5
