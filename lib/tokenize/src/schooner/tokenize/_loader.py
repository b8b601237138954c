"""`DataLoader`: batches built on background threads and handed over as jax arrays already placed.

The dataset's `batch(step, batch_size)` is pure, so the loader can compute several future steps at once
and a restarted run starts at `start_step` without replaying anything.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np


class BatchSource(Protocol):
    """Anything with a pure `batch(step, batch_size)` (e.g. `MixtureDataset`)."""

    def batch(self, step: int, batch_size: Any) -> dict[str, np.ndarray]: ...


@runtime_checkable
class HostLocalSource(BatchSource, Protocol):
    """A `BatchSource` that can compute only some rows of a batch: what `DataLoader` needs on several
    hosts (or with `host_local=True`), e.g. `MixtureDataset`."""

    seq_len: int

    def batch(self, step: int, batch_size: Any, rows: np.ndarray | None = None) -> dict[str, np.ndarray]: ...


class DataLoader:
    """Iterate `(step, batch)` from `start_step` on, prefetching `prefetch` batches on threads.

    Args:
        dataset: a `MixtureDataset` (or any object with a pure `batch(step, batch_size)`).
        batch_size: an int, or a function step -> int for batch-size schedules.
        start_step: the first step (resume here; earlier batches are never computed).
        sharding: a `jax.sharding.Sharding` for the `[B, T]` arrays; None keeps host numpy arrays.
        prefetch: how many batches to prepare ahead (also the number of threads).
        stop_step: stop before this step (None: iterate forever).
        host_local: build only the rows of this process's devices and assemble the global array from
            them (what happens on several hosts; needs a dataset with `seq_len` and `batch(..., rows=)`).

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
        host_local: bool = False,
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
        # On several hosts each computes only the rows of its own devices (always, when process_count > 1);
        # host_local=True takes that path on one host too.
        self.host_local = host_local
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def _make(self, step: int) -> tuple[int, dict[str, Any]]:
        if self.sharding is None:
            return step, self.dataset.batch(step, self.batch_size)
        import jax  # lazy: importing schooner.tokenize stays cheap

        if jax.process_count() == 1 and not self.host_local:
            return step, {
                k: jax.device_put(v, self._sharding_for(v.ndim))
                for k, v in self.dataset.batch(step, self.batch_size).items()
            }
        return step, self._host_local(step)

    def _sharding_for(self, ndim: int) -> Any:
        """`sharding` for `[B, T]` arrays; for `[B]` ones (e.g. `pair_index`), the same split of the batch."""
        if ndim == 2:
            return self.sharding
        import jax

        spec = getattr(self.sharding, "spec", None)
        if ndim != 1 or spec is None:
            raise ValueError(f"DataLoader: cannot place a {ndim}-D batch array with {self.sharding}")
        return jax.sharding.NamedSharding(
            self.sharding.mesh, jax.sharding.PartitionSpec(spec[0] if spec else None)
        )

    def _host_local(self, step: int) -> dict[str, Any]:
        """Compute only the rows this process's devices hold, and assemble the global arrays from them."""
        import jax

        dataset = self.dataset
        if not isinstance(dataset, HostLocalSource):
            raise TypeError(
                f"DataLoader: {type(dataset).__name__} has no `seq_len`; batches built per host (several "
                "hosts, or host_local=True) need a dataset with `seq_len` and `batch(step, batch_size, rows=)`, "
                "e.g. a MixtureDataset"
            )
        size = self.batch_size(step) if callable(self.batch_size) else self.batch_size
        shape = (size, dataset.seq_len)
        index_map = self.sharding.addressable_devices_indices_map(shape)
        rows = sorted({r for idx in index_map.values() for r in range(size)[idx[0]]})
        local = dataset.batch(step, self.batch_size, rows=np.array(rows, dtype=np.int64))
        position = {r: i for i, r in enumerate(rows)}

        def part(array: np.ndarray) -> Any:
            # jax types the callback's argument `Index | None` but only ever passes an Index (it asserts
            # so before each call), hence the `| None` here and the assert.
            def cb(index: tuple[slice, ...] | None) -> np.ndarray:
                assert index is not None
                picked = [position[r] for r in range(size)[index[0]]]
                return array[picked][:, index[1]] if array.ndim == 2 else array[picked]

            return jax.make_array_from_callback(shape[: array.ndim], self._sharding_for(array.ndim), cb)

        return {k: part(v) for k, v in local.items()}

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
