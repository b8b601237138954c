"""The Delphi fit on synthetic isoFLOP runs drawn from a known law: recovery, the parabola against numpy,
bootstrap coverage, the over-training penalty, bad input, and the plot."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from schooner.train.scaling import ScalingRun
from schooner.train.scaling._delphi import (
    budget_optima,
    fit_asymptotic_law,
    fit_delphi,
    fit_parabola,
    plot_delphi,
)

TRUE = {"E": 1.8, "A": 60.0, "alpha": 0.09}
BUDGETS = [1e15 * 3**i for i in range(6)]  # six budgets, 3x apart: 1e15 .. 2.4e17
CURVATURE = 0.04  # loss above the optimum per (ln D - ln D*)^2


def _optimum(c: float) -> tuple[float, float]:
    """The true (D*, L*) at compute c: D* = 0.3 C^0.5 (so N* = C / 6D* grows like C^0.5 too)."""
    return 0.3 * c**0.5, TRUE["E"] + TRUE["A"] * c ** (-TRUE["alpha"])


def _runs(
    budgets=BUDGETS,
    *,
    per_budget: int = 7,
    span: float = 4.0,
    noise: float = 0.0,
    budget_noise: float = 0.0,
    seed: int = 0,
    curvature=CURVATURE,
) -> list[ScalingRun]:
    """IsoFLOP runs with loss = L*(C) + k (ln D - ln D*)^2 (+ a shared per-budget offset, + per-run noise),
    N = C / (6D), over tokens log-spaced in [D*/span, D* span] (off-centre by a random factor when noisy)."""
    rng = np.random.default_rng(seed)
    runs = []
    for c in budgets:
        d_opt, l_opt = _optimum(c)
        shift = math.exp(0.3 * rng.uniform(-1, 1)) if noise or budget_noise else 1.0
        offset = budget_noise * rng.standard_normal()
        k = curvature(c) if callable(curvature) else curvature
        for i, d in enumerate(d_opt * shift * np.geomspace(1 / span, span, per_budget)):
            loss = l_opt + k * math.log(d / d_opt) ** 2 + offset + noise * rng.standard_normal()
            runs.append(
                ScalingRun(budget=c, params=c / (6 * d), tokens=float(d), loss=loss, name=f"{c:.0e}-{i}")
            )
    return runs


def test_recovers_the_law_and_the_optima_from_exact_runs() -> None:
    fit = fit_delphi(_runs(), samples=200)
    assert fit.law.to_dict() == pytest.approx(TRUE, rel=1e-5)
    for o in fit.optima:
        d_opt, l_opt = _optimum(o.budget)
        assert o.tokens == pytest.approx(d_opt, rel=1e-8)
        assert o.loss == pytest.approx(l_opt, rel=1e-10)
        assert o.params == pytest.approx(o.budget / (6 * d_opt), rel=1e-8)  # N* from the isoFLOP line
    assert fit.tokens_law.exponent == pytest.approx(0.5, abs=1e-9)
    assert fit.params_law.exponent == pytest.approx(0.5, abs=1e-9)
    target = 30 * BUDGETS[-1]
    assert float(fit.predict(target)) == pytest.approx(_optimum(target)[1], rel=1e-6)
    iv = fit.interval(target)  # every resample of exact optima gives the same law
    assert iv is not None and iv.high - iv.low < 1e-6


def test_the_parabola_matches_numpy_polyfit_on_noisy_runs() -> None:
    rng = np.random.default_rng(3)
    tokens = np.geomspace(1e8, 3e9, 9)
    loss = 3.0 + 0.05 * (np.log(tokens) - np.log(5e8)) ** 2 + 0.01 * rng.standard_normal(9)
    p = fit_parabola(1e18, tokens, loss)
    c2, c1, c0 = np.polyfit(np.log(tokens), loss, 2)
    np.testing.assert_allclose([p.c2, p.c1, p.c0], [c2, c1, c0], rtol=1e-8)
    assert p.argmin == pytest.approx(math.exp(-c1 / (2 * c2)), rel=1e-8)
    assert p.min_loss == pytest.approx(c0 - c1**2 / (4 * c2), rel=1e-10)


def test_the_law_fit_is_least_squares() -> None:
    """No (E, A, alpha) nearby has a smaller squared error than the fit on noisy optima."""
    rng = np.random.default_rng(4)
    c = np.array(BUDGETS)
    y = np.array([_optimum(x)[1] for x in c]) + 0.003 * rng.standard_normal(c.size)
    law = fit_asymptotic_law(c, y)

    def sse(e: float, a: float, alpha: float) -> float:
        return float(np.sum((y - e - a * c ** (-alpha)) ** 2))

    best = sse(law.E, law.A, law.alpha)
    for de, da, dal in rng.normal(size=(500, 3)) * [1e-3, 1e-3, 1e-3]:
        assert best <= sse(law.E + de, law.A * (1 + da), law.alpha + dal) + 1e-15
    # An independent solver from the true parameters (Levenberg-Marquardt on the same residuals) agrees.
    from scipy.optimize import curve_fit

    x = c / 1e16
    ref, _ = curve_fit(lambda x, e, a, al: e + a * x ** (-al), x, y, p0=[1.8, 60 * 1e16**-0.09, 0.09])
    np.testing.assert_allclose(
        [law.E, law.A * 1e16 ** (-law.alpha), law.alpha], ref, rtol=1e-6, err_msg=f"{law} vs {ref}"
    )


def test_bootstrap_intervals_cover_the_truth_on_noisy_runs() -> None:
    """Over repeated noisy studies (per-run noise and a shared offset per budget), the 90% interval of the
    forecast 10x past the largest budget contains the true optimal loss in most of them."""
    target = 10 * BUDGETS[-1]
    truth = _optimum(target)[1]
    hits, errors, widths = 0, [], []
    trials = 40
    for seed in range(trials):
        runs = _runs(noise=0.004, budget_noise=0.003, seed=seed)
        fit = fit_delphi(runs, samples=400, seed=seed)
        iv = fit.interval(target)
        assert iv is not None, fit.interval_problem
        hits += truth in iv
        errors.append(float(fit.predict(target)) / truth - 1)
        widths.append((iv.high - iv.low) / truth)
    coverage = hits / trials
    # Over 200 such studies: coverage 0.91 at 10x (0.93 at 30x, 0.93 at 100x), mean |error| 0.22%, median
    # width 1.7% of the loss. Both bounds bite: a zero-width interval covers none, a vacuous one is too wide.
    assert coverage >= 0.8, (coverage, np.mean(np.abs(errors)), np.median(widths))
    assert np.median(widths) < 0.03, np.median(widths)


def test_same_seed_same_intervals() -> None:
    runs = _runs(noise=0.004, seed=1)
    a, b = fit_delphi(runs, samples=300, seed=7), fit_delphi(runs, samples=300, seed=7)
    np.testing.assert_array_equal(a.replicates, b.replicates)
    assert a.to_dict() == b.to_dict()


def test_the_overtraining_penalty_follows_the_parabolas_and_extrapolates() -> None:
    # The isoFLOP curvature flattens with compute like C^-0.05: the penalty's power law should find it.
    runs = _runs(curvature=lambda c: 0.05 * (c / 1e15) ** -0.05)
    fit = fit_delphi(runs, samples=100)
    half, double = fit.penalties
    assert (half.multiplier, double.multiplier) == (0.5, 2.0)
    for o, p in zip(fit.optima, half.per_budget, strict=True):
        assert p == pytest.approx(0.05 * (o.budget / 1e15) ** -0.05 * math.log(2) ** 2, rel=1e-6)
    np.testing.assert_allclose(half.per_budget, double.per_budget, rtol=1e-6)  # in ln D: symmetric
    far = 100 * BUDGETS[-1]
    want = 0.05 * (far / 1e15) ** -0.05 * math.log(2) ** 2
    assert float(half(far)) == pytest.approx(want, rel=1e-6)
    penalty = fit.forecast(far)["penalties"]["2x tokens"]
    assert penalty["extra_loss"] == pytest.approx(want, rel=1e-6)
    assert penalty["relative"] == pytest.approx(want / _optimum(far)[1], rel=1e-5)


def test_a_budget_with_too_few_runs_is_named() -> None:
    runs = [r for r in _runs() if not (r.budget == BUDGETS[2] and not r.name.endswith(("-0", "-1")))]
    with pytest.raises(ValueError, match=r"budget 9e\+15 has 2 \('9e\+15-0', '9e\+15-1'\): add runs"):
        fit_delphi(runs)


def test_repeated_token_counts_do_not_make_a_parabola() -> None:
    runs = _runs(per_budget=2)
    seeds = [
        dataclasses.replace(r, name=r.name + "-seed2", loss=r.loss + 1e-3)
        for r in runs
        if r.budget == BUDGETS[0]
    ]
    with pytest.raises(ValueError, match=r"budget 1e\+15 has 4 run\(s\) at 2 token count\(s\)"):
        budget_optima(runs + seeds)


def test_non_positive_values_are_named_with_their_budget() -> None:
    runs = _runs()
    with pytest.raises(ValueError, match="loss must be a finite number > 0"):  # the record refuses it first
        dataclasses.replace(runs[3], loss=0.0)
    bad = dataclasses.replace(runs[3])
    object.__setattr__(bad, "loss", -1.0)  # a record that bypassed its check (read from elsewhere)
    with pytest.raises(ValueError, match=r"the run '1e\+15-3' at budget 1e\+15 has loss=-1.0"):
        fit_delphi([*runs[:3], bad, *runs[4:]])


def test_runs_that_do_not_bracket_the_optimum_are_named() -> None:
    runs = [r for r in _runs() if not (r.budget == BUDGETS[1] and r.tokens < _optimum(BUDGETS[1])[0] * 1.1)]
    with pytest.raises(ValueError, match=r"budget 3e\+15 do not bracket a minimum: .* lies below"):
        fit_delphi(runs)


def test_too_few_budgets_or_a_rising_loss_are_refused() -> None:
    with pytest.raises(ValueError, match="needs optima at 3 or more budgets"):
        fit_delphi(_runs(BUDGETS[:2]))
    with pytest.raises(ValueError, match="does not fall with compute"):
        fit_asymptotic_law(BUDGETS, [2.0 + 0.01 * i for i in range(len(BUDGETS))])
    with pytest.raises(ValueError, match="multipliers must be positive and not 1"):
        fit_delphi(_runs(), multipliers=(1.0,))


def test_plot_writes_a_png(tmp_path) -> None:
    runs = _runs(noise=0.004, seed=2)
    fit = fit_delphi(runs, samples=200)
    out = tmp_path / "delphi.png"
    target = 10 * BUDGETS[-1]
    plot_delphi(fit, str(out), runs=runs, held_out=[(target, _optimum(target)[1])] * 3, up_to=target)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


@pytest.mark.parametrize(
    "top, minimum, runs",
    [(4e9, 2e8, 7), (1e10, 1.3e8, 6), (1e9, 3e8, 9)],
    ids=["off-centre", "edge", "centre"],
)
def test_vertex_standard_error_matches_the_spread_of_repeated_budgets(top, minimum, runs) -> None:
    """The delta-method standard error of L* against its spread over 4,000 redraws of one budget's noisy runs
    (the vertex of numpy's polyfit each time), with the minimum at several places in the grid."""
    from schooner.train.scaling import vertex_loss_se

    rng = np.random.default_rng(11)
    tokens = np.geomspace(1e8, top, runs)
    u = np.log(tokens)
    truth = 3.0 + 0.06 * (u - np.log(minimum)) ** 2
    sigma = 0.01
    vertices, ses = [], []
    for _ in range(4000):
        y = truth + sigma * rng.standard_normal(u.size)
        c2, c1, c0 = np.polyfit(u, y, 2)
        vertices.append(c0 - c1**2 / (4 * c2))
        ses.append(vertex_loss_se(tokens, y))
    spread = float(np.std(vertices, ddof=1))
    # the variance estimate is unbiased, the standard error is not (E[s] < sigma with few residual degrees of
    # freedom: 8% low with six runs), so the root mean square of the standard errors is compared
    rms = float(np.sqrt(np.mean(np.square(ses))))
    assert rms == pytest.approx(spread, rel=0.05), (rms, spread)
    assert vertex_loss_se(tokens[:3], truth[:3]) is None  # three runs: no residual left to measure noise


def test_the_optima_carry_their_standard_errors_into_the_fit_and_its_record() -> None:
    from schooner.train.scaling import vertex_loss_se
    from schooner.train.scaling._fit import delphi_from_dict

    runs = _runs(noise=0.004, seed=2)
    fit = fit_delphi(runs, samples=200)
    for o in fit.optima:
        mine = [r for r in runs if r.budget == o.budget]
        assert o.loss_se == vertex_loss_se([r.tokens for r in mine], [r.loss for r in mine])
        assert 0 < o.loss_se < 0.004
    record = fit.to_dict() | {
        "replicate_laws": [dict(zip(["E", "A", "alpha"], r, strict=True)) for r in fit.replicates]
    }
    assert [o.loss_se for o in delphi_from_dict(record).optima] == [o.loss_se for o in fit.optima]
    exact = fit_delphi(_runs(), samples=50)
    assert all(o.loss_se == pytest.approx(0, abs=1e-12) for o in exact.optima)


def test_optima_noise_matches_refits_by_an_independent_solver() -> None:
    """The forecast's spread from the optima's noise against scipy's curve_fit on 300 redraws of the optima."""
    from scipy.optimize import curve_fit

    from schooner.train.scaling import optima_noise

    c = np.array(BUDGETS)
    y = np.array([_optimum(x)[1] for x in c])
    se = np.full(c.size, 0.004)
    at = 30 * c[-1]
    got = optima_noise(c, y, se, at, samples=2000, seed=1)
    assert got is not None and got["failed"] == 0
    rng = np.random.default_rng(5)
    x = c / 1e16
    preds = []
    for _ in range(300):
        drawn = y + se * rng.standard_normal(c.size)
        p, _ = curve_fit(
            lambda x, e, a, al: e + a * x ** (-al), x, drawn, p0=[1.8, 60 * 1e16**-0.09, 0.09],
            bounds=([0, 0, 1e-3], [np.inf, np.inf, 4.0]), maxfev=20000,
        )  # fmt: skip
        preds.append(p[0] + p[1] * (at / 1e16) ** (-p[2]))
    assert got["sd"] == pytest.approx(float(np.std(preds, ddof=1)), rel=0.15), (got, np.std(preds))
    truth = _optimum(at)[1]
    assert got["interval"]["low"] < truth < got["interval"]["high"]
    near = optima_noise(c, y, se, 3 * c[-1], samples=2000, seed=1)
    assert near is not None and near["sd"] < got["sd"]  # the farther out, the more the noise costs
    assert optima_noise(c, y, [*se[:-1], None], at) is None  # a budget of three runs has no standard error


def test_the_forecast_reports_the_optima_noise() -> None:
    fit = fit_delphi(_runs(noise=0.004, seed=3), samples=200)
    out = fit.forecast(10 * BUDGETS[-1])
    noise = out["optima_noise"]
    assert noise is not None and noise["sd"] > 0
    assert noise["sd_pct"] == pytest.approx(100 * noise["sd"] / out["loss"], rel=1e-2)


def test_lack_of_fit_holds_its_level_on_parabolas_and_finds_another_shape() -> None:
    """With runs that are a parabola plus seed noise, p < 0.05 in about 5% of 2,000 budgets (the test's level);
    with a curve that rises like an exponential on one side (an isoFLOP curve's usual asymmetry), nearly always."""
    from schooner.train.scaling import parabola_lack_of_fit

    rng = np.random.default_rng(21)
    tokens = np.repeat(np.geomspace(1e8, 2e9, 6), 4)  # six sizes, four seeds each
    u = np.log(tokens) - np.log(5e8)
    parabola = 3.0 + 0.06 * u**2
    asymmetric = 3.0 + 0.03 * (np.exp(1.5 * u) - 1.5 * u - 1)
    p_null = [
        parabola_lack_of_fit(tokens, parabola + 0.01 * rng.standard_normal(u.size))["p"] for _ in range(2000)
    ]
    assert 0.035 < np.mean(np.array(p_null) < 0.05) < 0.065, np.mean(np.array(p_null) < 0.05)
    p_alt = [
        parabola_lack_of_fit(tokens, asymmetric + 0.01 * rng.standard_normal(u.size))["p"] for _ in range(200)
    ]
    assert np.mean(np.array(p_alt) < 0.05) > 0.9, np.mean(np.array(p_alt) < 0.05)
    noisy = parabola + 0.01 * rng.standard_normal(u.size)
    assert parabola_lack_of_fit(tokens, noisy)["pure_error_sd"] == pytest.approx(0.01, rel=0.3)
    assert parabola_lack_of_fit(tokens[::4], noisy[::4]) is None  # one run per size: no pure error
    once = _runs(noise=0.004, seed=5)
    again = [
        dataclasses.replace(r, loss=r.loss + 0.004 * rng.standard_normal(), name=r.name + "-s1") for r in once
    ]
    assert all(o.lack_of_fit is not None for o in fit_delphi(once + again, samples=50).optima)
    assert all(o.lack_of_fit is None for o in fit_delphi(once, samples=50).optima)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (
            ([1e15, 3e15, 9e15], [3.0, 2.9], [0.01, 0.01, 0.01], 1e17),
            {},
            "one value per optimum; got 3, 2 and 3",
        ),
        (([1e15, 3e15, 9e15], [3.0, 2.9, 2.8], [0.01, -0.01, 0.01], 1e17), {}, "finite and >= 0"),
        (([1e15, 3e15, 9e15], [3.0, 2.9, 2.8], [0.01, float("nan"), 0.01], 1e17), {}, "finite and >= 0"),
        (([1e15, 3e15, 9e15], [3.0, 2.9, 2.8], [0.01] * 3, 0.0), {}, "positive compute"),
        (([1e15, 3e15, 9e15], [3.0, 2.9, 2.8], [0.01] * 3, 1e17), {"level": 90}, "0 < level < 1"),
        (([1e15, 3e15], [3.0, 2.9], [0.01] * 2, 1e17), {}, "3 or more budgets"),
        # fewer redraws than an interval is read from gave None, as if the optima's noise were too large
        (
            ([1e15, 3e15, 9e15], [3.0, 2.9, 2.8], [0.01] * 3, 1e17),
            {"samples": 5},
            r"samples >= 20 \(.*got samples=5,",
        ),
        (([1e15, 3e15, 9e15], [3.0, 2.9, 2.8], [0.01] * 3, 1e17), {"samples": 2.5}, "got samples=2.5"),
    ],
)
def test_optima_noise_refuses_bad_input_by_name(args, kwargs, match) -> None:
    from schooner.train.scaling import optima_noise

    with pytest.raises(ValueError, match=match):
        optima_noise(*args, **kwargs)


