"""How many `map` items travel together: one adaptive batch size for both clients.

Tiny items are dominated by per-message overhead, so items travel in batches sized from the measured time
per item, aiming at `target_seconds` of work per batch; never more than a fair share of what is left (so
the tail stays balanced across workers), never more than `max_batch`. Until the first batch is back, a
batch is one item (assume slow items).
"""

from __future__ import annotations

import math


class BatchSizer:
    """Batch sizes from an exponential average of the seconds per item.

    Example:
        >>> b = BatchSizer(target_seconds=0.02, total=1000)
        >>> b.size(workers=2, pulled=0)
        1
        >>> b.observe(seconds=0.001, count=1)  # 1 ms per item: 20 items make 20 ms
        >>> b.size(workers=2, pulled=1)
        20
    """

    def __init__(self, target_seconds: float, *, total: int | None = None, max_batch: int = 4096) -> None:
        self.target_seconds = target_seconds
        self.total = total
        self.max_batch = max_batch
        self.per_item = 0.0
        """Seconds per item, exponentially averaged; 0 until the first batch is back."""

    def observe(self, seconds: float, count: int) -> None:
        """A batch of `count` items took `seconds` on its worker."""
        sample = seconds / max(count, 1)
        self.per_item = sample if self.per_item <= 0 else 0.7 * self.per_item + 0.3 * sample

    def size(self, workers: int, pulled: int, pending: int = 0) -> int:
        """The next batch's size, with `pulled` items taken from the input so far and `pending` waiting to be
        rerun (after a worker died), shared by `workers` workers."""
        if self.per_item <= 0:
            return 1
        size = int(self.target_seconds / self.per_item) if self.per_item > 1e-7 else self.max_batch
        if self.total is not None:  # leave every worker a share of the remainder, for a balanced tail
            size = min(size, math.ceil((self.total - pulled + pending) / (2 * max(workers, 1))))
        return max(1, min(size, self.max_batch))
