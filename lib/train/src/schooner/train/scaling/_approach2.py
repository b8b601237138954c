"""Chinchilla approach 2: a parabola per isoFLOP budget, its vertex, and power laws through the vertices.

Hoffmann et al. (2022, sec. 3.2): for each compute budget C, fit the final loss of runs of different sizes
with a parabola in log N (and, separately, in log D); the vertex gives the compute-optimal N*(C) and D*(C);
power laws N* = k C^a and D* = k' C^b through the vertices give the allocation rule. The minimum losses
L*(C) are fitted with a power law in compute too (the "compute frontier", as Kaplan et al. 2020 fit
L(C_min)), which gives a forecast of the best achievable loss at a larger budget.

The parabola is a second-order Taylor approximation of the isoFLOP curve around its minimum. On a grid
that is wide, or not centred on the optimum, and on a loss surface with alpha != beta, the vertex is biased
and so are the exponents (Open Athena 2026, "Problems with Chinchilla Approach 2"); approach 3 and variable
projection (`fit_approach3`, `fit_varpro`) do not share this bias.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ._law import ScalingRun, budget_groups

__all__ = ["Approach2Fit", "Parabola", "PowerLaw", "fit_approach2", "fit_power_law"]


@dataclass(frozen=True)
class PowerLaw:
    """y = coefficient * x^exponent, fitted by least squares on log y against log x."""

    coefficient: float
    exponent: float

    def __call__(self, x: float | np.ndarray) -> float | np.ndarray:
        return self.coefficient * np.asarray(x, dtype=np.float64) ** self.exponent

    def to_dict(self) -> dict[str, float]:
        return {"coefficient": float(self.coefficient), "exponent": float(self.exponent)}


def fit_power_law(x: Iterable[float], y: Iterable[float]) -> PowerLaw:
    """Least-squares line through (log x, log y); needs two distinct x and positive values."""
    xs, ys = np.asarray(list(x), dtype=np.float64), np.asarray(list(y), dtype=np.float64)
    if not (np.all(xs > 0) and np.all(ys > 0)):
        raise ValueError(f"a power law needs positive values; got x={xs.tolist()}, y={ys.tolist()}")
    lx, ly = np.log(xs), np.log(ys)
    if lx.size < 2 or np.ptp(lx) == 0:
        raise ValueError(f"a power law needs at least two distinct x values; got x={np.exp(lx).tolist()}")
    slope, intercept = np.polyfit(lx, ly, 1)
    return PowerLaw(coefficient=float(np.exp(intercept)), exponent=float(slope))


@dataclass(frozen=True)
class Parabola:
    """L = c2 u^2 + c1 u + c0 with u = ln(x), fitted to one budget's runs; its vertex is the optimum."""

    budget: float
    c2: float
    c1: float
    c0: float

    @property
    def argmin(self) -> float:
        """x at the vertex (the optimal N or D)."""
        return float(np.exp(-self.c1 / (2.0 * self.c2)))

    @property
    def min_loss(self) -> float:
        """The loss at the vertex."""
        return float(self.c0 - self.c1**2 / (4.0 * self.c2))

    def __call__(self, x: float | np.ndarray) -> np.ndarray:
        u = np.log(np.asarray(x, dtype=np.float64))
        return self.c2 * u**2 + self.c1 * u + self.c0

    def to_dict(self) -> dict[str, float]:
        return {"budget": self.budget, "c2": self.c2, "c1": self.c1, "c0": self.c0}