def test_a_run_given_twice_is_refused_by_name() -> None:
    """The same run twice shrinks its budget's standard error and hides the lack of fit (its copy is a seed that
    agrees exactly): refused, named, whether it carries a name or not."""
    runs = _runs(noise=0.004, seed=4)
    with pytest.raises(ValueError, match=r"the run '1e\+15-2' at budget 1e\+15 is given twice: drop the"):
        fit_delphi([*runs, runs[2]])
    renamed = dataclasses.replace(runs[5], loss=runs[5].loss + 0.01)  # one name, two results
    with pytest.raises(ValueError, match=r"the run '1e\+15-5' at budget 1e\+15 is given twice"):
        fit_delphi([*runs, renamed])
    unnamed = [dataclasses.replace(r, name="") for r in runs]
    with pytest.raises(ValueError, match=r"at budget 3e\+15 .* is given twice"):
        fit_delphi([*unnamed, unnamed[8]])
    seeds = [
        dataclasses.replace(r, loss=r.loss + 0.001) for r in unnamed
    ]  # unnamed seeds, other losses: kept
    assert fit_delphi(unnamed + seeds, samples=20).optima[0].runs == 14


@pytest.mark.parametrize(
    ("tokens", "loss", "match"),
    [
        (
            [1e8, 2e8, 4e8, 8e8],
            [3.0, 2.9, 2.95],
            "one value per run of one budget; got 4 tokens and 3 losses",
        ),
        ([1e8, 2e8, 4e8, 8e8], [3.0, 2.9, float("nan"), 3.0], r"loss\[2\]=nan"),
        ([1e8, 2e8, 4e8, 8e8], [3.0, 2.9, float("inf"), 3.0], r"loss\[2\]=inf"),
        ([1e8, 0.0, 4e8, 8e8], [3.0, 2.9, 2.95, 3.0], r"tokens\[1\]=0.0"),
        (
            [1e8, 1e8, 4e8, 4e8],
            [3.0, 2.9, 2.95, 3.0],
            r"3 or more distinct token counts; got 2 \(1e\+08, 4e\+08\)",
        ),
    ],
)
def test_the_precision_tools_refuse_bad_runs_by_name(tokens, loss, match) -> None:
    from schooner.train.scaling import parabola_lack_of_fit, vertex_loss_se

    for f in (vertex_loss_se, parabola_lack_of_fit):
        with pytest.raises(ValueError, match=f"{f.__name__}: .*{match}"):
            f(tokens, loss)


