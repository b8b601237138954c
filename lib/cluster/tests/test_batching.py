"""The one batch-size rule of both clients' `map`."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from schooner.cluster._batching import BatchSizer


def test_one_item_until_a_batch_is_timed_then_the_target_seconds_of_work() -> None:
    sizer = BatchSizer(0.05)
    assert sizer.size(workers=4, pulled=0) == 1
    sizer.observe(seconds=0.01, count=10)  # 1 ms per item
    assert sizer.size(workers=4, pulled=10) == 50
    sizer.observe(seconds=0.5, count=50)  # slower now: 10 ms per item, averaged 0.7/0.3
    assert sizer.per_item == 0.7 * 0.001 + 0.3 * 0.01
    assert sizer.size(workers=4, pulled=60) == int(0.05 / (0.7 * 0.001 + 0.3 * 0.01))


@given(
    total=st.integers(1, 100_000),
    workers=st.integers(1, 64),
    per_item=st.floats(1e-9, 10.0),
    pulled_fraction=st.floats(0, 1),
    pending=st.integers(0, 100),
)
def test_batches_stay_within_bounds_and_leave_every_worker_a_share(
    total: int, workers: int, per_item: float, pulled_fraction: float, pending: int
) -> None:
    sizer = BatchSizer(0.02, total=total, max_batch=4096)
    sizer.observe(per_item, 1)
    pulled = int(total * pulled_fraction)
    size = sizer.size(workers, pulled, pending)
    assert 1 <= size <= 4096
    assert size <= max(1, math.ceil((total - pulled + pending) / (2 * workers)))
