"""The Delphi fit: isoFLOP optima from parabolas in log tokens, an asymptotic power law in compute through them,
bootstrap intervals over the budgets, and the price of training off the optimum.

Marin's Delphi suite ("Scaling Laws That Extrapolate 300x Past the Fit", Open Athena, 2026) forecasts from
the compute-optimal points alone:

1. Per budget C, the final losses of its runs against u = ln D (training tokens) are fitted with a parabola
   L = c2 u^2 + c1 u + c0; its vertex is the budget's optimum (D*(C), L*(C)). N*(C) is read off the line
   ln N against ln D through the budget's runs (on an isoFLOP line N is C / (k D)).
2. Through the optima, L*(C) = E + A C^-alpha: least squares in the loss, solved exactly by variable
   projection (for a fixed alpha the best E >= 0 and A > 0 are a weighted linear fit, so only alpha is
   searched: a grid in ln alpha, then golden-section refinement). No starting point to choose, no local
   minima from one.
3. Intervals: the budgets' optima are resampled with replacement (whole budgets, never runs: the runs of a
   budget share their data order, schedule and parabola, so they are not independent evidence) and the law
   refitted on each replicate; a forecast's interval is the central percentile interval of the replicates'
   predictions. All replicates are fitted at once (the closed form is vectorised over them), so thousands
   cost milliseconds.
4. The precision the sweep allows: each optimum's loss has a standard error from its parabola's residuals
   (the delta method on L* = c0 - c1^2 / (4 c2); it needs 4 or more runs; with seeds, `parabola_lack_of_fit`
   says how much of the residual is the curve not being a parabola, which seeds do not average out), and
   `optima_noise` refits the same law on optima redrawn with those errors: the spread of its forecast at C is
   what the optima's own noise leaves (the law's form is taken as right: a wrong form adds its own error). A
   forecast cannot be trusted to closer than that; the bootstrap over budgets sees the same noise only through
   the optima's scatter around the law, five budgets at a time.
5. The over-training penalty: per budget, the parabola's loss at m x D* (m = 0.5 and 2 by default) less
   L*, fitted against compute with a power law and extrapolated, so a run that trains a smaller model for
   longer (or a larger one for shorter) can be priced before it starts (`DelphiFit.forecast` gives it in
   nats and relative to the forecast loss). A parabola in ln D is symmetric, so m and 1/m cost the same:
   the extra loss is c2 (ln m)^2.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._approach2 import Parabola, PowerLaw, fit_power_law
from ._bootstrap import Interval, replicates_shortfall
from ._delphi_law import AsymptoticLaw, _bootstrap, _percentiles, fit_asymptotic_law
from ._delphi_precision import (
    _least_squares_parabola,
    forecast_noise,
    optima_noise,
    parabola_lack_of_fit,
    vertex_loss_se,
)
from ._law import ScalingRun, budget_groups

__all__ = [
    "AsymptoticLaw",
    "BudgetOptimum",
    "DelphiFit",
    "OvertrainingPenalty",
    "budget_optima",
    "fit_asymptotic_law",
    "fit_delphi",
    "fit_parabola",
    "forecast_noise",
    "optima_noise",
    "overtraining_penalty",
    "parabola_lack_of_fit",
    "plot_delphi",
    "vertex_loss_se",
]


@dataclass(frozen=True)
class BudgetOptimum:
    """One budget's compute-optimal point, from the parabola through its runs."""

    budget: float
    """The isoFLOP group's compute (FLOPs)."""
    tokens: float
    """D*: the vertex of the parabola in ln D."""
    loss: float
    """L*: the parabola's loss at its vertex."""
    params: float
    """N*: the line ln N against ln D through the budget's runs, at D*."""
    parabola: Parabola
    """L against ln D (`Parabola` with x = tokens)."""
    runs: int
    """How many runs the parabola went through."""
    loss_se: float | None = None
    """The standard error of `loss` from the parabola's residuals (`vertex_loss_se`; None: 3 runs, no
    residual left to measure it with). Runs of one budget share their data order: noise they share is not
    in it."""
    lack_of_fit: dict[str, float] | None = None
    """With repeated runs at a token count (seeds): `{"pure_error_sd", "F", "p"}`, the parabola's residuals split
    into the seeds' scatter (pure error) and the rest, and the F test of the rest (`parabola_lack_of_fit`). A
    small p says the isoFLOP curve is not a parabola over the grid: its vertex is biased by an amount more
    seeds do not shrink (narrow the grid's spread). None without repeats or with fewer than 4 token counts."""

    def loss_at(self, tokens: float | np.ndarray) -> np.ndarray:
        """The parabola's loss at `tokens` (an interpolation inside the sampled range, else a Taylor guess)."""
        return self.parabola(tokens)

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "tokens": self.tokens,
            "loss": self.loss,
            "params": self.params,
            "runs": self.runs,
            "parabola": self.parabola.to_dict(),
            "loss_se": self.loss_se,
            "lack_of_fit": self.lack_of_fit,
        }


