"""The Delphi fit's law through the optima, L*(C) = E + A C^-alpha, by variable projection, and its bootstrap
over budgets (step 2 and 3 of `_delphi`'s module docstring)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ._bootstrap import Interval

__all__ = ["ALPHA_RANGE", "AsymptoticLaw", "fit_asymptotic_law"]

ALPHA_RANGE = (1e-3, 4.0)
"""The exponents searched (a law steeper than C^-4 or flatter than C^-0.001 is not a loss curve)."""
_GRID = 256
_GOLDEN_STEPS = 60


@dataclass(frozen=True)
class AsymptoticLaw:
    """L(C) = E + A C^-alpha: the loss of the compute-optimal run at compute C."""

    E: float
    """The irreducible loss (the limit at infinite compute)."""
    A: float
    """The scale of the reducible part."""
    alpha: float
    """How fast the reducible part falls with compute."""

    def __call__(self, compute: float | np.ndarray) -> np.ndarray:
        return self.E + self.A * np.asarray(compute, dtype=np.float64) ** (-self.alpha)

    def to_dict(self) -> dict[str, float]:
        return {"E": float(self.E), "A": float(self.A), "alpha": float(self.alpha)}


def _percentiles(values: np.ndarray, level: float) -> Interval:
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return Interval(low=float(low), high=float(high), level=level)


# -- step 2: the law through the optima, by variable projection ----------------------------------------------
def _linear(f: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted least squares of y on [1, f] with E >= 0, per row of w (and per alpha along f's middle axis).

    f: [S, K, n] features x^-alpha; y: [n]; w: [S, 1, n] weights (bootstrap counts). Returns E, a, sse [S, K].
    """
    sw = w.sum(-1)
    sf, sy = (w * f).sum(-1), (w * y).sum(-1)
    sff, sfy = (w * f * f).sum(-1), (w * f * y).sum(-1)
    det = sw * sff - sf**2
    with np.errstate(divide="ignore", invalid="ignore"):
        a = (sw * sfy - sf * sy) / det
        e = (sy - a * sf) / sw
        clamp = e < 0  # the best fit wants a negative floor: take E = 0 and fit A alone
        a = np.where(clamp, sfy / sff, a)
    e = np.where(clamp, 0.0, e)
    sse = (w * (y - e[..., None] - a[..., None] * f) ** 2).sum(-1)
    bad = ~np.isfinite(sse) | ~(a > 0) | ~(det > 1e-12 * sw * sff)
    return e, a, np.where(bad, np.inf, sse)


