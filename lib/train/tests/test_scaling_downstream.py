"""Downstream forecasts on synthetic data: soft metrics against numpy formulas, the soft-to-hard sigmoid
recovered from a known one, a soft metric that follows a known law in compute forecast by the Delphi fit,
and the over-training penalty read off known parabolas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from schooner.train.scaling import (
    ScalingRun,
    budget_optima,
    fit_delphi,
    fit_soft_to_hard,
    overtraining_penalty,
    soft_metrics,
)


def _documents(rng: np.random.Generator, n: int = 50) -> list[dict]:
    docs = []
    for _ in range(n):
        lp = -rng.uniform(1, 30, size=4)
        docs.append(
            {
                "logprobs": lp.tolist(),
                "gold": int(rng.integers(4)),
                "norm_bytes": rng.integers(5, 60, 4).tolist(),
            }
        )
    return docs


def test_soft_metrics_match_numpy() -> None:
    docs = _documents(np.random.default_rng(0))
    got = soft_metrics(docs)
    lp = np.array([d["logprobs"] for d in docs])
    gold = np.array([d["gold"] for d in docs])
    right = lp[np.arange(len(docs)), gold]
    norm = np.log(np.exp(lp).sum(axis=1))
    nbytes = np.array([d["norm_bytes"][g] for d, g in zip(docs, gold, strict=True)])
    assert got["choice_loss"] == pytest.approx(np.mean(norm - right), rel=1e-12)
    assert got["bpb"] == pytest.approx(-right.sum() / (math.log(2) * nbytes.sum()), rel=1e-12)
    assert got["acc"] == pytest.approx(np.mean(lp.argmax(axis=1) == gold))
    assert got["documents"] == 50


def test_soft_metrics_refuse_bad_documents() -> None:
    with pytest.raises(ValueError, match="no documents"):
        soft_metrics([])
    with pytest.raises(ValueError, match="document 1 needs logprobs, gold and norm_bytes"):
        soft_metrics([{"logprobs": [-1.0, -2.0], "gold": 0, "norm_bytes": [3, 4]}, {"logprobs": [-1.0]}])
    with pytest.raises(ValueError, match="document 0 has logprobs"):
        soft_metrics([{"logprobs": [float("nan"), -2.0], "gold": 0, "norm_bytes": [3, 4]}])


def test_the_sigmoid_from_soft_to_hard_is_recovered() -> None:
    s = np.linspace(0.6, 1.4, 25)
    k, s0, chance = 9.0, 0.95, 0.25
    acc = chance + (1 - chance) / (1 + np.exp(-k * (s0 - s)))
    fit = fit_soft_to_hard(s, acc, chance=chance)
    assert (fit.k, fit.s0) == pytest.approx((k, s0), rel=1e-3)
    np.testing.assert_allclose(fit(s), acc, atol=1e-5)
    # noisy accuracies (a finite task): still close, and the map falls with the soft metric
    noisy = acc + np.random.default_rng(1).normal(0, 0.01, s.size)
    rough = fit_soft_to_hard(s, noisy, chance=chance)
    assert rough.s0 == pytest.approx(s0, abs=0.03) and rough.k == pytest.approx(k, rel=0.3)
    assert np.all(np.diff(rough(s)) < 0)


def test_soft_to_hard_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="3 or more"):
        fit_soft_to_hard([1.0, 2.0], [0.3, 0.4], chance=0.25)
    with pytest.raises(ValueError, match=r"accuracies in \[0, 1\]"):
        fit_soft_to_hard([1.0, 2.0, 3.0], [0.3, 1.4, 0.2], chance=0.25)
    with pytest.raises(ValueError, match="every soft metric is 1.0"):
        fit_soft_to_hard([1.0, 1.0, 1.0], [0.3, 0.4, 0.2], chance=0.25)


def _metric_runs(law: dict[str, float], budgets: list[float], curvature: float = 0.05) -> list[ScalingRun]:
    runs = []
    for c in budgets:
        d_opt = 0.2 * c**0.5
        best = law["E"] + law["A"] * c ** -law["alpha"]
        for i, d in enumerate(d_opt * np.geomspace(1 / 3, 3, 5)):
            value = best + curvature * math.log(d / d_opt) ** 2
            runs.append(
                ScalingRun(budget=c, params=c / (6 * d), tokens=float(d), loss=value, name=f"{c:.0e}-{i}")
            )
    return runs


def test_a_soft_metric_following_a_law_is_forecast_at_held_out_budgets() -> None:
    law = {"E": 0.4, "A": 9.0, "alpha": 0.07}  # e.g. the cloze choice loss against compute
    budgets = [1e10 * 3**i for i in range(5)]
    fit = fit_delphi(_metric_runs(law, budgets), samples=200)
    for k in (10, 30):
        c = k * budgets[-1]
        want = law["E"] + law["A"] * c ** -law["alpha"]
        assert float(fit.predict(c)) == pytest.approx(want, rel=1e-6)
        iv = fit.interval(c)
        assert iv is not None and iv.low <= want <= iv.high


def test_the_overtraining_penalty_has_the_known_answer() -> None:
    # parabolas in ln D of curvature k(C) = 0.08 (C / 1e10)^-0.1: the loss at m D* is L* + k (ln m)^2
    budgets = [1e10 * 3**i for i in range(5)]
    runs = []
    for c in budgets:
        k = 0.08 * (c / 1e10) ** -0.1
        runs += _metric_runs({"E": 1.0, "A": 50.0, "alpha": 0.1}, [c], curvature=k)
    optima = budget_optima(runs)
    for m in (0.5, 2.0, 4.0):
        p = overtraining_penalty(optima, m)
        for c, extra in zip(p.budgets, p.per_budget, strict=True):
            assert extra == pytest.approx(0.08 * (c / 1e10) ** -0.1 * math.log(m) ** 2, rel=1e-9)
        far = 30 * budgets[-1]
        assert float(p(far)) == pytest.approx(0.08 * (far / 1e10) ** -0.1 * math.log(m) ** 2, rel=1e-9)
    with pytest.raises(ValueError, match="multiplier must be positive and not 1"):
        overtraining_penalty(optima, 1.0)
