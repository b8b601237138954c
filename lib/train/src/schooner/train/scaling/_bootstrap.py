"""Bootstrap intervals over runs: refit on runs resampled with replacement, read percentiles.

Hoffmann et al. (2022) report approach 3's uncertainty by bootstrapping; Besiroglu et al. (2024) show their
intervals were implausibly narrow ("would require over 600,000 experiments") and recompute them by
resampling the runs. Here each replicate resamples runs with replacement within each compute budget, so every
replicate keeps the isoFLOP design (approach 2 needs every budget); a replicate whose fit fails (a
resampled budget with fewer than three distinct sizes, a parabola opening downwards) is counted and dropped.
When fewer than `MIN_REPLICATES` (20) replicates, or fewer than half of them, succeed, a fit reports no
interval for that method and says why (`replicates_shortfall`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from ._law import ScalingRun, budget_groups

__all__ = [
    "MIN_REPLICATES",
    "Interval",
    "bootstrap",
    "percentile_interval",
    "replicates_shortfall",
    "resample_runs",
]

T = TypeVar("T")

MIN_REPLICATES = 20
"""The fewest successful replicates an interval is read from (a 90% percentile interval of fewer is little
more than their range; zero gave a zero-width one)."""


@dataclass(frozen=True)
class Interval:
    """A central interval of a bootstrap distribution."""

    low: float
    high: float
    level: float
    """Coverage the interval aims at (0.9: the 5th to the 95th percentile)."""

    def __post_init__(self) -> None:
        if not 0 < self.level < 1:
            raise ValueError(f"Interval.level must be in (0, 1); got level={self.level!r}")

    def __contains__(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict[str, float]:
        return {"low": float(self.low), "high": float(self.high), "level": float(self.level)}


def percentile_interval(values: Sequence[float] | np.ndarray, level: float = 0.9) -> Interval:
    """The central `level` interval of `values` (percentile bootstrap)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        raise ValueError("no finite bootstrap values: every replicate failed")
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(v, [tail, 100.0 - tail])
    return Interval(low=float(low), high=float(high), level=level)


def resample_runs(runs: Sequence[ScalingRun], rng: np.random.Generator) -> list[ScalingRun]:
    """Runs drawn with replacement within each budget (as many per budget as there were)."""
    runs = list(runs)
    out: list[ScalingRun] = []
    for _, idx in budget_groups(r.budget for r in runs):
        out.extend(runs[idx[i]] for i in rng.integers(0, len(idx), size=len(idx)))
    return out


def replicates_shortfall(succeeded: int, samples: int) -> str | None:
    """Why `succeeded` of `samples` replicates are too few for an interval, or None when they are enough:
    an interval needs at least `MIN_REPLICATES` successes and at least half of the samples (when most
    resamples fail, the survivors are a biased subset: those that kept a well-spread design)."""
    need = max(MIN_REPLICATES, math.ceil(samples / 2))
    if succeeded >= need:
        return None
    return (
        f"only {succeeded} of {samples} bootstrap replicates could be fitted ({samples - succeeded} failed); "
        f"intervals need at least {MIN_REPLICATES} and at least half of the samples ({need} here): raise "
        "samples, or add sizes per budget so that resamples keep enough distinct sizes"
    )


def bootstrap(
    runs: Sequence[ScalingRun],
    fit: Callable[[list[ScalingRun]], T],
    *,
    samples: int = 200,
    seed: int = 0,
) -> tuple[list[T], int]:
    """`fit` on `samples` resamplings of `runs` (see `resample_runs`): (the replicates' results, failures).

    A replicate whose `fit` raises `ValueError` (a degenerate resample) counts as a failure; any other
    exception propagates.
    """
    if samples < 1:
        raise ValueError(f"bootstrap needs samples >= 1; got samples={samples}")
    rng = np.random.default_rng(seed)
    results: list[T] = []
    failed = 0
    for _ in range(samples):
        try:
            results.append(fit(resample_runs(runs, rng)))
        except ValueError:
            failed += 1
    return results, failed
