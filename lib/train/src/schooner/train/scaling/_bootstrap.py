"""Bootstrap intervals over runs: refit on runs resampled with replacement, read percentiles.

Hoffmann et al. (2022) report approach 3's uncertainty by bootstrapping; Besiroglu et al. (2024) show their
intervals were implausibly narrow ("would require over 600,000 experiments") and recompute them by
resampling the runs. Here each replicate resamples runs with replacement within each compute budget, so every
replicate keeps the isoFLOP design (approach 2 needs every budget); a replicate whose fit fails (a
resampled budget with fewer than three distinct sizes, a parabola opening downwards) is counted and dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from ._law import ScalingRun

__all__ = ["Interval", "bootstrap", "percentile_interval", "resample_runs"]

T = TypeVar("T")


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
    groups: dict[float, list[ScalingRun]] = {}
    for r in runs:
        groups.setdefault(float(r.budget), []).append(r)
    out: list[ScalingRun] = []
    for budget in sorted(groups):
        g = groups[budget]
        out.extend(g[i] for i in rng.integers(0, len(g), size=len(g)))
    return out


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
