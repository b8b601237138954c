"""Chinchilla approach 3: fit L = E + A/N^alpha + B/D^beta by a Huber loss on log loss, with L-BFGS.

Hoffmann et al. (2022, sec. 3.3 and app. D.2) minimise

    sum_i Huber_delta( LSE(a - alpha ln N_i, b - beta ln D_i, e) - ln L_i ),   delta = 1e-3,

over (a, b, e, alpha, beta) with A = e^a, B = e^b, E = e^e, by L-BFGS from a grid of initialisations, and
keep the best. Besiroglu et al. (2024, "Chinchilla Scaling: A replication attempt") show the published fit
stopped before convergence because of a poor choice of loss scale. Here the objective is the mean Huber loss
divided by delta^2 (a residual of delta counts about 1), the gradient is analytic, and the tolerances are
tight, so L-BFGS stops at a stationary point, not on a small absolute decrease of a tiny objective.
By default L-BFGS runs from the 64 grid points with the lowest initial objective rather than all 4,500 (a
slow test checks that the screen finds the full grid's optimum); `top_k=None` runs them all.

With delta far below the noise, the Huber loss is close to the absolute error: the estimate behaves like a
median regression, robust to an outlying run, with about pi/2 times the variance of least squares under
Gaussian noise.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ._blas import single_threaded_blas
from ._law import ScalingLaw, ScalingRun, degenerate_terms, require_law_data, run_arrays

if TYPE_CHECKING:
    from scipy.optimize import OptimizeResult

_Args = tuple[np.ndarray, np.ndarray, np.ndarray, float]
"""The objective's data: (ln N, ln D, ln L, delta)."""

__all__ = ["Approach3Config", "ParametricFit", "fit_approach3", "huber"]

_HOFFMANN_GRID = {
    "alpha": (0.0, 0.5, 1.0, 1.5, 2.0),
    "beta": (0.0, 0.5, 1.0, 1.5, 2.0),
    "e": (-1.0, -0.5, 0.0, 0.5, 1.0),
    "a": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
    "b": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
}


@dataclass(frozen=True)
class Approach3Config:
    """How approach 3 is fitted. The default grid is Hoffmann et al.'s (2022, app. D.2): 4,500 starts."""

    delta: float = 1e-3
    """Huber threshold on the log-loss residual (Hoffmann et al.: 1e-3)."""
    alpha: tuple[float, ...] = _HOFFMANN_GRID["alpha"]
    """Initial values of alpha."""
    beta: tuple[float, ...] = _HOFFMANN_GRID["beta"]
    """Initial values of beta."""
    e: tuple[float, ...] = _HOFFMANN_GRID["e"]
    """Initial values of e = ln E."""
    a: tuple[float, ...] = _HOFFMANN_GRID["a"]
    """Initial values of a = ln A."""
    b: tuple[float, ...] = _HOFFMANN_GRID["b"]
    """Initial values of b = ln B."""
    top_k: int | None = 64
    """Run L-BFGS from the `top_k` grid points with the lowest objective (None: from all of them). Starts
    in one basin share their optimum; the screen keeps the cost of the bootstrap's refits reasonable."""
    max_iterations: int = 2000
    """L-BFGS iterations per start."""
    runaway: float = 1.5
    """An exponent above `runaway` times the larger of 1 and the grid's largest initial value for it (alpha,
    beta) is flagged `runaway` (above 3.0 for Hoffmann's grid, whose largest start is 2.0): L-BFGS left the
    region the grid was laid out to cover, and the steep term it found fits the curvature of a few small runs
    rather than a trend. Published language-model fits have exponents below 1, so a grid of small starts still
    allows up to 1.5."""

    def __post_init__(self) -> None:
        if not self.delta > 0:
            raise ValueError(f"Approach3Config.delta must be > 0; got delta={self.delta!r}")
        for name in ("alpha", "beta", "e", "a", "b"):
            if not getattr(self, name):
                raise ValueError(f"Approach3Config.{name} needs at least one initial value; got ()")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"Approach3Config.top_k must be >= 1 or None; got {self.top_k}")
        if self.max_iterations < 1:
            raise ValueError(f"Approach3Config.max_iterations must be >= 1; got {self.max_iterations}")
        if not self.runaway >= 1:
            raise ValueError(f"Approach3Config.runaway must be >= 1; got runaway={self.runaway!r}")

    def runaway_exponents(self, law: ScalingLaw) -> list[str]:
        """ "alpha" and/or "beta" when the law's exponent exceeds `runaway` times the larger of 1 and the grid's
        largest start for it."""
        bounds = {"alpha": max(1.0, *self.alpha), "beta": max(1.0, *self.beta)}
        return [k for k, top in bounds.items() if getattr(law, k) > self.runaway * top]

    def starts(self) -> np.ndarray:
        """The grid of initial (e, a, b, alpha, beta), one row per start."""
        return np.array(
            list(itertools.product(self.e, self.a, self.b, self.alpha, self.beta)), dtype=np.float64
        )