def test_the_vertex_standard_error_refuses_a_parabola_that_opens_downwards() -> None:
    from schooner.train.scaling import vertex_loss_se

    tokens = np.geomspace(1e8, 2e9, 6)
    # a maximum: no minimum loss to be uncertain about
    loss = 3.0 - 0.05 * (np.log(tokens) - np.log(5e8)) ** 2
    with pytest.raises(ValueError, match=r"vertex_loss_se: the parabola opens downwards \(c2=-0.05"):
        vertex_loss_se(tokens, loss)


def test_optima_noise_refuses_two_optima_at_one_budget() -> None:
    """Two optima at one budget (e.g. one per seed) would be refitted as two independent budgets, halving the
    noise that budget leaves; refused, naming the budget and the fix (one optimum per budget: `fit_delphi` pools
    a budget's seeds). Budgets that differ only by float round-off (within `BUDGET_RTOL`) are one budget too."""
    from schooner.train.scaling import optima_noise

    c = [1e15, 3e15, 3e15, 9e15, 2.7e16]
    y = [_optimum(x)[1] for x in c]
    with pytest.raises(
        ValueError, match=r"optima_noise: 2 optima at budget 3e\+15 \(optima 1 and 2.*one optimum per budget"
    ):
        optima_noise(c, y, [0.004] * 5, 1e17)
    with pytest.raises(ValueError, match=r"2 optima at budget 3e\+15"):  # before the missing-se None
        optima_noise(c, y, [0.004, None, 0.004, 0.004, 0.004], 1e17)
    nudged = [1e15, 3e15, 3e15 * (1 + 1e-9), 9e15, 2.7e16]
    with pytest.raises(ValueError, match=r"2 optima at budget 3e\+15"):
        optima_noise(nudged, y, [0.004] * 5, 1e17)
    seed4 = [dataclasses.replace(r, name=f"{r.name}-s4") for r in _runs(noise=0.004, seed=4)]
    fit = fit_delphi(
        [*_runs(noise=0.004, seed=3), *seed4], samples=50
    )  # a budget's seeds pooled: one optimum
    assert len(fit.optima) == len(BUDGETS) and fit.forecast(1e18)["optima_noise"]["sd"] > 0


