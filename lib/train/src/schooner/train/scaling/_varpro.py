"""Variable projection: a grid over (alpha, beta), non-negative least squares for (E, A, B) at each point.

For fixed exponents the Chinchilla law L = E + A N^-alpha + B D^-beta is linear in (E, A, B), so the five-
parameter fit reduces to a two-dimensional search over (alpha, beta) of the residual left by the best
non-negative (E, A, B) (Golub and Pereyra 1973; applied to scaling laws by Open Athena 2026, "Problems with
Chinchilla Approach 2", whose `vpnls` showed it removes approach 3's sensitivity to starting points). The
grid is searched exhaustively, then the best cell is refined by L-BFGS-B on the profile.

The residuals are relative, (L_pred - L) / L, i.e. least squares on log loss to first order, the same scale
approach 3 works on. The NNLS over the grid is exact and vectorised: the optimum of a convex NNLS is the
unconstrained least-squares solution on its support, so among the 7 non-empty supports of (E, A, B) the
feasible (non-negative) solution with the smallest residual is the NNLS solution (checked against
`scipy.optimize.nnls` in the tests).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ._approach3 import ParametricFit
from ._blas import single_threaded_blas
from ._law import ScalingLaw, ScalingRun, degenerate_terms, require_law_data, run_arrays

__all__ = ["VarProConfig", "fit_varpro", "nnls_profile"]


@dataclass(frozen=True)
class VarProConfig:
    """The (alpha, beta) grid searched by `fit_varpro`."""

    low: float = 0.02
    """Smallest exponent on the grid."""
    high: float = 2.0
    """Largest exponent on the grid."""
    points: int = 100
    """Grid points per exponent (linearly spaced)."""
    refine: bool = True
    """Refine the best grid cell with L-BFGS-B on the profile."""

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high:
            raise ValueError(f"VarProConfig needs 0 < low < high; got low={self.low}, high={self.high}")
        if self.points < 2:
            raise ValueError(f"VarProConfig.points must be >= 2; got points={self.points}")

    def grid(self) -> np.ndarray:
        return np.linspace(self.low, self.high, self.points)


def _design(alpha: float, beta: float, n: np.ndarray, d: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(n), n ** (-alpha), d ** (-beta)], axis=-1)


def nnls_profile(alpha: float, beta: float, arr: dict[str, np.ndarray]) -> tuple[float, np.ndarray]:
    """(residual sum of squares, (E, A, B)) of the relative-error NNLS at one (alpha, beta), by scipy."""
    from scipy.optimize import nnls

    w = 1.0 / arr["loss"]
    x = _design(alpha, beta, arr["params"], arr["tokens"]) * w[:, None]
    coef, rnorm = nnls(x, arr["loss"] * w)
    return float(rnorm**2), coef


def _grid_nnls(
    alphas: np.ndarray, betas: np.ndarray, n: np.ndarray, d: np.ndarray, loss: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Exact NNLS at every (alpha, beta) of the grid by enumerating supports: (rss, coef[Ga, Gb, 3])."""
    w = 1.0 / loss
    ga, gb = alphas.size, betas.size
    cols = np.empty((ga, gb, n.size, 3))
    cols[..., 0] = w
    cols[..., 1] = (n[None, :] ** -alphas[:, None] * w)[:, None, :]
    cols[..., 2] = (d[None, :] ** -betas[:, None] * w)[None, :, :]
    y = loss * w
    gram = np.einsum("abik,abil->abkl", cols, cols)
    rhs = np.einsum("abik,i->abk", cols, y)
    yy = float(y @ y)
    best_rss = np.full((ga, gb), yy)
    best_coef = np.zeros((ga, gb, 3))
    for k in (1, 2, 3):
        for support in itertools.combinations(range(3), k):
            s = list(support)
            g = gram[..., s, :][..., :, s]
            r = rhs[..., s]
            ok = np.abs(np.linalg.det(g)) > 1e-12 * np.prod(np.diagonal(g, axis1=-2, axis2=-1), axis=-1)
            c = np.zeros_like(r)
            c[ok] = np.linalg.solve(g[ok], r[ok][..., None])[..., 0]
            rss = yy - np.einsum("abk,abk->ab", c, r)  # at the LS solution, |y - Xc|^2 = y.y - c.X'y
            better = ok & np.all(c >= 0, axis=-1) & (rss < best_rss)
            best_rss = np.where(better, rss, best_rss)
            full = np.zeros((ga, gb, 3))
            full[..., s] = c
            best_coef = np.where(better[..., None], full, best_coef)
    return best_rss, best_coef


def fit_varpro(
    runs: Iterable[ScalingRun] | dict[str, np.ndarray], config: VarProConfig | None = None
) -> ParametricFit:
    """Fit L = E + A/N^alpha + B/D^beta by variable projection: grid over (alpha, beta), NNLS for (E, A, B).

    N and D are divided by their geometric means inside the fit (conditioning only; the law returned is in
    the original units). Needs at least 5 runs at 2 or more budgets (`require_law_data`). The result's
    `on_grid_edge` says an exponent ended at the grid's bound (within 1e-6, relative): the optimum may lie
    beyond it; `degenerate` lists "A" or "B" when that term vanishes (`degenerate_terms`), leaving its exponent
    unidentified.
    """
    config = config or VarProConfig()
    arr = runs if isinstance(runs, dict) else run_arrays(runs)
    require_law_data(arr, "variable projection")
    n0, d0 = float(np.exp(np.log(arr["params"]).mean())), float(np.exp(np.log(arr["tokens"]).mean()))
    scaled = {"params": arr["params"] / n0, "tokens": arr["tokens"] / d0, "loss": arr["loss"]}
    grid = config.grid()
    with single_threaded_blas():
        rss, _ = _grid_nnls(grid, grid, scaled["params"], scaled["tokens"], scaled["loss"])
        i, j = np.unravel_index(int(np.argmin(rss)), rss.shape)
        alpha, beta = float(grid[i]), float(grid[j])
        if config.refine:
            from scipy.optimize import minimize

            res = minimize(
                lambda t: nnls_profile(t[0], t[1], scaled)[0],
                np.array([alpha, beta]),
                method="L-BFGS-B",
                bounds=[(config.low, config.high)] * 2,
                options={"ftol": 1e-15, "gtol": 1e-12},
            )
            if res.fun <= rss[i, j]:
                alpha, beta = float(res.x[0]), float(res.x[1])
        value, (e, a, b) = nnls_profile(alpha, beta, scaled)
    law = ScalingLaw(E=float(e), A=float(a * n0**alpha), B=float(b * d0**beta), alpha=alpha, beta=beta)
    # L-BFGS-B stops within rounding of a bound, not on it: compare with a tolerance
    on_edge = bool(np.any(np.isclose([alpha, beta], [[config.low], [config.high]], rtol=1e-6, atol=1e-9)))
    return ParametricFit(
        law=law,
        method="varpro",
        objective=value,
        starts=grid.size**2,
        converged=1,
        extra={"on_grid_edge": on_edge, "degenerate": degenerate_terms(law, arr["params"], arr["tokens"])},
    )