@dataclass(frozen=True)
class OvertrainingPenalty:
    """The extra loss of training with m x D* tokens (the model resized to keep the budget) instead of D*."""

    multiplier: float
    """m: the tokens as a multiple of the optimum's (0.5: half the tokens, a model about twice as large)."""
    budgets: tuple[float, ...]
    per_budget: tuple[float, ...]
    """L(m D*) - L* from each budget's parabola: c2 (ln m)^2 (nats)."""
    law: PowerLaw | None
    """The extra loss against compute (None: fewer than two budgets, or a budget whose penalty is 0)."""

    def __call__(self, compute: float | np.ndarray) -> np.ndarray:
        """The extra loss at `compute` (extrapolated beyond the budgets by the power law)."""
        if self.law is None:
            return np.full(np.shape(compute), float(np.mean(self.per_budget)))
        return np.asarray(self.law(compute))

    def to_dict(self) -> dict[str, Any]:
        return {
            "multiplier": self.multiplier,
            "budgets": list(self.budgets),
            "per_budget": list(self.per_budget),
            "law": None if self.law is None else self.law.to_dict(),
        }


@dataclass(frozen=True)
class DelphiFit:
    """The optima, the law through them, its bootstrap replicates and the over-training penalties."""

    optima: tuple[BudgetOptimum, ...]
    law: AsymptoticLaw
    tokens_law: PowerLaw
    """D*(C) through the optima."""
    params_law: PowerLaw
    """N*(C) through the optima."""
    replicates: np.ndarray = field(repr=False)
    """[successful replicates, 3]: (E, A, alpha) refitted on resampled budgets."""
    failed: int
    """Replicates that could not be fitted (fewer than three distinct budgets, a loss that rises with C)."""
    level: float
    """The coverage intervals aim at (0.9: the 5th to the 95th percentile)."""
    penalties: tuple[OvertrainingPenalty, ...]
    dropped: tuple[dict[str, Any], ...] = ()
    """Budgets left out (`fit_delphi(skip_unbracketed=True)`): `{"budget", "runs", "reason"}` each."""

    @property
    def budgets(self) -> list[float]:
        return [o.budget for o in self.optima]

    @property
    def interval_problem(self) -> str | None:
        """Why there are no intervals (too few replicates succeeded), or None."""
        return replicates_shortfall(len(self.replicates), len(self.replicates) + self.failed)

    def predict(self, compute: float | np.ndarray) -> np.ndarray:
        """The law's loss at `compute`."""
        return self.law(compute)

    def interval(self, compute: float, level: float | None = None) -> Interval | None:
        """The central bootstrap interval of the forecast at `compute` (None: too few replicates)."""
        if self.interval_problem is not None:
            return None
        level = self.level if level is None else level
        e, a, alpha = self.replicates.T
        return _percentiles(e + a * float(compute) ** (-alpha), level)

    def parameter_intervals(self) -> dict[str, Interval] | None:
        """Bootstrap intervals of E, A and alpha (None: too few replicates)."""
        if self.interval_problem is not None:
            return None
        return {k: _percentiles(self.replicates[:, i], self.level) for i, k in enumerate(("E", "A", "alpha"))}

    def forecast(self, compute: float) -> dict[str, Any]:
        """What to expect at `compute`: the optimal loss with its interval, the spread the optima's own noise
        leaves (`optima_noise`; when None, `optima_noise_error` says why), D*, N*, and each penalty."""
        iv = self.interval(compute)
        loss = float(self.predict(compute))
        return {
            "compute": float(compute),
            "loss": loss,
            "interval": None if iv is None else iv.to_dict(),
            **forecast_noise([o.to_dict() for o in self.optima], compute, level=self.level),
            "tokens": float(self.tokens_law(compute)),
            "params": float(self.params_law(compute)),
            "penalties": {
                f"{p.multiplier:g}x tokens": {
                    "extra_loss": float(p(compute)),
                    "relative": float(p(compute)) / loss,
                    "loss": loss + float(p(compute)),
                }
                for p in self.penalties
            },
        }

    def to_dict(self) -> dict[str, Any]:
        intervals = self.parameter_intervals()
        return {
            "method": "delphi",
            "law": self.law.to_dict(),
            "intervals": None if intervals is None else {k: v.to_dict() for k, v in intervals.items()},
            "interval_problem": self.interval_problem,
            "replicates": int(len(self.replicates)),
            "failed": int(self.failed),
            "tokens_law": self.tokens_law.to_dict(),
            "params_law": self.params_law.to_dict(),
            "optima": [o.to_dict() for o in self.optima],
            "penalties": [p.to_dict() for p in self.penalties],
            "dropped": list(self.dropped),
        }


