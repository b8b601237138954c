"""The Chinchilla law, its compute-optimal allocation and the synthetic isoFLOP runs drawn from it.

Expected values come from the published law (Hoffmann et al. 2022, eq. 10) and from scipy's scalar
minimiser along the isoFLOP curve, never from the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from schooner.train.scaling import CHINCHILLA, ScalingLaw, ScalingRun, synthetic_runs


def _numeric_optimum(law: ScalingLaw, c: float) -> float:
    """N minimising E + A N^-alpha + B (C / 6N)^-beta, found numerically in log N."""
    f = lambda u: law.E + law.A * math.exp(-law.alpha * u) + law.B * (c / (6 * math.exp(u))) ** -law.beta  # noqa: E731
    return math.exp(minimize_scalar(f, bounds=(0.0, 60.0), method="bounded", options={"xatol": 1e-10}).x)


@pytest.mark.parametrize("compute", [1e18, 5.76e23, 1e26])
def test_optimal_allocation_matches_a_numeric_minimum(compute: float) -> None:
    n_opt, d_opt = CHINCHILLA.optimal_allocation(compute)
    assert n_opt == pytest.approx(_numeric_optimum(CHINCHILLA, compute), rel=1e-6)
    assert 6 * n_opt * d_opt == pytest.approx(compute, rel=1e-12)


def test_exponents_are_the_published_ones() -> None:
    # Hoffmann et al. 2022, eq. 4: a = beta / (alpha + beta), b = alpha / (alpha + beta).
    assert CHINCHILLA.a == pytest.approx(0.28 / 0.62)
    assert CHINCHILLA.b == pytest.approx(0.34 / 0.62)
    assert CHINCHILLA.loss(70e9, 1.4e12) == pytest.approx(1.69 + 406.4 / 70e9**0.34 + 410.7 / 1.4e12**0.28)


def test_synthetic_runs_lie_on_isoflop_curves_around_the_optimum() -> None:
    runs = synthetic_runs(CHINCHILLA, [1e19, 1e21], sizes_per_budget=5, span=4.0, centre=[1.0, 2.0])
    assert len(runs) == 10
    for r in runs:
        assert 6 * r.params * r.tokens == pytest.approx(r.budget, rel=1e-12)
        assert r.loss == pytest.approx(float(CHINCHILLA.loss(r.params, r.tokens)), rel=1e-12)
    first = [r.params for r in runs if r.budget == 1e19]
    second = [r.params for r in runs if r.budget == 1e21]
    assert first[2] == pytest.approx(_numeric_optimum(CHINCHILLA, 1e19), rel=1e-6)  # the middle of the grid
    assert second[2] == pytest.approx(
        2.0 * _numeric_optimum(CHINCHILLA, 1e21), rel=1e-6
    )  # shifted by `centre`
    assert first[-1] / first[0] == pytest.approx(16.0)  # span 4 on each side


def test_synthetic_noise_is_multiplicative_with_the_stated_size() -> None:
    runs = synthetic_runs(CHINCHILLA, [1e20] * 400, sizes_per_budget=5, noise=0.01, seed=3)
    log_ratio = np.log([r.loss / float(CHINCHILLA.loss(r.params, r.tokens)) for r in runs])
    # 2000 draws: the sample sd of N(0, 0.01) is within 5% of 0.01 with overwhelming probability.
    assert np.std(log_ratio) == pytest.approx(0.01, rel=0.05)
    assert abs(np.mean(log_ratio)) < 4 * 0.01 / math.sqrt(log_ratio.size)


def test_invalid_values_name_the_field() -> None:
    with pytest.raises(ValueError, match="alpha"):
        ScalingLaw(E=1.0, A=1.0, B=1.0, alpha=-0.1, beta=0.3)
    with pytest.raises(ValueError, match="loss"):
        ScalingRun(budget=1e12, params=1e5, tokens=1e6, loss=float("nan"))
    with pytest.raises(ValueError, match="one value per budget"):
        synthetic_runs(CHINCHILLA, [1e18, 1e19], centre=[1.0])


def test_run_round_trips_through_a_dict() -> None:
    run = ScalingRun(budget=1e12, params=1e5, tokens=1.6e6, loss=3.2, flops=1.01e12, name="x", bpb=1.1)
    assert ScalingRun.from_dict({**run.to_dict(), "width": 64}) == run
    assert run.compute == 1.01e12