def _parabola(budget: float, x: np.ndarray, loss: np.ndarray, what: str) -> Parabola:
    if np.unique(x).size < 3:
        raise ValueError(
            f"approach 2 needs at least 3 distinct {what} per budget; budget {budget:.3g} has "
            f"{np.unique(x).size} ({sorted(set(x.tolist()))}): add sizes to the isoFLOP grid"
        )
    c2, c1, c0 = np.polyfit(np.log(x), loss, 2)
    if not c2 > 0:
        raise ValueError(
            f"the isoFLOP parabola in log {what} at budget {budget:.3g} opens downwards (c2={c2:.3g}): the "
            "runs do not bracket a minimum; centre the grid on the optimum or widen it"
        )
    vertex = -c1 / (2.0 * c2)
    if abs(vertex) > 700:  # exp would overflow: a nearly flat parabola puts its vertex absurdly far away
        raise ValueError(
            f"the isoFLOP parabola in log {what} at budget {budget:.3g} is nearly flat (vertex at ln {what} = "
            f"{vertex:.3g}): the runs do not bracket a minimum; centre the grid on the optimum or widen it"
        )
    lo, hi = float(x.min()), float(x.max())
    if not np.log(lo) <= vertex <= np.log(hi):
        # A convex fit to runs that all lie on one side of the optimum (the loss rises or falls across the
        # whole group) still has a vertex, but it is an extrapolation of a Taylor approximation.
        side, fix = ("below", "smaller") if vertex < np.log(lo) else ("above", "larger")
        raise ValueError(
            f"the isoFLOP runs at budget {budget:.3g} do not bracket a minimum: the parabola's optimum "
            f"{what}={np.exp(vertex):.3g} lies {side} the sampled range {what}=[{lo:.3g}, {hi:.3g}] (the loss "
            f"{'rises' if side == 'below' else 'falls'} across the runs); shift this budget's grid towards "
            f"{fix} {what} (a different centre, or a wider span) so that "
            "the lowest loss is not at an edge"
        )
    return Parabola(budget=float(budget), c2=float(c2), c1=float(c1), c0=float(c0))


@dataclass(frozen=True)
class Approach2Fit:
    """Per-budget parabolas in log N and log D, and power laws through their vertices."""

    params_parabolas: tuple[Parabola, ...]
    tokens_parabolas: tuple[Parabola, ...]
    params_law: PowerLaw
    """N*(C) = k C^a."""
    tokens_law: PowerLaw
    """D*(C) = k' C^b."""
    loss_law: PowerLaw
    """L*(C) = k'' C^(-gamma): the compute frontier through the parabolas' minima (from the N parabolas)."""

    @property
    def a(self) -> float:
        """Exponent of N*(C)."""
        return self.params_law.exponent

    @property
    def b(self) -> float:
        """Exponent of D*(C)."""
        return self.tokens_law.exponent

    @property
    def budgets(self) -> list[float]:
        return [p.budget for p in self.params_parabolas]

    def optimum(self, budget: float) -> dict[str, float]:
        """N*, D* and the frontier loss L* at `budget` from the power laws."""
        return {
            "params": float(self.params_law(budget)),
            "tokens": float(self.tokens_law(budget)),
            "loss": float(self.loss_law(budget)),
        }

    def to_dict(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "params_law": self.params_law.to_dict(),
            "tokens_law": self.tokens_law.to_dict(),
            "loss_law": self.loss_law.to_dict(),
            "params_parabolas": [p.to_dict() for p in self.params_parabolas],
            "tokens_parabolas": [p.to_dict() for p in self.tokens_parabolas],
            "optima": [
                {"budget": p.budget, "params": p.argmin, "tokens": q.argmin, "loss": p.min_loss}
                for p, q in zip(self.params_parabolas, self.tokens_parabolas, strict=True)
            ],
        }


def fit_approach2(runs: Iterable[ScalingRun]) -> Approach2Fit:
    """Chinchilla approach 2 (Hoffmann et al. 2022, sec. 3.2) on runs grouped by their `budget` (budgets within
    a relative 1e-6 of each other are one group, `budget_groups`; the group is labelled by its smallest).

    Raises:
        ValueError: fewer than two budgets, fewer than three sizes in a budget, or a budget whose runs do not
            bracket a minimum: a parabola that opens downwards, or a vertex outside the sampled N (or D)
            range (the message names the budget, the side the optimum lies on and how to move the grid).
    """
    runs = list(runs)
    groups = [(b, [runs[i] for i in idx]) for b, idx in budget_groups(r.budget for r in runs)]
    if len(groups) < 2:
        raise ValueError(
            f"approach 2 needs runs at two or more budgets; got budgets {[b for b, _ in groups]}"
        )
    by_n, by_d = [], []
    for budget, g in groups:
        loss = np.array([r.loss for r in g])
        by_n.append(_parabola(budget, np.array([r.params for r in g], dtype=np.float64), loss, "N"))
        by_d.append(_parabola(budget, np.array([r.tokens for r in g], dtype=np.float64), loss, "D"))
    budgets = [p.budget for p in by_n]
    return Approach2Fit(
        params_parabolas=tuple(by_n),
        tokens_parabolas=tuple(by_d),
        params_law=fit_power_law(budgets, [p.argmin for p in by_n]),
        tokens_law=fit_power_law(budgets, [p.argmin for p in by_d]),
        loss_law=fit_power_law(budgets, [p.min_loss for p in by_n]),
    )