def test_lack_of_fit_groups_token_counts_that_differ_in_the_last_bits() -> None:
    """Seeds of one run size whose token counts differ by an ulp (a float product, a JSON round trip) are one
    size: the pure error has n - k degrees of freedom for the k sizes, not one group per bit pattern. Checked
    against the test written out in numpy on the known sizes, and its pure error against scipy's one-way ANOVA."""
    from scipy import stats

    from schooner.train.scaling import parabola_lack_of_fit

    rng = np.random.default_rng(3)
    sizes = np.geomspace(1e8, 2e9, 6)
    seeds = 3
    label = np.repeat(np.arange(sizes.size), seeds)
    tokens = sizes[label].copy()
    tokens[2::seeds] = np.nextafter(tokens[2::seeds], np.inf)  # the third seed's counts: one ulp up
    tokens[1::seeds] = np.nextafter(tokens[1::seeds], 0.0)  # the second's: one ulp down
    assert np.unique(tokens).size == 3 * sizes.size
    u = np.log(sizes[label]) - np.log(5e8)
    loss = 3.0 + 0.03 * (np.exp(1.5 * u) - 1.5 * u - 1) + 0.01 * rng.standard_normal(u.size)
    got = parabola_lack_of_fit(tokens, loss)
    assert got == pytest.approx(parabola_lack_of_fit(sizes[label], loss), rel=1e-9)  # as with exact counts
    two = np.arange(n := loss.size) % seeds != 1  # two seeds, one ulp apart at every size
    exact = parabola_lack_of_fit(sizes[label][two], loss[two])
    assert exact is not None and parabola_lack_of_fit(tokens[two], loss[two]) == pytest.approx(
        exact, rel=1e-9
    )

    k = sizes.size
    groups = [loss[label == g] for g in range(k)]
    pure = sum(float(((g - g.mean()) ** 2).sum()) for g in groups)
    sse = float((np.polyval(np.polyfit(u, loss, 2), u) - loss) ** 2 @ np.ones(n))
    f = ((sse - pure) / (k - 3)) / (pure / (n - k))
    between = sum(g.size * (g.mean() - loss.mean()) ** 2 for g in groups)
    assert stats.f_oneway(*groups).statistic == pytest.approx(
        (between / (k - 1)) / (pure / (n - k)), rel=1e-9
    )
    assert got is not None
    assert got["pure_error_sd"] == pytest.approx(math.sqrt(pure / (n - k)), rel=1e-9)
    assert got["F"] == pytest.approx(f, rel=1e-6)
    assert got["p"] == pytest.approx(float(stats.f.sf(f, k - 3, n - k)), rel=1e-6)
    # sizes 1e-9 apart relative (the tolerance) are one; a real grid's neighbours (percent apart) are not
    assert parabola_lack_of_fit(sizes[label] * (1 + 0.5e-9 * (label % 2)), loss) == pytest.approx(
        got, rel=1e-6
    )
    with pytest.raises(ValueError, match="3 or more distinct token counts; got 2"):
        parabola_lack_of_fit([1e8, 1e8 * (1 + 1e-12), 4e8, 4e8], [3.0, 2.9, 2.95, 3.0])


