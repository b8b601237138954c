"""Per-task overhead of the clients, against a plain `concurrent.futures.ProcessPoolExecutor(2)`.

Runs, in the same process and on the same 2 workers each:
  * 1,000 tiny tasks (`x + 1`): what the engine costs per task;
  * 20 tasks of ~50 ms of CPU work each: whether the engine keeps 2 cores busy.
through `LocalClient.map`, `RayClient.map` (a local Ray with 2 CPUs) and `ProcessPoolExecutor(2).map`
(default chunksize=1, the plain usage; chunksize=50 is shown too as a tuned peer). Pools are warmed up first
(worker start-up is reported separately as "cold"), then each measurement is the best of 3 repeats.
Prints tasks/s and the ratio of each engine to the plain process pool. Target: LocalClient >= 0.8x on tiny tasks.

    uv run python benchmarks/cluster_overhead.py [--no-ray]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor

TINY_TASKS = 1000
BUSY_TASKS = 20
BUSY_SECONDS = 0.05
REPEATS = 3


def tiny(x: int) -> int:
    return x + 1


def busy(x: int) -> int:
    """~50 ms of pure-Python CPU work."""
    end = time.perf_counter() + BUSY_SECONDS
    n = 0
    while time.perf_counter() < end:
        n += 1
    return x


def _best(run: Callable[[], list], expected: list) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
        assert out == expected, "wrong results"
    return min(times)


def measure(name: str, mapper: Callable[[Callable, Iterable], list], cold: float) -> dict[str, float]:
    tiny_items, busy_items = list(range(TINY_TASKS)), list(range(BUSY_TASKS))
    t_tiny = _best(lambda: mapper(tiny, tiny_items), [x + 1 for x in tiny_items])
    t_busy = _best(lambda: mapper(busy, busy_items), busy_items)
    return {"name": name, "tiny": TINY_TASKS / t_tiny, "busy": BUSY_TASKS / t_busy, "cold": cold}


def _cold(start: Callable[[], object]) -> float:
    t = time.perf_counter()
    start()
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--no-ray", action="store_true", help="skip RayClient")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from schooner.cluster import LocalClient

    rows = []
    with ProcessPoolExecutor(2) as pool:
        cold = _cold(lambda: list(pool.map(tiny, range(4))))
        rows.append(measure("ProcessPoolExecutor(2)", lambda f, xs: list(pool.map(f, xs)), cold))
        rows.append(
            measure(
                "ProcessPoolExecutor(2), chunksize=50", lambda f, xs: list(pool.map(f, xs, chunksize=50)), 0.0
            )
        )

    with LocalClient(max_workers=2) as local:
        cold = _cold(lambda: list(local.map(tiny, range(4))))
        rows.append(measure("LocalClient(max_workers=2).map", lambda f, xs: list(local.map(f, xs)), cold))

    if not args.no_ray:
        from schooner.cluster import RayClient

        t = time.perf_counter()
        ray = RayClient(address="local", num_cpus=2, include_dashboard=False, object_store_memory=300 * 10**6)
        try:
            list(ray.map(tiny, range(4)))
            cold = time.perf_counter() - t
            rows.append(measure("RayClient(num_cpus=2).map", lambda f, xs: list(ray.map(f, xs)), cold))
        finally:
            ray.shutdown()

    peer = rows[0]
    print(
        f"\n{'engine':40s} {'tiny tasks/s':>13s} {'ratio':>7s} {'50ms tasks/s':>13s} {'ratio':>7s} {'cold start':>11s}"
    )
    for r in rows:
        cold = f"{r['cold']:.2f} s" if r["cold"] else "-"
        print(
            f"{r['name']:40s} {r['tiny']:13.0f} {r['tiny'] / peer['tiny']:6.2f}x "
            f"{r['busy']:13.1f} {r['busy'] / peer['busy']:6.2f}x {cold:>11s}"
        )
    local = next(r for r in rows if r["name"].startswith("LocalClient"))
    ratio = local["tiny"] / peer["tiny"]
    print(
        f"\nLocalClient.map on {TINY_TASKS} tiny tasks: {ratio:.2f}x the plain process pool (target >= 0.8x): "
        f"{'PASS' if ratio >= 0.8 else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