@dataclass(frozen=True)
class ParametricFit:
    """A fitted law, the objective at the optimum and how it was found."""

    law: ScalingLaw
    method: str
    objective: float
    starts: int
    """Initial points tried."""
    converged: int
    """Starts whose optimizer reported convergence."""
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "law": self.law.to_dict(),
            "a": self.law.a,
            "b": self.law.b,
            "objective": float(self.objective),
            "starts": self.starts,
            "converged": self.converged,
            **self.extra,
        }


def huber(r: np.ndarray, delta: float) -> np.ndarray:
    """The Huber loss: r^2 / 2 where |r| <= delta, delta (|r| - delta / 2) beyond."""
    r = np.abs(r)
    return np.where(r <= delta, 0.5 * r**2, delta * (r - 0.5 * delta))


def _objective(
    theta: np.ndarray, ln_n: np.ndarray, ln_d: np.ndarray, ln_l: np.ndarray, delta: float
) -> tuple[float, np.ndarray]:
    e, a, b, alpha, beta = theta
    terms = np.stack([a - alpha * ln_n, b - beta * ln_d, np.full_like(ln_n, e)])
    top = terms.max(axis=0)
    w = np.exp(terms - top)
    total = w.sum(axis=0)
    r = top + np.log(total) - ln_l
    w /= total  # d LSE / d term
    scale = 1.0 / (r.size * delta**2)
    value = scale * huber(r, delta).sum()
    dr = scale * np.clip(r, -delta, delta)  # d Huber / d r
    grad = np.array(
        [
            (dr * w[2]).sum(),
            (dr * w[0]).sum(),
            (dr * w[1]).sum(),
            -(dr * w[0] * ln_n).sum(),
            -(dr * w[1] * ln_d).sum(),
        ]
    )
    return value, grad


def _minimize(start: np.ndarray, args: _Args, max_iterations: int) -> OptimizeResult:
    from scipy.optimize import minimize

    return minimize(
        _objective,
        start,
        args=args,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iterations, "ftol": 1e-15, "gtol": 1e-10, "maxcor": 20},
    )


def fit_approach3(
    runs: Iterable[ScalingRun] | dict[str, np.ndarray],
    config: Approach3Config | None = None,
    *,
    starts: Sequence[Sequence[float]] | np.ndarray | None = None,
) -> ParametricFit:
    """Approach 3 of Hoffmann et al. (2022): Huber on log loss, L-BFGS from each start, the best kept.

    Args:
        runs: the observations (or `run_arrays` of them).
        config: the Huber threshold and the grid of starts (default: Hoffmann et al.'s).
        starts: explicit initial (e, a, b, alpha, beta) rows instead of the config's grid (the bootstrap
            restarts from the full fit's best solutions this way).

    Needs at least 5 runs at 2 or more budgets (`require_law_data`). The result's `degenerate` lists "A" or
    "B" when that term vanishes at every run (`degenerate_terms`), leaving its exponent unidentified, and its
    `runaway` lists "alpha" or "beta" when that exponent ran beyond `config.runaway` times the larger of 1 and
    the grid's largest start for it (`Approach3Config.runaway_exponents`; explicit `starts` do not change the
    bound).
    """
    config = config or Approach3Config()
    arr = runs if isinstance(runs, dict) else run_arrays(runs)
    require_law_data(arr, "approach 3")
    args = (np.log(arr["params"]), np.log(arr["tokens"]), np.log(arr["loss"]), config.delta)
    if starts is None:
        grid = config.starts()
        if config.top_k is not None and config.top_k < len(grid):
            first = np.array([_objective(x, *args)[0] for x in grid])
            grid = grid[np.argsort(first, kind="stable")[: config.top_k]]
    else:
        grid = np.atleast_2d(np.asarray(starts, dtype=np.float64))
    best, converged, ends = None, 0, []
    with single_threaded_blas():
        for x0 in grid:
            res = _minimize(x0, args, config.max_iterations)
            converged += bool(res.success)
            ends.append((float(res.fun), res.x))
            if np.all(np.isfinite(res.x)) and (best is None or res.fun < best.fun):
                best = res
    if best is None:
        raise ValueError("approach 3: no start reached a finite optimum")
    e, a, b, alpha, beta = best.x
    if max(e, a, b) > 700:  # exp would overflow: the optimizer ran off to an unbounded A, B or E
        raise ValueError(
            f"approach 3 diverged (ln E, ln A, ln B = {e:.3g}, {a:.3g}, {b:.3g}): the runs do not constrain the law"
        )
    if alpha < 0 or beta < 0:
        raise ValueError(
            f"approach 3 converged to a negative exponent (alpha={alpha:.3g}, beta={beta:.3g}): the runs do not "
            "constrain the law; add budgets or sizes"
        )
    law = ScalingLaw(
        E=float(np.exp(e)), A=float(np.exp(a)), B=float(np.exp(b)), alpha=float(alpha), beta=float(beta)
    )
    ends.sort(key=lambda t: t[0])
    return ParametricFit(
        law=law,
        method="approach3",
        objective=float(best.fun),
        starts=len(grid),
        converged=converged,
        extra={
            "delta": config.delta,
            "best_starts": [x.tolist() for _, x in ends[:8]],
            "degenerate": degenerate_terms(law, arr["params"], arr["tokens"]),
            "runaway": config.runaway_exponents(law),
        },
    )
