"""How precisely a sweep pins its optima, and what that costs a forecast (step 4 of `_delphi`'s module
docstring): each optimum's standard error, the parabola's lack of fit, the forecast's spread from the optima's
noise."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._bootstrap import MIN_REPLICATES, replicates_shortfall
from ._delphi_law import _fit_weighted, _percentiles, fit_asymptotic_law
from ._law import BUDGET_RTOL, budget_groups

__all__ = ["forecast_noise", "optima_noise", "parabola_lack_of_fit", "vertex_loss_se"]


def _least_squares_parabola(u: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(mean of u, the design [(u-m)^2, u-m, 1], the coefficients q2, q1, q0 in u - m): centred for conditioning
    (ln D is ~20, u^2 ~400: the normal equations suffer)."""
    mid = float(u.mean())
    design = np.stack([(u - mid) ** 2, u - mid, np.ones_like(u)], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    return mid, design, coef


TOKENS_RTOL = 1e-9
"""Token counts within this relative distance of the one below them are one run size: seeds of one
size whose counts went through a float product or a JSON round trip (1016832.0000000001) differ in the last
bits, not by the percent a grid's neighbouring sizes differ by."""


def _size_groups(d: np.ndarray) -> np.ndarray:
    """The run size of each token count, 0..k-1 in ascending order: counts within `TOKENS_RTOL` (relative) of
    the one below them are one size (`budget_groups`, the grouping `fit_delphi` gives budgets)."""
    label = np.empty(d.size, dtype=np.intp)
    for k, (_, idx) in enumerate(budget_groups(d, TOKENS_RTOL)):
        label[idx] = k
    return label


def _budget_runs(what: str, tokens: Any, loss: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ln tokens, loss, each run's size `_size_groups`) of one budget's runs, checked: one value each, finite,
    tokens > 0, 3 or more distinct token counts (sizes, a parabola has 3 coefficients); else a ValueError naming
    `what` and the first bad value."""
    d = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(loss, dtype=np.float64)
    if d.ndim != 1 or d.shape != y.shape:
        raise ValueError(
            f"{what}: tokens and loss are one value per run of one budget; got {d.size} tokens and {y.size} "
            f"losses (shapes {d.shape} and {y.shape})"
        )
    for name, values, ok in (("tokens", d, np.isfinite(d) & (d > 0)), ("loss", y, np.isfinite(y))):
        if not ok.all():
            i = int(np.argmin(ok))
            raise ValueError(
                f"{what}: every run needs finite {name}{' > 0' if name == 'tokens' else ''}; got {name}[{i}]="
                f"{float(values[i])!r}: drop the run or fix its record"
            )
    size = _size_groups(d)
    k = int(size.max()) + 1 if size.size else 0
    if k < 3:
        distinct = [float(d[size == g].min()) for g in range(k)]
        raise ValueError(
            f"{what}: a parabola in ln D needs runs at 3 or more distinct token counts; got {k} "
            f"({', '.join(f'{x:.4g}' for x in distinct)}): add runs at other token counts (counts within a "
            f"relative {TOKENS_RTOL:g} are one)"
        )
    return np.log(d), y, size


def vertex_loss_se(tokens: Sequence[float] | np.ndarray, loss: Sequence[float] | np.ndarray) -> float | None:
    """The standard error of the least-squares parabola's minimum loss, L* = c0 - c1^2 / (4 c2) in u = ln D,
    by the delta method: the residual variance (n - 3 degrees of freedom) times g' (X'X)^-1 g, g the gradient
    of L* in the coefficients. None with 3 runs or fewer (nothing left to measure the noise with).

    Raises:
        ValueError: tokens and loss of different lengths, a value that is not finite (or tokens <= 0), fewer
            than 3 distinct token counts, or a parabola that opens downwards (its vertex is a maximum).
    """
    u, y, _ = _budget_runs("vertex_loss_se", tokens, loss)
    if y.size <= 3:
        return None
    _, design, coef = _least_squares_parabola(u, y)
    q2, q1, _ = coef
    if not q2 > 0:
        raise ValueError(
            f"vertex_loss_se: the parabola opens downwards (c2={q2:.3g}): its vertex is a maximum, not an optimum "
            "with a loss to be uncertain about; centre the grid on the optimum or widen it"
        )
    variance = float(((y - design @ coef) ** 2).sum()) / (y.size - 3)
    g = np.array([q1**2 / (4.0 * q2**2), -q1 / (2.0 * q2), 1.0])
    return float(math.sqrt(variance * (g @ np.linalg.solve(design.T @ design, g))))


def parabola_lack_of_fit(
    tokens: Sequence[float] | np.ndarray, loss: Sequence[float] | np.ndarray
) -> dict[str, float] | None:
    """The textbook lack-of-fit test of the parabola in ln D, for a budget with repeated runs at some token
    counts (seeds): the residual sum of squares is the pure error (the runs' scatter about their token count's
    mean, n - k degrees of freedom for k distinct counts; counts within a relative `TOKENS_RTOL` (1e-9) are one,
    as seeds' counts that differ in the last bits are) plus the lack of fit (k - 3), and
    F = (lack of fit / (k - 3)) / (pure error / (n - k)). Returns {"pure_error_sd" (one run's), "F", "p"}, or
    None without a repeat, with fewer than 4 distinct token counts, or when every repeat agrees exactly (no
    scatter to test against: seeds that changed nothing).

    Raises:
        ValueError: tokens and loss of different lengths, a value that is not finite (or tokens <= 0), or fewer
            than 3 distinct token counts.
    """
    from scipy import stats

    u, y, inverse = _budget_runs("parabola_lack_of_fit", tokens, loss)
    k, n = int(inverse.max()) + 1, y.size
    if k < 4 or n <= k:
        return None
    _, design, coef = _least_squares_parabola(u, y)
    sse = float(((y - design @ coef) ** 2).sum())
    means = np.bincount(inverse, weights=y) / np.bincount(inverse)
    pure = float(((y - means[inverse]) ** 2).sum())
    if pure <= 0:
        return None
    f = ((sse - pure) / (k - 3)) / (pure / (n - k))
    return {
        "pure_error_sd": math.sqrt(pure / (n - k)),
        "F": float(f),
        "p": float(stats.f.sf(f, k - 3, n - k)),
    }


# -- step 4: the precision the optima allow ----------------------------------------------------------------------
def optima_noise(
    compute: Sequence[float],
    loss: Sequence[float],
    loss_se: Sequence[float | None],
    at: float,
    *,
    samples: int = 1000,
    seed: int = 0,
    level: float = 0.9,
) -> dict[str, Any] | None:
    """The spread of the law's forecast at `at` that the optima's own noise leaves: the optima redrawn as
    loss + N(0, se^2), independently, `samples` times, the law refitted on each (module docstring, step 4).

    Returns {"sd", "sd_pct" (of the law's forecast), "interval" (central, `level`), "samples" (fitted),
    "failed"}, or None when an optimum has no standard error (3 runs) or too few redraws could be fitted.

    Raises:
        ValueError: sequences of different lengths, two optima at one budget (one optimum per budget:
            `fit_delphi` pools a budget's seeds into one), a standard error that is negative or not finite, samples
            not a whole number >= `MIN_REPLICATES` (20), a level outside (0, 1), `at` not positive, or optima
            the law cannot be fitted to (as `fit_asymptotic_law`).
    """
    if not len(compute) == len(loss) == len(loss_se):
        raise ValueError(
            f"optima_noise: compute, loss and loss_se are one value per optimum; got {len(compute)}, {len(loss)} "
            f"and {len(loss_se)} values"
        )
    real = isinstance(at, numbers.Real) and not isinstance(at, bool | np.bool_)  # numpy scalars too
    count = (
        isinstance(samples, numbers.Integral) and not isinstance(samples, bool) and samples >= MIN_REPLICATES
    )
    if not count or not 0 < level < 1 or not (real and math.isfinite(at) and at > 0):
        raise ValueError(
            f"optima_noise needs a whole number of samples >= {MIN_REPLICATES} (its spread is not read from "
            f"fewer redraws), 0 < level < 1 and a positive compute to forecast at; got samples={samples!r}, "
            f"level={level}, at={at!r}"
        )
    _refuse_shared_budgets(compute)
    if any(s is None for s in loss_se):
        return None
    se = np.asarray(loss_se, dtype=np.float64)
    if not np.all(np.isfinite(se) & (se >= 0)):
        raise ValueError(f"optima_noise: every standard error must be finite and >= 0; got {se.tolist()}")
    law = fit_asymptotic_law(list(compute), list(loss))  # checks the optima (positive, finite, 3 budgets)
    c = np.asarray(compute, dtype=np.float64)
    y = np.asarray(loss, dtype=np.float64)
    rng = np.random.default_rng(seed)
    drawn = y[None, :] + rng.normal(size=(samples, y.size)) * se[None, :]
    ref = float(np.exp(np.log(c).mean()))
    fits = _fit_weighted(c / ref, drawn, np.ones((samples, c.size)))
    ok = np.all(np.isfinite(fits), axis=1)
    if replicates_shortfall(int(ok.sum()), samples) is not None:
        return None
    e, a, alpha = fits[ok].T
    preds = e + a * (float(at) / ref) ** (-alpha)
    point = float(law(float(at)))
    sd = float(np.std(preds, ddof=1))
    return {
        "sd": sd,
        "sd_pct": 100.0 * sd / point,
        "interval": _percentiles(preds, level).to_dict(),
        "samples": int(ok.sum()),
        "failed": int(samples - ok.sum()),
    }


def _refuse_shared_budgets(compute: Sequence[float]) -> None:
    """A ValueError naming the first budget (within `BUDGET_RTOL`, as `fit_delphi` groups runs) that holds more
    than one optimum: the redraws would treat them as independent budgets, and the law's refit would weigh that
    budget twice with half its noise."""
    for budget, idx in budget_groups(compute, BUDGET_RTOL):
        if len(idx) > 1:
            which = ", ".join(str(i) for i in sorted(idx)[:-1]) + f" and {sorted(idx)[-1]}"
            raise ValueError(
                f"optima_noise: {len(idx)} optima at budget {budget:.4g} (optima {which}, within a relative "
                f"{BUDGET_RTOL:g}): the law is fitted to one optimum per budget; pool the budget's runs (seeds) "
                "into one optimum, as fit_delphi does, or drop the extra ones"
            )


def forecast_noise(optima: Sequence[Mapping[str, Any]], at: float, *, level: float = 0.9) -> dict[str, Any]:
    """`{"optima_noise": optima_noise(...)}` for a forecast at `at` from the optima's records (`BudgetOptimum.
    to_dict`, fit.json's), with `"optima_noise_error"` beside a None saying why: the budgets without a standard
    error (3 runs) or a fit from before them, or too few redraws fitted."""
    # no loss_se on an optimum of 4 or more runs (or no key at all): a record from before it was computed
    if any("loss_se" not in o or (o["loss_se"] is None and o["runs"] > 3) for o in optima):
        return {
            "optima_noise": None,
            "optima_noise_error": "the fit predates the optima's standard errors (scaling-fit-v7): rerun the fit "
            "step for the spread the optima's noise leaves",
        }
    noise = optima_noise(
        [o["budget"] for o in optima],
        [o["loss"] for o in optima],
        [o["loss_se"] for o in optima],
        at,
        level=level,
    )
    if noise is not None:
        return {"optima_noise": noise}
    bare = [o for o in optima if o["loss_se"] is None]
    if bare:
        why = "; ".join(f"budget {o['budget']:.4g} has {o['runs']} runs" for o in bare)
        reason = (
            f"no standard error for every optimum ({why}: a parabola through 3 runs leaves no residual to "
            "measure the noise with): give each budget 4 or more runs"
        )
    else:
        reason = (
            "too few of the optima's redraws could be fitted by a law: their noise is too large to say more"
        )
    return {"optima_noise": None, "optima_noise_error": reason}
