"""The Chinchilla loss law and the observations scaling fits read: one record per training run.

The parametric form is Hoffmann et al. (2022, "Training Compute-Optimal Large Language Models", eq. 2):

    L(N, D) = E + A / N^alpha + B / D^beta

with N the parameters and D the training tokens. Under the approximation C = 6 N D its compute-optimal
allocation is N*(C) = G (C/6)^a and D*(C) = (C/6)^b / G with a = beta / (alpha + beta), b = alpha / (alpha +
beta) and G = (alpha A / (beta B))^(1 / (alpha + beta)) (their eq. 4). `CHINCHILLA` holds the published fit
(their eq. 10), which Besiroglu et al. (2024, "Chinchilla Scaling: A replication attempt") could not
reproduce from the paper's own data: they trace it to an optimizer stopped before convergence and to rounding.
`synthetic_runs` draws isoFLOP observations from a known law, to check a fit or a sweep design before
spending compute on it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = [
    "BUDGET_RTOL",
    "CHINCHILLA",
    "ScalingLaw",
    "ScalingRun",
    "budget_groups",
    "degenerate_terms",
    "require_law_data",
    "run_arrays",
    "synthetic_runs",
]

BUDGET_RTOL = 1e-6
"""Budgets within this relative distance of each other are one isoFLOP group (runs whose nominal budgets went
through a float round trip, or a sum, stay together)."""


@dataclass(frozen=True)
class ScalingLaw:
    """L(N, D) = E + A / N^alpha + B / D^beta (Hoffmann et al. 2022, eq. 2)."""

    E: float
    """Irreducible loss (nats per token)."""
    A: float
    """Scale of the finite-model term."""
    B: float
    """Scale of the finite-data term."""
    alpha: float
    """Exponent of the parameter count N."""
    beta: float
    """Exponent of the training tokens D."""

    def __post_init__(self) -> None:
        for name in ("E", "A", "B", "alpha", "beta"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"ScalingLaw.{name} must be a finite number >= 0; got {name}={v!r}")
        if self.alpha + self.beta <= 0:
            raise ValueError(f"ScalingLaw needs alpha + beta > 0; got alpha={self.alpha}, beta={self.beta}")

    def loss(self, params: Any, tokens: Any) -> np.ndarray:
        """The predicted loss at `params` (N) and `tokens` (D), elementwise."""
        n = np.asarray(params, dtype=np.float64)
        d = np.asarray(tokens, dtype=np.float64)
        return self.E + self.A * n ** (-self.alpha) + self.B * d ** (-self.beta)

    @property
    def a(self) -> float:
        """Exponent of the compute-optimal parameters, N* proportional to C^a: beta / (alpha + beta)."""
        return self.beta / (self.alpha + self.beta)

    @property
    def b(self) -> float:
        """Exponent of the compute-optimal tokens, D* proportional to C^b: alpha / (alpha + beta)."""
        return self.alpha / (self.alpha + self.beta)

    def optimal_allocation(self, compute: Any, flops_per_param_token: float = 6.0) -> tuple[Any, Any]:
        """(N*, D*) minimising the loss subject to C = k N D (k = 6: Hoffmann et al. 2022, eq. 4)."""
        if self.A <= 0 or self.B <= 0:
            raise ValueError(f"the optimum needs A > 0 and B > 0; got A={self.A}, B={self.B}")
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        c = np.asarray(compute, dtype=np.float64) / flops_per_param_token
        return g * c**self.a, c**self.b / g

    def to_dict(self) -> dict[str, float]:
        """The five parameters as a JSON-able dict."""
        return {k: float(v) for k, v in asdict(self).items()}


CHINCHILLA = ScalingLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
"""The law published by Hoffmann et al. (2022), eq. 10 (MassiveText, their tokenizer)."""


@dataclass(frozen=True)
class ScalingRun:
    """One finished training run, as the fits see it.

    `params` is `schooner.model.num_parameters` of the model and `flops` is `flops_per_token(model,
    seq_len)` times `tokens`: the exact counts of the model package, not 6ND.
    """

    budget: float
    """The nominal compute budget of the isoFLOP group the run belongs to (FLOPs)."""
    params: float
    """N: the model's parameters."""
    tokens: float
    """D: the training tokens."""
    loss: float
    """Final validation loss (nats per token)."""
    flops: float | None = None
    """Exact training FLOPs of the run (None: `budget`)."""
    name: str = ""
    """A label (the run's step name)."""
    bpb: float | None = None
    """Final validation bits per byte, when known."""

    def __post_init__(self) -> None:
        for name in ("budget", "params", "tokens", "loss"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(
                    f"ScalingRun.{name} must be a finite number > 0; got {name}={v!r} ({self.name!r})"
                )

    @property
    def compute(self) -> float:
        """The run's FLOPs: `flops`, else `budget`."""
        return float(self.flops if self.flops is not None else self.budget)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (`ScalingRun(**d)` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScalingRun:
        """The run from `to_dict`'s output (unknown keys are ignored)."""
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in fields})


