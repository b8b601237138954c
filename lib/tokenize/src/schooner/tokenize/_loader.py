"""`DataLoader`: batches built on background threads and handed over as jax arrays already placed.

The dataset's `batch(step, batch_size)` is pure, so the loader can compute several future steps at once
and a restarted run starts at `start_step` without replaying anything.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np


class BatchSource(Protocol):
    """Anything with a pure `batch(step, batch_size)` (e.g. `MixtureDataset`)."""

    def batch(self, step: int, batch_size: Any) -> dict[str, np.ndarray]: ...


class DataLoader:
    """Iterate `(step, batch)` from `start_step` on, prefetching `prefetch` batches on threads.

    Args:
        dataset: a `MixtureDataset` (or any object with a pure `batch(step, batch_size)`).
        batch_size: an int, or a function step -> int for batch-size schedules.
        start_step: the first step (resume here; earlier batches are never computed).
        sharding: a `jax.sharding.Sharding` for the `[B, T]` arrays; None keeps host numpy arrays.
        prefetch: how many batches to prepare ahead (also the number of threads).
        stop_step: stop before this step (None: iterate forever).

    Example:
        >>> mesh = jax.make_mesh((8,), ("data",))                                  # doctest: +SKIP
        >>> sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None))
        >>> with DataLoader(ds, 16, sharding=sharding) as loader:                   # doctest: +SKIP
        ...     for step, batch in loader:
        ...         state, metrics = train_step(state, batch)
    """

    def __init__(
        self,
        dataset: BatchSource,
        batch_size: int | Callable[[int], int],
        *,
        start_step: int = 0,
        sharding: Any = None,
        prefetch: int = 2,
        stop_step: int | None = None,
    ) -> None:
        if not callable(batch_size) and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(
                f"DataLoader: batch_size must be a positive int or a function of step, got {batch_size!r}"
            )
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"DataLoader: start_step must be an int >= 0, got {start_step!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"DataLoader: prefetch must be an int >= 1, got {prefetch!r}")
        if stop_step is not None and stop_step < start_step:
            raise ValueError(f"DataLoader: stop_step={stop_step} is before start_step={start_step}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.start_step = start_step
        self.stop_step = stop_step
        self.sharding = sharding
        self.prefetch = prefetch
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def _make(self, step: int) -> tuple[int, dict[str, Any]]:
        batch = self.dataset.batch(step, self.batch_size)
        if self.sharding is not None:
            batch = {k: _place(v, self.sharding) for k, v in batch.items()}
        return step, batch

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        self.close()
        self._pool = pool = concurrent.futures.ThreadPoolExecutor(
            self.prefetch, thread_name_prefix="schooner-loader"
        )
        pending: collections.deque[concurrent.futures.Future] = collections.deque()
        next_step = self.start_step
        try:
            while True:
                while len(pending) < self.prefetch and (self.stop_step is None or next_step < self.stop_step):
                    pending.append(pool.submit(self._make, next_step))
                    next_step += 1
                if not pending:
                    return
                yield pending.popleft().result()  # re-raises a failed batch at its own step
        finally:
            for f in pending:
                f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            if self._pool is pool:
                self._pool = None

    def close(self) -> None:
        """Stop the background threads (idempotent); iterating again restarts at `start_step`."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _place(x: np.ndarray, sharding: Any) -> Any:
    """Put a host array on devices per `sharding`; on several hosts each keeps only its own shards."""
    import jax  # lazy: importing schooner.tokenize stays cheap

    if jax.process_count() == 1:
        return jax.device_put(x, sharding)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
