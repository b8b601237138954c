"""PNG plots of a scaling study: isoFLOP curves with their parabolas, the compute-optimal frontier, fitted
against observed loss, residuals, and a forecast against its outcome. Written into step folders, where
`schooner report` embeds every top-level PNG.

Figures are built with matplotlib's object API (no pyplot state) and drawn under one lock: steps run in
threads of one runner process, and matplotlib's mathtext parser (log-axis tick labels) is not thread-safe.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from ._approach2 import Approach2Fit
from ._law import ScalingLaw, ScalingRun

__all__ = ["plot_fit", "plot_forecast", "plot_frontier", "plot_isoflops", "plot_residuals"]


_LOCK = threading.Lock()
F = TypeVar("F", bound=Callable[..., None])


def _locked(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        with _LOCK:
            fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _figure(width: float, height: float, cols: int = 1) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, fig.subplots(1, cols)


def _colors(n: int) -> Any:
    from matplotlib import colormaps

    return colormaps["viridis"](np.linspace(0.0, 0.9, max(n, 1)))


def _by_budget(runs: Sequence[ScalingRun]) -> dict[float, list[ScalingRun]]:
    groups: dict[float, list[ScalingRun]] = {}
    for r in sorted(runs, key=lambda r: (r.budget, r.params)):
        groups.setdefault(r.budget, []).append(r)
    return groups


def _save(fig: Any, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)


@_locked
def plot_isoflops(runs: Sequence[ScalingRun], path: str, approach2: Approach2Fit | None = None) -> None:
    """Final loss against parameters, one curve per budget; with `approach2`, its parabolas and vertices."""
    fig, ax = _figure(7, 4.5)
    groups = _by_budget(runs)
    colors = _colors(len(groups))
    parabolas = {p.budget: p for p in approach2.params_parabolas} if approach2 else {}
    for color, (budget, g) in zip(colors, groups.items(), strict=True):
        n = np.array([r.params for r in g])
        ax.plot(n, [r.loss for r in g], "o", color=color, label=f"C = {budget:.2g}")
        if budget in parabolas:
            p = parabolas[budget]
            xs = np.geomspace(n.min() / 1.3, n.max() * 1.3, 100)
            ax.plot(xs, p(xs), "-", color=color, alpha=0.7)
            ax.plot([p.argmin], [p.min_loss], "*", color=color, markersize=12, markeredgecolor="k")
    ax.set_xscale("log")
    ax.set_xlabel("parameters N")
    ax.set_ylabel("final validation loss")
    ax.set_title("isoFLOP curves" + (" and approach-2 parabolas (* = vertex)" if approach2 else ""))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, path)


@_locked
def plot_frontier(
    approach2: Approach2Fit,
    path: str,
    *,
    laws: Mapping[str, ScalingLaw] | None = None,
    up_to: float | None = None,
) -> None:
    """N*(C), D*(C) and L*(C): approach 2's vertices and power laws, and each law's 6ND optimum."""
    fig, axes = _figure(13, 4, cols=3)
    budgets = np.array(approach2.budgets)
    cs = np.geomspace(budgets.min() / 2, max(up_to or 0.0, budgets.max()) * 2, 100)
    vertices = approach2.to_dict()["optima"]
    for ax, key, law, label in (
        (axes[0], "params", approach2.params_law, "N*"),
        (axes[1], "tokens", approach2.tokens_law, "D*"),
        (axes[2], "loss", approach2.loss_law, "L*"),
    ):
        ax.plot(budgets, [v[key] for v in vertices], "o", color="k", label="parabola vertices")
        ax.plot(cs, law(cs), "-", color="C0", label=f"approach 2: {label} ~ C^{law.exponent:.3f}")
        for i, (name, lw) in enumerate((laws or {}).items()):
            if lw.A <= 0 or lw.B <= 0:  # a law without a model (or data) term has no compute-optimal split
                continue
            n_opt, d_opt = lw.optimal_allocation(cs)
            y = {"params": n_opt, "tokens": d_opt, "loss": lw.loss(n_opt, d_opt)}[key]
            ax.plot(cs, y, "--", color=f"C{i + 1}", label=f"{name} (6ND optimum)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("compute C (FLOPs)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle("compute-optimal frontier")
    _save(fig, path)


@_locked
def plot_fit(runs: Sequence[ScalingRun], laws: Mapping[str, ScalingLaw], path: str) -> None:
    """Each law's predicted loss against the observed loss of every run (on the diagonal = perfect)."""
    fig, ax = _figure(5.5, 5)
    obs = np.array([r.loss for r in runs])
    for i, (name, law) in enumerate(laws.items()):
        pred = law.loss([r.params for r in runs], [r.tokens for r in runs])
        ax.plot(obs, pred, "o", color=f"C{i + 1}", alpha=0.8, label=name)
    lo, hi = obs.min() * 0.98, obs.max() * 1.02
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.set_xlabel("observed loss")
    ax.set_ylabel("fitted loss")
    ax.set_title("fitted vs observed")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, path)


