"""The disk shuffle behind `group_by`/`deduplicate`, and the spill files between pipeline stages.

Map side: every record's key is encoded to canonical JSON bytes, hashed (crc32, the same on every machine
and run) to one of P partitions, and appended to that partition's file for this task. Reduce side: one
task per partition sorts its items by (key bytes, input order) — in memory when the partition's files fit
the memory budget, else as an external merge sort of budget-sized sorted runs spilled to disk — and hands
each group, in input order, to the reducer. Output order is therefore deterministic.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import pickle
import zlib
from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter
from typing import Any

import orjson

from . import _fs
from ._json import dumps_json

_BATCH = 1024
_SORT_KEY = itemgetter(0, 1)


def key_bytes(key: Any) -> bytes:
    """Canonical bytes of a group key (JSON with sorted object keys)."""
    try:
        return orjson.dumps(key, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return dumps_json(key)


def partition_of(kb: bytes, num_partitions: int) -> int:
    return zlib.crc32(kb) % num_partitions


# ------------------------------------------------------------------------------------------- spill files


def write_spill(path: str, items: Iterable[Any]) -> tuple[int, int]:
    """Write items as pickled batches, atomically; returns (count, bytes)."""
    n = 0
    with _fs.atomic_open(path) as f:
        batch: list[Any] = []
        for x in items:
            batch.append(x)
            if len(batch) >= _BATCH:
                pickle.dump(batch, f, protocol=pickle.HIGHEST_PROTOCOL)
                n += len(batch)
                batch = []
        if batch:
            pickle.dump(batch, f, protocol=pickle.HIGHEST_PROTOCOL)
            n += len(batch)
        size = f.tell()
    return n, size


def iter_spill_batches(path: str) -> Iterator[list[Any]]:
    for batch, _ in iter_sized_batches(path):
        yield batch


def iter_sized_batches(path: str) -> Iterator[tuple[list[Any], int]]:
    """(batch, its pickled size in bytes) for each batch of a spill file."""
    with _fs.open_file(path, "rb") as f:
        pos = 0
        while True:
            try:
                batch = pickle.load(f)
            except EOFError:
                return
            end = f.tell()
            yield batch, end - pos
            pos = end


def read_spill(path: str, start: int = 0, stop: int | None = None) -> Iterator[Any]:
    """Items `start:stop` of a spill file."""
    pos = 0
    for batch in iter_spill_batches(path):
        end = pos + len(batch)
        if end > start:
            lo = max(0, start - pos)
            hi = len(batch) if stop is None else min(len(batch), stop - pos)
            yield from batch[lo:hi]
        pos = end
        if stop is not None and pos >= stop:
            return


# --------------------------------------------------------------------------------------------- map side


def partition_path(stage_dir: str, partition: int, task: int) -> str:
    return _fs.join(stage_dir, f"p-{partition:05d}", f"t-{task:05d}.pkl")


def write_partitions(
    records: Iterable[dict], key_fn: Callable[[dict], Any], stage_dir: str, task: int, num_partitions: int
) -> list[int]:
    """Hash-partition `records` into one file per non-empty partition; returns items per partition.

    Each file is written under a temp name and renamed at the end, so a retried task replaces its files.
    """
    buffers: list[list[tuple]] = [[] for _ in range(num_partitions)]
    counts = [0] * num_partitions
    files: dict[int, Any] = {}
    cms: dict[int, Any] = {}
    buffered = 0
    try:
        for seq, rec in enumerate(records):
            kb = key_bytes(key_fn(rec))
            p = zlib.crc32(kb) % num_partitions
            buffers[p].append((kb, (task << 40) | seq, rec))
            counts[p] += 1
            buffered += 1
            if buffered >= 16 * _BATCH:
                _flush_all(buffers, files, cms, stage_dir, task)
                buffered = 0
        _flush_all(buffers, files, cms, stage_dir, task)
    except BaseException as e:
        for cm in cms.values():
            with contextlib.suppress(BaseException):
                cm.__exit__(type(e), e, e.__traceback__)
        raise
    for cm in cms.values():
        cm.__exit__(None, None, None)
    return counts


def _flush_all(buffers: list[list[tuple]], files: dict, cms: dict, stage_dir: str, task: int) -> None:
    for p, buf in enumerate(buffers):
        if not buf:
            continue
        if p not in files:
            cms[p] = _fs.atomic_open(partition_path(stage_dir, p, task))
            files[p] = cms[p].__enter__()
        for i in range(0, len(buf), _BATCH):
            pickle.dump(buf[i : i + _BATCH], files[p], protocol=pickle.HIGHEST_PROTOCOL)
        buffers[p] = []


# ------------------------------------------------------------------------------------------ reduce side


def _iter_items(files: list[str]) -> Iterator[tuple]:
    for path in files:
        for batch in iter_spill_batches(path):
            yield from batch


def sorted_items(
    files: list[str], memory_budget: int, scratch_dir: str, stats: dict[str, int]
) -> Iterator[tuple]:
    """All (key bytes, seq, record) items of `files` sorted by (key bytes, seq).

    When the files exceed `memory_budget` bytes, sorts budget-sized runs, spills each to `scratch_dir`,
    and merges them (counted in `stats["spilled_runs"]`).
    """
    total = sum(_fs.file_size(f) for f in files)
    if total <= memory_budget:
        items = list(_iter_items(files))
        items.sort(key=_SORT_KEY)
        yield from items
        return
    runs: list[str] = []
    run: list[tuple] = []
    run_bytes = 0.0
    for path in files:
        for batch, size in iter_sized_batches(path):
            per_item = size / max(len(batch), 1)  # the pickled size stands for the items' footprint
            for item in batch:
                run.append(item)
                run_bytes += per_item
                if run_bytes >= memory_budget:
                    runs.append(_spill_run(run, scratch_dir, len(runs)))
                    run, run_bytes = [], 0
    if run:
        runs.append(_spill_run(run, scratch_dir, len(runs)))
        run = []
    stats["spilled_runs"] = stats.get("spilled_runs", 0) + len(runs)
    try:
        yield from heapq.merge(*(read_spill(r) for r in runs), key=_SORT_KEY)
    finally:
        for r in runs:
            with contextlib.suppress(OSError):
                _fs.url_to_fs(r)[0].rm(_fs.url_to_fs(r)[1])


def _spill_run(run: list[tuple], scratch_dir: str, i: int) -> str:
    run.sort(key=_SORT_KEY)
    path = _fs.join(scratch_dir, f"run-{os.getpid()}-{i:05d}.pkl")
    write_spill(path, run)
    run.clear()
    return path


def reduce_groups(
    items: Iterator[tuple], key_fn: Callable[[dict], Any], reducer: Callable[[Any, list[dict]], Any],
    label: str, stats: dict[str, int],
) -> Iterator[dict]:  # fmt: skip
    """Apply `reducer(key, records_in_input_order)` per group; it returns a record, records, or None."""
    groups = 0
    n_in = 0
    for _, grp in itertools.groupby(items, key=itemgetter(0)):
        recs = [x[2] for x in grp]
        groups += 1
        n_in += len(recs)
        out = reducer(key_fn(recs[0]), recs)
        if out is None:
            continue
        if isinstance(out, dict):
            yield out
        else:
            yield from out
    stats["groups"] = groups
    stats["in"] = n_in


def keep_first(key: Any, records: list[dict]) -> dict:
    """The reducer of `deduplicate`: the first record of each group in input order."""
    return records[0]
