"""`LocalClient.map`: items in adaptive batches over warm workers, results yielded in input order.

Items travel in batches sized by `BatchSizer` (~20 ms of work per batch), and each worker keeps up to two
batches queued so it never waits for a round trip. Slow tasks get
batches of one. At most `window` results wait for an earlier slow item, which bounds memory on long inputs.
"""

from __future__ import annotations

import collections
import itertools
import pickle
import selectors
import uuid
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

from ._batching import BatchSizer
from ._client import WorkerDiedError, error_from_info
from ._pool import Pool, Reservation, WorkerProcess
from ._resources import ResourceConfig
from ._worker_pickle import dumps

_TARGET_BATCH_SECONDS = 0.02


class _Item:
    __slots__ = ("deaths", "index", "value")

    def __init__(self, index: int, value: Any, deaths: int = 0) -> None:
        self.index, self.value, self.deaths = index, value, deaths


def local_map(
    pool: Pool,
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    resources: ResourceConfig,
    workers: int,
    name: str,
    env: dict[str, str],
    caller_env: dict[str, str],
) -> Iterator[Any]:
    """Yield `fn(item)` for each item in order, on up to `workers` pool workers reserving `resources` each.

    Items see `caller_env` (the caller's environment when `map` was called) plus `env`.
    """
    total = len(items) if isinstance(items, Sized) else None
    if total == 0:
        return
    source = iter(items)
    counter = itertools.count()
    retry: collections.deque[_Item] = collections.deque()
    fn_key = uuid.uuid4().hex
    fn_bytes = dumps(fn)
    results: dict[int, tuple] = {}
    inflight: dict[WorkerProcess, collections.deque[tuple[int, list[_Item]]]] = {}
    next_yield = 0
    pulled = 0
    exhausted = False
    sizer = BatchSizer(_TARGET_BATCH_SECONDS, total=total)
    batch_ids = itertools.count()
    sel = selectors.DefaultSelector()
    window = 4096

    def take(n: int) -> list[_Item]:
        nonlocal pulled, exhausted
        out: list[_Item] = []
        while retry and len(out) < n:
            out.append(retry.popleft())
            if out[-1].deaths:  # a batch that lost its worker is rerun one item at a time: find the culprit
                return out
        while len(out) < n and not exhausted and pulled - next_yield < window:
            try:
                value = next(source)
            except StopIteration:
                exhausted = True
                break
            out.append(_Item(next(counter), value))
            pulled += 1
        return out

    def batch_size(nworkers: int) -> int:
        return sizer.size(nworkers, pulled, len(retry))

    def dispatch(w: WorkerProcess) -> bool:
        batch = take(batch_size(len(inflight)))
        if not batch:
            return False
        bid = next(batch_ids)
        send_fn = None if fn_key in w.map_fns else fn_bytes
        try:
            payload = dumps([it.value for it in batch])
        except Exception as exc:
            raise TypeError(
                f"map {name!r}: cannot send items {batch[0].index}..{batch[-1].index} to a worker ({exc}); "
                f"items must be picklable"
            ) from exc
        msg = ("map", bid, fn_key, send_fn, payload, envs[w], resources.max_retries_failure)
        inflight[w].append((bid, batch))
        if w.send(msg):
            w.map_fns.add(fn_key)
        return True  # a failed send shows up as the worker's death when we read from it

    def add_worker(held: Reservation) -> None:
        try:
            w = pool.checkout({**resources.env, **held.env()})
        except BaseException:
            pool.unreserve(held)
            raise
        holds[w] = held
        envs[w] = {**w.env_changes(caller_env), **env}
        inflight[w] = collections.deque()
        sel.register(w.sock, selectors.EVENT_READ, w)

    def worker_died(w: WorkerProcess) -> None:
        reason = w.death_reason()
        sel.unregister(w.sock)
        for _, batch in inflight.pop(w):
            for it in batch:
                it.deaths += 1
                if it.deaths > resources.max_retries_preemption:
                    results[it.index] = ("died", reason, it.deaths)
                else:
                    retry.append(it)
        pool.discard(w)
        add_worker(holds.pop(w))  # the reservation is still ours: replace the worker

    holds: dict[WorkerProcess, Reservation] = {}
    envs: dict[WorkerProcess, dict[str, str | None]] = {}
    try:
        first = pool.reserve(resources)
        if first is None:
            raise RuntimeError("LocalClient was shut down; create a new client")
        add_worker(first)
        while True:
            while len(holds) < workers and not (exhausted and not retry):
                more = pool.try_reserve(resources)
                if more is None:
                    break
                add_worker(more)
            for w, queue in inflight.items():
                # Queue a second batch only for quick items: a slow one queued behind another would wait
                # there while a different worker sits idle. Until the first batch is back, assume slow.
                depth = 2 if 0 < sizer.per_item * batch_size(len(inflight)) < 0.05 else 1
                while len(queue) < depth and dispatch(w):
                    pass
            while next_yield in results:
                res = results.pop(next_yield)
                if res[0] == "ok":
                    next_yield += 1
                    yield res[1]
                    continue
                label = f"{name}[{next_yield}]"
                if res[0] == "died":
                    raise WorkerDiedError(
                        label,
                        f"worker {res[1]} while running this item, {res[2]} times "
                        f"(ResourceConfig.max_retries_preemption={resources.max_retries_preemption})",
                    )
                raise error_from_info(label, res[1])
            if exhausted and not retry and not any(inflight.values()):
                return
            events = sel.select(timeout=1.0)
            if not events:  # a worker killed while a process it started holds its socket sends no EOF
                for w in [w for w, queue in inflight.items() if queue and w.exited_silently()]:
                    worker_died(w)
            for key, _ in events:
                w = key.data
                msg = w.recv()
                if msg is None:
                    worker_died(w)
                    continue
                _, bid, blob, seconds = msg
                head_bid, batch = inflight[w].popleft()
                assert head_bid == bid, "worker replies out of order"
                out = pickle.loads(blob)
                sizer.observe(seconds, len(batch))
                for it, (status, value) in zip(batch, out, strict=True):
                    results[it.index] = (status, value)
    finally:
        for w, queue in inflight.items():
            if queue:  # abandoned mid-batch (error or early exit): its results would arrive to nobody
                pool.discard(w)
            else:
                pool.checkin(w)
        sel.close()
        for held in holds.values():
            pool.unreserve(held)
