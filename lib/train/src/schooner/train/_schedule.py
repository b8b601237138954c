"""Learning-rate schedules: linear warmup, then cosine, linear, constant or warmup-stable-decay (WSD).

Every schedule is a pure function of the step (an `optax.Schedule`), so a resumed run sees exactly the
learning rates the uninterrupted run would have seen.

Step `s` is the 0-based count of the update (optax's count): warmup starts at 0 at `s = 0`, and the floor is
the value at `s = num_steps`, one past the last update, as in optax's and transformers' schedules
(`optax.warmup_cosine_decay_schedule(decay_steps=num_steps)`, `get_cosine_schedule_with_warmup`). The last
update (`s = num_steps - 1`) uses the value one step before the floor: `floor + (peak - floor) / decay_steps`
for a linear or WSD decay (a decay of one step changes no update).
"""

from __future__ import annotations

import math
from typing import Literal

import jax.numpy as jnp
import optax

ScheduleKind = Literal["cosine", "linear", "constant", "wsd"]
SCHEDULE_KINDS: tuple[str, ...] = ("cosine", "linear", "constant", "wsd")


def resolve_steps(value: float | int, num_steps: int, *, field_name: str) -> int:
    """Turn a step count or a fraction of the run into a step count.

    A float in [0, 1) is a fraction of `num_steps`; an int (or a float >= 1 with no fractional part) is an
    absolute number of steps.

    Raises:
        ValueError: the value is negative, a non-integral float >= 1, or longer than the run.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{field_name} must be a step count (int) or a fraction in [0, 1), got {value!r}")
    if isinstance(value, float) and value < 1.0:
        steps = int(round(value * num_steps))
    else:
        if float(value) != int(value):
            raise ValueError(
                f"{field_name}={value!r} is neither a fraction in [0, 1) nor a whole number of steps; "
                f"use e.g. {field_name}=0.05 (5% of the run) or {field_name}=100 (steps)"
            )
        steps = int(value)
    if steps > num_steps:
        raise ValueError(
            f"{field_name}={value!r} means {steps} steps, longer than the run (num_train_steps={num_steps}); "
            f"shorten it or train for longer"
        )
    return steps


def build_schedule(
    *,
    learning_rate: float,
    num_steps: int,
    kind: str = "cosine",
    warmup: float | int = 0.0,
    decay: float | int | None = None,
    min_lr_ratio: float = 0.1,
) -> optax.Schedule:
    """Build a learning-rate schedule over `num_steps` optimizer steps.

    Args:
        learning_rate: peak learning rate, reached at the end of warmup.
        num_steps: total optimizer steps of the run.
        kind: what follows warmup: "cosine" (cosine decay to `min_lr_ratio * learning_rate` at step `num_steps`),
            "linear" (linear decay to the same floor), "constant" (stay at the peak), or "wsd"
            (warmup-stable-decay: hold the peak, then decay linearly to the floor over the last `decay` of
            the run).
        warmup: warmup length, steps (int) or a fraction of the run (float < 1). Warmup starts at 0.
        decay: for "wsd", the decay phase length (steps or fraction; default 0.2 of the run). For "cosine"
            and "linear", None means "decay over everything after warmup"; a value restricts decay to the
            last `decay` of the run (the LR holds at the peak before it). Not allowed for "constant".
        min_lr_ratio: the floor, as a fraction of the peak, reached at step `num_steps` (one past the last
            update: see the module docstring).

    Returns:
        An optax schedule: step -> learning rate (float32).

    Raises:
        ValueError: an unknown kind, a ratio outside [0, 1], or phases longer than the run.

    Example:
        >>> s = build_schedule(learning_rate=1.0, num_steps=100, kind="wsd", warmup=10, decay=0.2, min_lr_ratio=0.0)
        >>> float(s(10)), float(s(80)), float(s(100))
        (1.0, 1.0, 0.0)
    """
    if kind not in SCHEDULE_KINDS:
        raise ValueError(f"unknown learning-rate schedule {kind!r}; choose one of {SCHEDULE_KINDS}")
    if not isinstance(num_steps, int) or num_steps <= 0:
        raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
    if not (isinstance(learning_rate, int | float) and learning_rate >= 0 and math.isfinite(learning_rate)):
        raise ValueError(f"learning_rate must be a finite number >= 0, got {learning_rate!r}")
    if not (0.0 <= min_lr_ratio <= 1.0):
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio=}")
    warmup_steps = resolve_steps(warmup, num_steps, field_name="warmup")
    if kind == "constant" and decay is not None:
        raise ValueError(
            f"a 'constant' schedule has no decay phase, got {decay=}; use kind='wsd' to decay at the end"
        )
    if kind == "wsd" and decay is None:
        decay = 0.2
    if decay is None:
        decay_steps = num_steps - warmup_steps
    else:
        decay_steps = resolve_steps(decay, num_steps, field_name="decay")
        if decay > 0 and decay_steps == 0:
            decay_steps = 1  # a (small) positive decay fraction still reaches the floor at step num_steps
    if warmup_steps + decay_steps > num_steps:
        raise ValueError(
            f"warmup ({warmup_steps} steps) + decay ({decay_steps} steps) is longer than the run "
            f"(num_train_steps={num_steps}); shorten warmup or decay"
        )
    peak = float(learning_rate)
    floor = peak * float(min_lr_ratio)
    stable_end = num_steps - decay_steps

    def schedule(step: jnp.ndarray) -> jnp.ndarray:
        step = jnp.asarray(step, jnp.float32)
        warm = peak * step / max(warmup_steps, 1) if warmup_steps > 0 else jnp.float32(peak)
        if kind == "constant":
            after = jnp.float32(peak)
        else:
            # Progress through the decay phase, 0 at its start and 1 at step num_steps.
            t = jnp.clip((step - stable_end) / max(decay_steps, 1), 0.0, 1.0)
            if kind == "cosine":
                after = floor + (peak - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * t))
            else:  # linear and wsd decay linearly
                after = peak + (floor - peak) * t
        return jnp.where(step < warmup_steps, warm, after).astype(jnp.float32)

    return schedule