def _fit_weighted(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(E, a, alpha) minimising the weighted squared error for each row of w: [S, n] -> [S, 3] (NaN: failed).
    y: [n] (one set of losses), or [S, n] (one per row)."""
    if y.ndim == 2:
        y = y[:, None, :]
    lo, hi = np.log(ALPHA_RANGE[0]), np.log(ALPHA_RANGE[1])
    grid = np.linspace(lo, hi, _GRID)
    lx = np.log(x)
    w3 = w[:, None, :]
    _, _, sse = _linear(np.exp(-np.exp(grid)[None, :, None] * lx), y, w3)
    k = np.argmin(sse, axis=1)
    ok = np.isfinite(sse[np.arange(len(w)), k])
    step = grid[1] - grid[0]
    a_lo = np.maximum(grid[k] - step, lo)
    a_hi = np.minimum(grid[k] + step, hi)

    def sse_at(t: np.ndarray) -> np.ndarray:
        return _linear(np.exp(-np.exp(t)[:, None, None] * lx), y, w3)[2][:, 0]

    g = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = a_hi - g * (a_hi - a_lo), a_lo + g * (a_hi - a_lo)
    fc, fd = sse_at(c), sse_at(d)
    for _ in range(_GOLDEN_STEPS):
        left = fc < fd
        a_hi, a_lo = np.where(left, d, a_hi), np.where(left, a_lo, c)
        c_new = a_hi - g * (a_hi - a_lo)
        d_new = a_lo + g * (a_hi - a_lo)
        c, d = np.where(left, c_new, d), np.where(left, c, d_new)
        fc_new, fd_new = sse_at(c), sse_at(d)
        fc, fd = np.where(left, fc_new, fd), np.where(left, fc, fd_new)
    t = 0.5 * (a_lo + a_hi)
    e, a, sse = (v[:, 0] for v in _linear(np.exp(-np.exp(t)[:, None, None] * lx), y, w3))
    ok &= np.isfinite(sse)
    return np.where(ok[:, None], np.stack([e, a, np.exp(t)], axis=1), np.nan)


def fit_asymptotic_law(
    compute: Sequence[float], loss: Sequence[float], weights: Sequence[float] | None = None
) -> AsymptoticLaw:
    """Least-squares L(C) = E + A C^-alpha with E >= 0, A > 0 and alpha in `ALPHA_RANGE`; `weights`: one per
    point, >= 0 (e.g. 1 / loss_se^2 for inverse-variance weights), None for equal weights.

    Raises:
        ValueError: fewer than 3 distinct compute values (with weight > 0), non-positive values, weights that are
            negative, not finite or not one per point, or a loss that does not fall with compute (no A > 0 fits
            better than a constant).
    """
    c = np.asarray(compute, dtype=np.float64)
    y = np.asarray(loss, dtype=np.float64)
    if c.shape != y.shape or c.ndim != 1:
        raise ValueError(
            f"compute and loss must be two 1-D sequences of one length; got {c.shape} and {y.shape}"
        )
    w = np.ones(c.size) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != c.shape or not np.all(np.isfinite(w) & (w >= 0)) or not w.sum() > 0:
        raise ValueError(
            f"fit_asymptotic_law: weights are one finite number >= 0 per point, not all 0; got {np.ravel(w).tolist()}"
        )
    if weights is not None:  # a point of weight 0 is left out (and does not count towards 3 budgets)
        c, y, w = c[w > 0], y[w > 0], w[w > 0] / w[w > 0].mean()
    if not (np.all(np.isfinite(c)) and np.all(c > 0) and np.all(np.isfinite(y)) and np.all(y > 0)):
        raise ValueError(f"the law needs finite positive values; got compute={c.tolist()}, loss={y.tolist()}")
    if np.unique(c).size < 3:
        raise ValueError(
            f"L(C) = E + A C^-alpha has 3 parameters: it needs optima at 3 or more budgets (5 or more for a "
            f"forecast worth trusting); got {np.unique(c).size} ({np.unique(c).tolist()})"
        )
    ref = float(np.exp(np.log(c).mean()))  # C / ref is near 1: x^-alpha stays well scaled
    e, a, alpha = _fit_weighted(c / ref, y, w[None, :])[0]
    if not np.isfinite(alpha):
        raise ValueError(
            f"no law L(C) = E + A C^-alpha with A > 0 fits the optima: their loss does not fall with compute "
            f"(compute={c.tolist()}, loss={y.tolist()})"
        )
    return AsymptoticLaw(E=float(e), A=float(a * ref**alpha), alpha=float(alpha))


def _bootstrap(c: np.ndarray, y: np.ndarray, samples: int, seed: int) -> tuple[np.ndarray, int]:
    """(E, A, alpha) on `samples` resamplings of the optima with replacement; (successes [S, 3], failures)."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, c.size, size=(samples, c.size))
    counts = np.zeros((samples, c.size))
    np.add.at(counts, (np.arange(samples)[:, None], picks), 1.0)
    enough = (counts > 0).sum(axis=1) >= 3
    ref = float(np.exp(np.log(c).mean()))
    fits = _fit_weighted(c / ref, y, counts[enough])
    ok = np.all(np.isfinite(fits), axis=1)
    fits = fits[ok]
    fits[:, 1] *= ref ** fits[:, 2]
    return fits, samples - int(ok.sum())