# -- step 1: a parabola per budget --------------------------------------------------------------------------
def _check_runs(runs: Sequence[Any]) -> None:
    for r in runs:
        for name in ("budget", "tokens", "params", "loss"):
            v = getattr(r, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                budget = f"{r.budget:.4g}" if isinstance(r.budget, int | float) else repr(r.budget)
                raise ValueError(
                    f"the Delphi fit needs finite positive values; the run {getattr(r, 'name', '')!r} at budget "
                    f"{budget} has {name}={v!r}: drop the run or fix its record"
                )
    # A run counted twice shrinks its budget's standard error and reads as a seed that agrees exactly (a pure
    # error of 0 in the lack of fit): by name when runs carry one, else by the whole record.
    seen: dict[Any, Any] = {}
    for r in runs:
        name = getattr(r, "name", "")
        for key in ((("name", name),) if name else ()) + ((r.budget, r.tokens, r.params, r.loss),):
            if key in seen:
                record = f"(tokens={r.tokens:.6g}, loss={r.loss!r})"
                what = (
                    f"the run {name!r} at budget {r.budget:.4g}"
                    if name
                    else f"a run at budget {r.budget:.4g} {record}"
                )
                first = getattr(seen[key], "name", "")
                if first != name:  # the same record under two names
                    what += f" (as {first!r} too)" if first else f" {record} (once unnamed)"
                raise ValueError(
                    f"the Delphi fit counts each run once; {what} is given twice: drop the copy (a seed of a run "
                    "is a run of its own, with its own name and loss)"
                )
            seen[key] = r


def fit_parabola(budget: float, tokens: np.ndarray, loss: np.ndarray) -> Parabola:
    """Least-squares L = c2 u^2 + c1 u + c0 in u = ln(tokens), checked to bracket a minimum.

    Raises:
        ValueError: fewer than 3 distinct token counts, a parabola that opens downwards, or a vertex outside
            the sampled tokens (the runs do not bracket the optimum); the message names the budget.
    """
    tokens = np.asarray(tokens, dtype=np.float64)
    loss = np.asarray(loss, dtype=np.float64)
    distinct = np.unique(tokens)
    if distinct.size < 3:
        raise ValueError(
            f"the Delphi fit needs at least 3 runs with distinct token counts per budget; budget {budget:.4g} "
            f"has {tokens.size} run(s) at {distinct.size} token count(s) ({distinct.tolist()}): add runs to its "
            "isoFLOP grid"
        )
    u = np.log(tokens)
    mid, design, (q2, q1, q0) = _least_squares_parabola(u, loss)
    # Back to the raw u: q2 (u-m)^2 + q1 (u-m) + q0.
    c2, c1, c0 = q2, q1 - 2.0 * q2 * mid, q2 * mid**2 - q1 * mid + q0
    if not q2 > 0:
        raise ValueError(
            f"the isoFLOP parabola in log tokens at budget {budget:.4g} opens downwards (c2={q2:.3g}): the runs "
            "do not bracket a minimum; centre the grid on the optimum or widen it"
        )
    vertex = mid - q1 / (2.0 * q2)
    if not u.min() <= vertex <= u.max():
        side = "below" if vertex < u.min() else "above"
        raise ValueError(
            f"the isoFLOP runs at budget {budget:.4g} do not bracket a minimum: the parabola's optimum "
            f"D={math.exp(min(vertex, 700.0)):.4g} tokens lies {side} the sampled range "
            f"[{tokens.min():.4g}, {tokens.max():.4g}]; shift this budget's grid towards "
            f"{'fewer' if side == 'below' else 'more'} tokens so that the lowest loss is not at an edge"
        )
    return Parabola(budget=float(budget), c2=float(c2), c1=float(c1), c0=float(c0))


def budget_optima(runs: Iterable[ScalingRun]) -> list[BudgetOptimum]:
    """The compute-optimal point of every budget (budgets within a relative 1e-6 are one group), ascending."""
    optima, _ = _optima(runs, skip_unbracketed=False)
    return optima


def _optima(
    runs: Iterable[ScalingRun], *, skip_unbracketed: bool
) -> tuple[list[BudgetOptimum], list[dict[str, Any]]]:
    """(the optima, the budgets dropped with the reason): with `skip_unbracketed`, a budget whose parabola
    fails (too few runs, opens downwards, vertex outside the runs) is dropped and recorded, not raised."""
    runs = list(runs)
    if not runs:
        raise ValueError("the Delphi fit needs runs; got none")
    _check_runs(runs)
    out, dropped = [], []
    for budget, idx in budget_groups(r.budget for r in runs):
        g = [runs[i] for i in idx]
        try:
            out.append(_optimum(budget, g))
        except ValueError as e:
            if not skip_unbracketed:
                raise
            dropped.append({"budget": float(budget), "runs": len(g), "reason": str(e)})
    return out, dropped


def _optimum(budget: float, g: Sequence[ScalingRun]) -> BudgetOptimum:
    if len(g) < 3:
        raise ValueError(
            f"the Delphi fit needs at least 3 runs per budget (a parabola has 3 coefficients); budget "
            f"{budget:.4g} has {len(g)} ({', '.join(repr(r.name) for r in g)}): add runs or drop the budget"
        )
    tokens = np.array([r.tokens for r in g])
    p = fit_parabola(budget, tokens, np.array([r.loss for r in g]))
    lt, ln = np.log(tokens), np.log([r.params for r in g])
    slope, intercept = np.polyfit(lt, ln, 1) if np.ptp(lt) > 0 else (0.0, float(ln.mean()))
    d_opt = p.argmin
    return BudgetOptimum(
        budget=float(budget),
        tokens=d_opt,
        loss=p.min_loss,
        params=float(np.exp(intercept + slope * math.log(d_opt))),
        parabola=p,
        runs=len(g),
        loss_se=vertex_loss_se(tokens, [r.loss for r in g]),
        lack_of_fit=parabola_lack_of_fit(tokens, [r.loss for r in g]),
    )


# -- step 5: the penalty for leaving the optimum ----------------------------------------------------------------
def overtraining_penalty(optima: Sequence[BudgetOptimum], multiplier: float) -> OvertrainingPenalty:
    """The extra loss of training with `multiplier` x D* tokens (the model resized to keep the budget), per
    budget read off its parabola (c2 (ln m)^2), and a power law of it against compute to extrapolate with
    (None when fewer than two budgets, or a penalty of 0). `fit_delphi` prices `multipliers` with this;
    `plot_delphi` draws them (its third panel)."""
    if not (isinstance(multiplier, int | float) and multiplier > 0 and multiplier != 1):
        raise ValueError(f"overtraining_penalty: multiplier must be positive and not 1; got {multiplier!r}")
    return _penalty(optima, float(multiplier))


def _penalty(optima: Sequence[BudgetOptimum], m: float) -> OvertrainingPenalty:
    extra = tuple(float(o.loss_at(m * o.tokens) - o.loss) for o in optima)
    budgets = tuple(o.budget for o in optima)
    law = fit_power_law(budgets, extra) if len(optima) >= 2 and all(x > 0 for x in extra) else None
    return OvertrainingPenalty(multiplier=float(m), budgets=budgets, per_budget=extra, law=law)


def fit_delphi(
    runs: Iterable[ScalingRun],
    *,
    samples: int = 1000,
    seed: int = 0,
    level: float = 0.9,
    multipliers: Sequence[float] = (0.5, 2.0),
    skip_unbracketed: bool = False,
) -> DelphiFit:
    """The Delphi fit of isoFLOP runs (see the module docstring).

    Args:
        runs: finished runs (`ScalingRun`: budget, tokens, params, loss), at least 3 per budget and at least
            3 budgets (5 or more for a forecast worth trusting).
        samples: bootstrap replicates (resampled budgets).
        seed: the bootstrap's seed (same seed, same intervals).
        level: the coverage of the intervals.
        multipliers: token multiples of the optimum at which the over-training penalty is priced.
        skip_unbracketed: drop a budget whose parabola cannot be fitted (too few runs, opening downwards, a
            vertex outside its runs) instead of raising; each dropped budget and why is in `DelphiFit.dropped`.

    Raises:
        ValueError: a run with a non-positive or non-finite value, a run given twice (by name, or by its whole
            record when unnamed), a budget with fewer than 3 runs (or 3
            distinct token counts), a budget whose runs do not bracket a minimum (each names the budget),
            fewer than 3 budgets, or optima whose loss does not fall with compute.
    """
    if samples < 1:
        raise ValueError(f"fit_delphi needs samples >= 1; got samples={samples}")
    if not 0 < level < 1:
        raise ValueError(f"fit_delphi level must be in (0, 1); got level={level}")
    bad = [m for m in multipliers if not (isinstance(m, int | float) and m > 0 and m != 1)]
    if bad:
        raise ValueError(f"fit_delphi multipliers must be positive and not 1; got {bad}")
    optima, dropped = _optima(runs, skip_unbracketed=skip_unbracketed)
    c = np.array([o.budget for o in optima])
    y = np.array([o.loss for o in optima])
    law = fit_asymptotic_law(c.tolist(), y.tolist())
    replicates, failed = _bootstrap(c, y, samples, seed)
    return DelphiFit(
        optima=tuple(optima),
        law=law,
        tokens_law=fit_power_law(c, [o.tokens for o in optima]),
        params_law=fit_power_law(c, [o.params for o in optima]),
        replicates=replicates,
        failed=failed,
        level=float(level),
        penalties=tuple(_penalty(optima, float(m)) for m in multipliers),
        dropped=tuple(dropped),
    )


# -- the plot ----------------------------------------------------------------------------------------------------
def plot_delphi(
    fit: DelphiFit,
    path: str,
    *,
    runs: Sequence[ScalingRun] = (),
    held_out: Sequence[tuple[float, float]] = (),
    up_to: float | None = None,
) -> None:
    """A PNG of the fit: the isoFLOP parabolas in log tokens with their minima (and `runs`), the law through
    the optima with its bootstrap band out to `up_to` and the `held_out` (compute, loss) points (e.g. one
    per seed), and the over-training penalties against compute."""
    from ._plots import _locked

    _locked(_draw)(fit, path, runs, held_out, up_to)


def _draw(
    fit: DelphiFit,
    path: str,
    runs: Sequence[ScalingRun],
    held_out: Sequence[tuple[float, float]],
    up_to: float | None,
) -> None:
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.5))
    ax_iso, ax_law, ax_pen = fig.subplots(1, 3)
    colors = colormaps["viridis"](np.linspace(0.0, 0.9, max(len(fit.optima), 1)))
    groups = {b: [runs[i] for i in idx] for b, idx in budget_groups(r.budget for r in runs)} if runs else {}
    for color, o in zip(colors, fit.optima, strict=True):
        mine = next((g for b, g in groups.items() if math.isclose(b, o.budget, rel_tol=1e-6)), [])
        if mine:
            ax_iso.plot([r.tokens for r in mine], [r.loss for r in mine], "o", color=color, ms=4)
        d = np.geomspace(o.tokens / 4, o.tokens * 4, 100)
        if mine:
            lo, hi = min(r.tokens for r in mine), max(r.tokens for r in mine)
            d = np.geomspace(lo / 1.3, hi * 1.3, 100)
        ax_iso.plot(d, o.loss_at(d), "-", color=color, alpha=0.7, label=f"C = {o.budget:.2g}")
        ax_iso.plot([o.tokens], [o.loss], "*", color=color, ms=12, markeredgecolor="k")
    ax_iso.set(
        xscale="log", xlabel="training tokens D", ylabel="final loss", title="isoFLOP parabolas (* = optimum)"
    )
    ax_iso.legend(fontsize=7)

    budgets = np.array(fit.budgets)
    top = max([up_to or 0.0, budgets.max(), *[c for c, _ in held_out]])
    cs = np.geomspace(budgets.min() / 2, top * 2, 200)
    if fit.interval_problem is None:
        e, a, alpha = fit.replicates.T
        preds = e[:, None] + a[:, None] * cs[None, :] ** (-alpha[:, None])
        tail = (1.0 - fit.level) / 2.0 * 100.0
        lo, hi = np.percentile(preds, [tail, 100.0 - tail], axis=0)
        ax_law.fill_between(cs, lo, hi, color="C0", alpha=0.2, label=f"{fit.level:.0%} bootstrap band")
    law = fit.law
    ax_law.plot(cs, law(cs), "-", color="C0", label=f"L = {law.E:.3f} + {law.A:.3g} C^-{law.alpha:.3f}")
    ses = [o.loss_se for o in fit.optima]
    ax_law.errorbar(
        budgets, [o.loss for o in fit.optima], yerr=None if None in ses else ses, fmt="o", color="k",
        capsize=3, label="fitted optima" + ("" if None in ses else " (±1 se)"),
    )  # fmt: skip
    if held_out:
        ax_law.plot(*zip(*held_out, strict=True), "*", color="C3", ms=11, label="held-out runs")
    ax_law.set(xscale="log", xlabel="compute C (FLOPs)", ylabel="optimal loss L*", title="asymptotic law")
    ax_law.legend(fontsize=7)

    for i, p in enumerate(fit.penalties):
        rel = 100 * np.array(p.per_budget) / np.array([o.loss for o in fit.optima])
        marker, style = ("o", "x", "s", "+")[i % 4], ("-", "--", "-.", ":")[i % 4]  # 0.5x and 2x coincide
        ax_pen.plot(p.budgets, rel, marker, color=f"C{i}", label=f"{p.multiplier:g}x D*")
        ax_pen.plot(cs, 100 * p(cs) / law(cs), style, color=f"C{i}", alpha=0.6)
    ax_pen.set(
        xscale="log", xlabel="compute C (FLOPs)", ylabel="loss above L* (%)", title="off-optimum penalty"
    )
    ax_pen.legend(fontsize=7)
    for ax in (ax_iso, ax_law, ax_pen):
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
