"""Learning-rate schedules against closed-form values, and their errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schooner.train import build_schedule


def lr(kind: str, step: int, **kw) -> float:
    args = dict(learning_rate=1.0, num_steps=100, kind=kind, warmup=10, min_lr_ratio=0.1)
    args.update(kw)
    return float(build_schedule(**args)(step))


def test_warmup_is_linear_from_zero() -> None:
    assert lr("cosine", 0) == 0.0
    assert lr("cosine", 5) == pytest.approx(0.5)
    assert lr("cosine", 10) == pytest.approx(1.0)


def test_cosine_decays_to_the_floor() -> None:
    # Halfway through the 90 decay steps: 0.1 + 0.9 * (1 + cos(pi/2)) / 2 = 0.55.
    assert lr("cosine", 55) == pytest.approx(0.55, abs=1e-6)
    assert lr("cosine", 100) == pytest.approx(0.1, abs=1e-6)
    # 22 of 90 decay steps in.
    assert lr("cosine", 32) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 22 / 90)), abs=1e-6)


def test_linear_constant_and_wsd() -> None:
    assert lr("linear", 55) == pytest.approx(0.55, abs=1e-6)
    assert lr("linear", 100) == pytest.approx(0.1, abs=1e-6)
    assert lr("constant", 60) == 1.0 and lr("constant", 100) == 1.0
    # WSD, decay over the last 20%: flat until step 80, then linear to the floor at 100.
    assert lr("wsd", 79, decay=0.2) == 1.0
    assert lr("wsd", 80, decay=0.2) == 1.0
    assert lr("wsd", 90, decay=0.2) == pytest.approx(0.55, abs=1e-6)
    assert lr("wsd", 100, decay=0.2) == pytest.approx(0.1, abs=1e-6)
    # A restricted cosine decay holds the peak until its decay phase starts.
    assert lr("cosine", 49, decay=50) == 1.0


def test_step_counts_and_fractions() -> None:
    assert lr("constant", 3, warmup=0.1) == pytest.approx(0.3)  # 0.1 of 100 steps = 10 warmup steps
    assert lr("constant", 0, warmup=0) == 1.0


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(warmup=101), "longer than the run"),
        (dict(warmup=60, decay=50), "longer than the run"),
        (dict(kind="exponential"), "unknown learning-rate schedule"),
        (dict(warmup=1.5), "neither a fraction"),
        (dict(min_lr_ratio=1.5), "min_lr_ratio"),
        (dict(kind="constant", decay=10), "no decay phase"),
    ],
)
def test_errors_name_the_field(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lr(kw.pop("kind", "cosine"), 0, **kw)


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["cosine", "linear", "constant", "wsd"]),
    steps=st.integers(1, 500),
    warm=st.floats(0.0, 0.5),
    ratio=st.floats(0.0, 1.0),
)
def test_bounded_and_non_increasing_after_warmup(kind: str, steps: int, warm: float, ratio: float) -> None:
    s = build_schedule(learning_rate=2.0, num_steps=steps, kind=kind, warmup=warm, min_lr_ratio=ratio)
    w = int(round(warm * steps))
    # Schedules are elementwise: one call on a fixed-length array (padded with the last step).
    values = np.asarray(s(np.minimum(np.arange(501), steps)))[: steps + 1].tolist()
    assert all(-1e-6 <= v <= 2.0 + 1e-6 for v in values)
    after = values[w:]
    assert all(b <= a + 1e-5 for a, b in zip(after, after[1:]))
    if kind != "constant" and steps > w:
        assert values[-1] == pytest.approx(2.0 * ratio, abs=1e-5)
