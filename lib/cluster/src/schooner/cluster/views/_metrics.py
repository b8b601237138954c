"""A step's `metrics.jsonl`, read generically: every numeric column is a series against `step`.

The report and `schooner compare` know nothing of training: whatever a step logs (one JSON object per line,
a `step` field, any numeric fields beside it) is a series. Series are grouped into families by their last
path component (`train/loss`, `eval/docs/loss` -> `loss`), so one chart holds values of one kind and unit.
A wall-clock column (`time` in Unix seconds, as the trainer logs it, and the other `WALL_CLOCK` names) is not
a series: it is a stat (`wall_clock`), how long the logged steps took.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from schooner.cluster.records import METRICS_FILE as METRICS_FILE
from schooner.cluster.records import read_metrics as read_metrics

Point = tuple[float, float]

WALL_CLOCK = frozenset({"time", "timestamp", "_timestamp", "wall_time", "walltime", "wall_clock"})
"""Column names (last path component) that hold the time a row was logged: a stat, never a curve."""


def is_wall_clock(name: str) -> bool:
    """Whether the column `name` is a wall-clock time (`WALL_CLOCK`)."""
    return name.rstrip("/").rsplit("/", 1)[-1] in WALL_CLOCK


@dataclass(frozen=True)
class WallClock:
    """The wall-clock span of a metrics file: its first and last logged time and the rows that had one."""

    column: str
    first: float
    last: float
    rows: int

    @property
    def seconds(self) -> float:
        return self.last - self.first


def wall_clock(rows: list[dict[str, Any]]) -> WallClock | None:
    """The span of the first wall-clock column of `rows` (in file order); None when there is none."""
    for name in dict.fromkeys(k for row in rows for k in row):
        if is_wall_clock(name):
            times = [t for t in (_number(row.get(name)) for row in rows) if t is not None]
            if times:
                return WallClock(name, min(times), max(times), len(times))
    return None


def _number(value: Any) -> float | None:
    """`value` as a finite float; None for non-numbers, bools, NaN and infinities."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def numeric_series(rows: list[dict[str, Any]]) -> dict[str, list[Point]]:
    """Every numeric column of `rows` as `(step, value)` points, in first-appearance order.

    x is the row's `step` field (its index in the file when it has none); `step` itself is not a series, nor
    are wall-clock columns (`is_wall_clock`).
    Points are sorted by step; a step logged twice (a resumed run repeating steps after its checkpoint)
    keeps its later value.
    """
    by_step: dict[str, dict[float, float]] = {}
    for i, row in enumerate(rows):
        x = _number(row.get("step"))
        x = float(i) if x is None else x
        for name, value in row.items():
            y = _number(value)
            if name != "step" and y is not None and not is_wall_clock(name):
                by_step.setdefault(name, {})[x] = y
    return {name: sorted(points.items()) for name, points in by_step.items()}


def family_of(name: str) -> str:
    """The family a series is charted in: its last path component (`eval/docs/loss` -> `loss`)."""
    return name.rstrip("/").rsplit("/", 1)[-1] or name


def families(names: list[str]) -> list[tuple[str, list[str]]]:
    """`(family, series names)` for `names`, families and members in first-appearance order."""
    out: dict[str, list[str]] = {}
    for name in names:
        out.setdefault(family_of(name), []).append(name)
    return list(out.items())


@dataclass(frozen=True)
class Summary:
    """The headline numbers of one series."""

    final: float
    """The value at the last logged step."""
    final_step: float
    minimum: float
    min_step: float
    """The step at which the minimum was first reached."""
    count: int


def summarize(points: list[Point]) -> Summary:
    """Final and minimum of a non-empty series sorted by step (as `numeric_series` gives it)."""
    if not points:
        raise ValueError("summarize needs at least one point; got an empty series")
    last_x, last_y = points[-1]
    min_x, min_y = min(points, key=lambda p: (p[1], p[0]))
    return Summary(last_y, last_x, min_y, min_x, len(points))


def thin(points: list[Point], limit: int) -> list[Point]:
    """At most about `limit` points of a series for drawing: every k-th, always keeping the last."""
    if len(points) <= limit:
        return points
    stride = math.ceil(len(points) / limit)
    kept = points[::stride]
    return kept if kept[-1] == points[-1] else [*kept, points[-1]]