def test_optima_noise_and_the_forecast_take_numpy_scalars() -> None:
    from schooner.train.scaling import optima_noise

    fit = fit_delphi(_runs(noise=0.004, seed=3), samples=50)
    want = fit.forecast(1e18)["optima_noise"]
    assert fit.forecast(np.float32(1e18))["optima_noise"]["sd"] == pytest.approx(want["sd"], rel=1e-6)
    assert fit.forecast(np.int64(10**18))["optima_noise"] == want
    args = (fit.budgets, [o.loss for o in fit.optima], [o.loss_se for o in fit.optima])
    with pytest.raises(ValueError, match="at=True"):
        optima_noise(*args, True)


def test_weighted_law_fit_is_weighted_least_squares() -> None:
    """Equal weights give the plain fit; a weight of 0 leaves a point out (the fit of the others); and with
    unequal weights the fit agrees with scipy's curve_fit given sigma = 1 / sqrt(weight)."""
    from scipy.optimize import curve_fit

    rng = np.random.default_rng(8)
    c = np.array(BUDGETS)
    y = np.array([_optimum(x)[1] for x in c]) + 0.004 * rng.standard_normal(c.size)
    plain = fit_asymptotic_law(c, y)
    assert fit_asymptotic_law(c, y, weights=np.full(c.size, 3.0)).to_dict() == pytest.approx(
        plain.to_dict(), rel=1e-9
    )
    w = np.ones(c.size)
    w[0] = 0.0
    assert fit_asymptotic_law(c, y, weights=w).to_dict() == pytest.approx(
        fit_asymptotic_law(c[1:], y[1:]).to_dict(), rel=1e-9
    )
    w = rng.uniform(0.2, 5.0, c.size)
    law = fit_asymptotic_law(c, y, weights=w)
    x = c / 1e16
    ref, _ = curve_fit(
        lambda x, e, a, al: e + a * x ** (-al), x, y, p0=[1.8, 60 * 1e16**-0.09, 0.09], sigma=1 / np.sqrt(w)
    )
    np.testing.assert_allclose([law.E, law.A * 1e16 ** (-law.alpha), law.alpha], ref, rtol=1e-5)
    for bad in ([1.0] * (c.size - 1), [-1.0] + [1.0] * (c.size - 1), [0.0] * c.size):
        with pytest.raises(ValueError, match="weights are one finite number >= 0 per point"):
            fit_asymptotic_law(c, y, weights=bad)
