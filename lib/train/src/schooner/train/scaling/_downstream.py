"""Downstream forecasts: a task's soft metrics fitted against compute like the loss, and the hard metric
(accuracy) through a sigmoid from soft to hard fitted on a pool of runs (Delphi's recipe for MMLU & co.).

1. Per run, from a multiple-choice task's per-document log-probabilities (`soft_metrics`):
   - `choice_loss`: the mean over documents of -ln p(right | choices) = -(logprob[gold] - logsumexp(logprobs)),
     the log-probability of the right answer against the others (ln 4 = 1.386 at chance with four choices);
   - `bpb`: bits per byte of the right (reference) completions, -sum logprob[gold] / (ln 2 sum bytes[gold]);
   - `acc`: the share of documents whose right answer has the highest log-probability.
   The soft metrics fall with compute like a loss, so each is fitted exactly as the loss is (`fit_delphi`:
   per budget a parabola in log tokens, E + A C^-alpha through the optima, bootstrap over budgets) and
   forecast at held-out budgets with its bootstrap interval.
2. The hard metric: acc = chance + (1 - chance) sigmoid(k (s0 - s)) with s a soft metric, fitted by least
   squares on every run of the pool (`fit_soft_to_hard`: a grid over (s0, ln k), then the best cell refined);
   a forecast of s maps to a forecast of acc, its interval the image of s's (the map is monotone).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SoftToHard", "fit_soft_to_hard", "soft_metrics"]


def soft_metrics(documents: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """`choice_loss`, `bpb` and `acc` of one run on a multiple-choice task from its per-document records
    (`schooner.eval`'s documents file: `logprobs` of each choice, `gold`, and `norm_bytes` per choice).

    Raises:
        ValueError: no documents, or a document without those fields or with a non-finite log-probability
            (named by its index).
    """
    losses, nll, nbytes, hits = [], 0.0, 0, 0
    for i, d in enumerate(documents):
        try:
            lp = np.asarray(d["logprobs"], dtype=np.float64)
            gold = int(d["gold"])
            size = int(d["norm_bytes"][gold])
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise ValueError(
                f"soft_metrics: document {i} needs logprobs, gold and norm_bytes per choice; got keys "
                f"{sorted(d)} ({type(e).__name__}: {e})"
            ) from None
        if not np.all(np.isfinite(lp)) or not 0 <= gold < lp.size:
            raise ValueError(f"soft_metrics: document {i} has logprobs={lp.tolist()} and gold={gold}")
        top = lp.max()
        losses.append(-(lp[gold] - top - math.log(np.exp(lp - top).sum())))
        nll -= lp[gold]
        nbytes += size
        hits += int(np.argmax(lp) == gold)
    if not losses:
        raise ValueError("soft_metrics: no documents")
    return {
        "choice_loss": float(np.mean(losses)),
        "bpb": float(nll / (math.log(2) * nbytes)),
        "acc": hits / len(losses),
        "documents": len(losses),
    }


@dataclass(frozen=True)
class SoftToHard:
    """acc = chance + (1 - chance) / (1 + exp(-k (s0 - s))): accuracy from a soft metric s (lower is better)."""

    chance: float
    k: float
    s0: float
    """The soft metric at which accuracy is halfway between chance and 1."""
    sse: float
    points: int

    def __call__(self, soft: float | np.ndarray) -> np.ndarray:
        z = np.clip(self.k * (self.s0 - np.asarray(soft, dtype=np.float64)), -500, 500)
        return self.chance + (1.0 - self.chance) / (1.0 + np.exp(-z))

    def to_dict(self) -> dict[str, float]:
        return {"chance": self.chance, "k": self.k, "s0": self.s0, "sse": self.sse, "points": self.points}


def _sse(soft: np.ndarray, hard: np.ndarray, chance: float, s0: np.ndarray, k: np.ndarray) -> np.ndarray:
    z = np.clip(k[..., None] * (s0[..., None] - soft), -500, 500)
    pred = chance + (1.0 - chance) / (1.0 + np.exp(-z))
    return ((pred - hard) ** 2).sum(-1)


def fit_soft_to_hard(soft: Sequence[float], hard: Sequence[float], *, chance: float) -> SoftToHard:
    """Least-squares `SoftToHard` through (soft, hard) pairs of a pool of runs, with k > 0 (accuracy falls as
    the soft metric rises) and s0 within twice the soft metrics' range around them.

    Raises:
        ValueError: fewer than 3 pairs, mismatched lengths, non-finite values, accuracies outside [0, 1],
            chance outside [0, 1), or soft metrics that are all equal.
    """
    s = np.asarray(soft, dtype=np.float64)
    h = np.asarray(hard, dtype=np.float64)
    if s.shape != h.shape or s.ndim != 1 or s.size < 3:
        raise ValueError(
            f"fit_soft_to_hard needs 3 or more (soft, hard) pairs of one length; got {s.shape}, {h.shape}"
        )
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(h)) and np.all((h >= 0) & (h <= 1))):
        raise ValueError(f"fit_soft_to_hard needs finite soft values and accuracies in [0, 1]; got {s}, {h}")
    if not 0 <= chance < 1:
        raise ValueError(f"fit_soft_to_hard: chance must be in [0, 1); got chance={chance}")
    span = float(np.ptp(s))
    if span == 0:
        raise ValueError(f"fit_soft_to_hard: every soft metric is {s[0]}; a sigmoid needs them to differ")
    lo, hi = s.min() - span, s.max() + span
    s0_grid = np.linspace(lo, hi, 241)
    lk_grid = np.linspace(math.log(0.1 / span), math.log(200.0 / span), 241)
    S0, LK = np.meshgrid(s0_grid, lk_grid, indexing="ij")
    sse = _sse(s, h, chance, S0, np.exp(LK))
    i, j = np.unravel_index(int(np.argmin(sse)), sse.shape)
    best = (float(S0[i, j]), float(LK[i, j]), float(sse[i, j]))
    # refine around the best cell with a finer local grid, twice
    ds, dk = s0_grid[1] - s0_grid[0], lk_grid[1] - lk_grid[0]
    for _ in range(2):
        s0_f = np.linspace(best[0] - ds, best[0] + ds, 41)
        lk_f = np.linspace(best[1] - dk, best[1] + dk, 41)
        S0, LK = np.meshgrid(s0_f, lk_f, indexing="ij")
        sse = _sse(s, h, chance, S0, np.exp(LK))
        i, j = np.unravel_index(int(np.argmin(sse)), sse.shape)
        if sse[i, j] <= best[2]:
            best = (float(S0[i, j]), float(LK[i, j]), float(sse[i, j]))
        ds, dk = ds / 20, dk / 20
    return SoftToHard(chance=float(chance), k=math.exp(best[1]), s0=best[0], sse=best[2], points=int(s.size))