@_locked
def plot_residuals(runs: Sequence[ScalingRun], laws: Mapping[str, ScalingLaw], path: str) -> None:
    """Relative residuals (observed / fitted - 1, in %) against parameters, per law."""
    fig, ax = _figure(7, 4)
    n = np.array([r.params for r in runs])
    obs = np.array([r.loss for r in runs])
    for i, (name, law) in enumerate(laws.items()):
        res = 100.0 * (obs / law.loss(n, [r.tokens for r in runs]) - 1.0)
        ax.plot(n, res, "o", color=f"C{i + 1}", alpha=0.8, label=name)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("parameters N")
    ax.set_ylabel("residual (%)")
    ax.set_title("residuals: observed / fitted - 1")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, path)


@_locked
def plot_forecast(
    runs: Sequence[ScalingRun],
    prediction: Mapping[str, Any],
    path: str,
    actual: float | None = None,
    outcome: Mapping[str, Any] | None = None,
) -> None:
    """The runs' best loss per budget, the forecast at its budget with its interval (when it has one), and
    the outcome: the scored run at its own FLOPs, labelled when it is not the forecast's target or started
    before the forecast was written (`outcome`: the score's record)."""
    fig, ax = _figure(7, 4.5)
    for budget, g in _by_budget(runs).items():
        ax.plot([budget] * len(g), [r.loss for r in g], "o", color="0.6", ms=4)
        ax.plot([budget], [min(r.loss for r in g)], "o", color="k")
    c = prediction["target"]["flops"]
    iv = prediction["interval"]
    if iv is None:
        ax.plot(
            [c],
            [prediction["loss"]],
            "s",
            color="C0",
            label=f"forecast ({prediction['method']}, no interval)",
        )
    else:
        ax.errorbar(
            [c], [prediction["loss"]], yerr=[[prediction["loss"] - iv["low"]], [iv["high"] - prediction["loss"]]],
            fmt="s", color="C0", capsize=5, label=f"forecast ({prediction['method']}, {iv['level']:.0%} interval)",
        )  # fmt: skip
    if actual is not None:
        flaws = []
        if outcome is not None and not outcome.get("matches_target", True):
            flaws.append("not the forecast's target")
        if outcome is not None and not outcome.get("registered_before_run", True):
            flaws.append("started before the forecast")
        at = float(outcome.get("run_flops") or c) if outcome is not None else c
        label = f"actual {actual:.4f}" + (f" ({'; '.join(flaws)})" if flaws else "")
        ax.plot([at], [actual], "*", color="C1" if flaws else "C3", ms=14, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("compute C (FLOPs)")
    ax.set_ylabel("final validation loss")
    ax.set_title("forecast" + (" and outcome" if actual is not None else " (registered before the run)"))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, path)