def run_arrays(runs: Iterable[ScalingRun]) -> dict[str, np.ndarray]:
    """`budget`, `params`, `tokens`, `loss`, `compute` of the runs as float64 arrays, in order."""
    runs = list(runs)
    if not runs:
        raise ValueError("no runs: a scaling fit needs at least one finished run")
    return {
        "budget": np.array([r.budget for r in runs], dtype=np.float64),
        "params": np.array([r.params for r in runs], dtype=np.float64),
        "tokens": np.array([r.tokens for r in runs], dtype=np.float64),
        "loss": np.array([r.loss for r in runs], dtype=np.float64),
        "compute": np.array([r.compute for r in runs], dtype=np.float64),
    }


def budget_groups(budgets: Iterable[float], rtol: float = BUDGET_RTOL) -> list[tuple[float, list[int]]]:
    """The indices of `budgets` grouped into isoFLOP groups, ascending: (the group's smallest budget, indices).
    A budget joins the group of the one below it when within `rtol` of it (relative)."""
    values = [float(b) for b in budgets]
    groups: list[tuple[float, list[int]]] = []
    last = None
    for i in sorted(range(len(values)), key=lambda i: values[i]):
        if last is None or values[i] > last * (1.0 + rtol):
            groups.append((values[i], []))
        groups[-1][1].append(i)
        last = values[i]
    return groups


def require_law_data(arr: Mapping[str, np.ndarray], method: str) -> None:
    """Refuse data that cannot identify L = E + A/N^alpha + B/D^beta: fewer than 5 runs (one per parameter), or
    runs at a single budget (along one isoFLOP line D is a function of N, so the N and D terms trade off)."""
    n = int(arr["loss"].size)
    budgets = [b for b, _ in budget_groups(arr["budget"])]
    missing = []
    if n < 5:
        missing.append(f"at least 5 runs (one per parameter E, A, B, alpha, beta); got {n}")
    if len(budgets) < 2:
        missing.append(
            f"runs at 2 or more budgets (along one isoFLOP line the N and D terms trade off); got "
            f"{len(budgets)} ({', '.join(f'{b:.3g}' for b in budgets)})"
        )
    if missing:
        raise ValueError(
            f"{method} cannot identify the law's 5 parameters: it needs {'; and '.join(missing)}"
        )


def degenerate_terms(law: ScalingLaw, params: Any, tokens: Any, rtol: float = 1e-6) -> list[str]:
    """ "A" and/or "B" when that term (A/N^alpha, B/D^beta) is zero or below `rtol` of the loss at every run:
    the law then has no such term, and its exponent is not identified by the data (any value fits)."""
    n = np.asarray(params, dtype=np.float64)
    d = np.asarray(tokens, dtype=np.float64)
    loss = law.loss(n, d)
    terms = {"A": law.A * n ** (-law.alpha), "B": law.B * d ** (-law.beta)}
    return [k for k, t in terms.items() if getattr(law, k) == 0 or bool(np.all(t < rtol * loss))]


def synthetic_runs(
    law: ScalingLaw,
    budgets: Iterable[float],
    *,
    sizes_per_budget: int = 5,
    span: float = 4.0,
    centre: float | Iterable[float] = 1.0,
    noise: float = 0.0,
    seed: int = 0,
) -> list[ScalingRun]:
    """IsoFLOP runs drawn from `law` with C = 6ND, as in the simulations of Hoffmann et al. (2022, app. D).

    Each budget gets `sizes_per_budget` model sizes log-spaced over [N_c / span, N_c * span] around
    N_c = centre x N*(C) (the law's optimum; a `centre` per budget models a grid that drifts off the
    optimum), D = C / (6N), and loss = L(N, D) * exp(noise * z) with z standard normal (multiplicative
    noise of relative size `noise`).
    """
    budgets = [float(c) for c in budgets]
    centres = (
        [float(centre)] * len(budgets) if isinstance(centre, int | float) else [float(c) for c in centre]
    )
    if len(centres) != len(budgets):
        raise ValueError(f"centre needs one value per budget; got {len(centres)} for {len(budgets)} budgets")
    if sizes_per_budget < 1 or span < 1 or noise < 0:
        raise ValueError(
            f"need sizes_per_budget >= 1, span >= 1, noise >= 0; got {sizes_per_budget=}, {span=}, {noise=}"
        )
    rng = np.random.default_rng(seed)
    runs = []
    for c, k in zip(budgets, centres, strict=True):
        n_opt, _ = law.optimal_allocation(c)
        for n in float(n_opt) * k * np.geomspace(1.0 / span, span, sizes_per_budget):
            d = c / (6.0 * n)
            loss = float(law.loss(n, d)) * math.exp(noise * rng.standard_normal())
            runs.append(ScalingRun(budget=c, params=float(n), tokens=float(d), loss=loss, flops=c))
    return runs
