"""The disk shuffle behind `group_by`/`deduplicate`.

Map side: every record's key is hashed to 64 bits (blake2b of its canonical bytes; the same on every
machine and run), which picks one of P partitions. Items `(hash, input order, record JSON)` are buffered
and written, a bounded number of bytes at a time, as compressed frames of ONE spill file per map task
(the frame index per partition comes back to the driver with the task's result).

Reduce side: one task per partition sorts its items by (hash, input order): in memory when they fit the
memory budget, else as an external merge sort of budget-sized sorted runs spilled to the scratch folder
(names unique per host, process and attempt; every run is checked against what its writer reported).
Equal hashes are adjacent; within such a group the records' real keys are compared, so two keys that
share a hash (a collision) are still two groups, handed to the reducer in input order. Output order is
deterministic: by key hash, then input order.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import orjson
import zstandard

from . import storage
from ._json import exact
from ._spill import (
    FRAME_BYTES,
    SpillInfo,
    SpillWriter,
    decode_items,
    encode_items,
    open_checked,
    read_frame,
    record_json,
)

ITEM_OVERHEAD = 48
"""Bytes of bookkeeping per buffered item (index arrays, Python references), counted against the budget."""
_SEQ_BITS = 40


def key_bytes(key: Any) -> bytes:
    """Canonical bytes of a group key: strings and bytes as themselves (type-tagged), anything else as
    JSON with sorted object keys. Raises `TypeError` for keys JSON cannot represent."""
    t = type(key)
    if t is str:
        return b"s" + key.encode("utf-8", "surrogatepass")
    if t in (bytes, bytearray, memoryview):
        return b"b" + bytes(key)
    try:
        return b"j" + orjson.dumps(key, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        import json

        return b"j" + json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def key_hash(kb: bytes) -> int:
    """The 64-bit hash of canonical key bytes (partition = hash % P; reducers sort by it)."""
    return int.from_bytes(hashlib.blake2b(kb, digest_size=8).digest(), "little")


def record_key(key_fn: Callable[[dict], Any], rec: dict, label: str) -> bytes:
    """`key_bytes(key_fn(rec))`, with an error naming the operation, the record and the key."""
    key = key_fn(rec)
    try:
        return key_bytes(key)
    except (TypeError, ValueError) as e:
        rid = rec.get("id") if isinstance(rec, dict) else None
        raise TypeError(
            f"{label}: the key of record id={rid!r} is {type(key).__name__} {str(key)[:60]!r}, which cannot "
            f"be a group key ({e}); return a str, bytes, number, bool, None, or lists/dicts of those"
        ) from None


def decode_record(payload: bytes) -> dict:
    return exact(orjson.loads(payload), payload)


# --------------------------------------------------------------------------------------------- map side


class PartitionWriter:
    """Hash-partitions one map task's records into one spill file, holding at most about
    `memory_budget / 2` bytes of items before writing them out as frames.

    With `keep_first` (deduplication) it also drops, exactly, the repeats of keys it has already written
    in this task (a key's first record in the task goes out; the reducer keeps the first of those across
    tasks): it remembers the key bytes of up to `memory_budget / 4` bytes of keys, forgetting them all when
    that fills up, so data with many duplicates shuffles a fraction of its bytes.
    """

    def __init__(
        self, path: str, num_partitions: int, memory_budget: int, task: int, key_fn: Callable, label: str,
        *, keep_first: bool = False, durable: bool = True,
    ) -> None:  # fmt: skip
        self.num_partitions, self.task, self.key_fn, self.label = num_partitions, task, key_fn, label
        self.keep_first = keep_first
        self.dropped = 0
        self._seen: dict[int, bytes] = {}
        self._seen_bytes = 0
        self._seen_cap = memory_budget // 4
        self._flush_at = max((memory_budget // 4) if keep_first else (memory_budget // 2), 1 << 16)
        self._frame_at = max(1 << 12, min(FRAME_BYTES, self._flush_at // 4))
        self._buf: list[tuple[list[int], list[int], list[bytes]]] = [
            ([], [], []) for _ in range(num_partitions)
        ]
        self._sizes = [0] * num_partitions
        self._buffered = 0
        self.counts = [0] * num_partitions
        self._writer = SpillWriter(path, durable=durable)

    def write(self, records: Iterator[dict]) -> SpillInfo:
        seq0 = self.task << _SEQ_BITS
        try:
            for i, rec in enumerate(records):
                kb = record_key(self.key_fn, rec, self.label)
                h = key_hash(kb)
                if self.keep_first and self._repeat(h, kb):
                    continue
                p = h % self.num_partitions
                payload = record_json(rec, self.label)
                hs, ss, ps = self._buf[p]
                hs.append(h)
                ss.append(seq0 | i)
                ps.append(payload)
                size = len(payload) + ITEM_OVERHEAD
                self._sizes[p] += size
                self._buffered += size
                self.counts[p] += 1
                if self._sizes[p] >= self._frame_at:
                    self._flush(p)
                if self._buffered >= self._flush_at:
                    for q in range(self.num_partitions):
                        self._flush(q)
            for q in range(self.num_partitions):
                self._flush(q)
        except BaseException as e:
            self._writer.abort(e)
            raise
        return self._writer.close()

    def _repeat(self, h: int, kb: bytes) -> bool:
        """Whether this task already wrote a record with key bytes `kb` (compared exactly)."""
        prev = self._seen.get(h)
        if prev is None:
            if self._seen_bytes + len(kb) > self._seen_cap:
                self._seen.clear()
                self._seen_bytes = 0
            self._seen[h] = kb
            self._seen_bytes += len(kb) + ITEM_OVERHEAD
            return False
        if prev == kb:
            self.dropped += 1
            return True
        return False  # another key with the same hash: the reducer tells them apart

    def _flush(self, p: int) -> None:
        hs, ss, ps = self._buf[p]
        if ps:
            self._writer.add_frame(encode_items(hs, ss, ps), len(ps), partition=p)
            self._buf[p] = ([], [], [])
            self._buffered -= self._sizes[p]
            self._sizes[p] = 0


# ------------------------------------------------------------------------------------------ reduce side


class _Run:
    """Items held in memory: decoded frames plus index arrays, sortable by (hash, input order)."""

    def __init__(self) -> None:
        self.hashes: list[np.ndarray] = []
        self.seqs: list[np.ndarray] = []
        self.frames: list[tuple[np.ndarray, memoryview]] = []
        self.bytes = 0
        self.items = 0

    def add(self, raw: bytes, n: int) -> None:
        h, s, offsets, blob = decode_items(raw, n)
        self.hashes.append(h)
        self.seqs.append(s)
        self.frames.append((offsets, blob))
        self.bytes += len(raw) + ITEM_OVERHEAD * n
        self.items += n

    def sorted(self) -> Iterator[tuple[int, int, bytes]]:
        """Yield (hash, seq, payload) in (hash, seq) order, releasing the buffers as it goes."""
        if not self.items:
            return
        hashes, seqs = np.concatenate(self.hashes), np.concatenate(self.seqs)
        frame_of = np.repeat(np.arange(len(self.frames), dtype=np.int32), [h.size for h in self.hashes])
        index_in = np.concatenate([np.arange(h.size, dtype=np.int64) for h in self.hashes])
        self.hashes, self.seqs = [], []
        order = np.lexsort((seqs, hashes))
        frames = self.frames
        for k in range(0, order.size, 4096):
            idx = order[k : k + 4096]
            for h, s, f, i in zip(hashes[idx].tolist(), seqs[idx].tolist(), frame_of[idx].tolist(),
                                  index_in[idx].tolist()):  # fmt: skip
                offsets, blob = frames[f]
                yield h, s, bytes(blob[offsets[i] : offsets[i + 1]])
        self.frames = []


def _iter_partition(inputs: list[SpillInfo], partition: int) -> Iterator[tuple[bytes, int]]:
    """The raw frames (uncompressed bytes, items) of `partition` in every input, checked as they are read."""
    dctx = zstandard.ZstdDecompressor()
    for info in inputs:
        frames = info.frames.get(partition, [])
        if not frames:
            continue
        with open_checked(info) as f:
            for frame in frames:
                yield read_frame(f, info, frame, dctx), frame[2]


def _write_run(items: Iterator[tuple[int, int, bytes]], path: str) -> SpillInfo:
    w = SpillWriter(path)
    hs: list[int] = []
    ss: list[int] = []
    ps: list[bytes] = []
    size = 0
    try:
        for h, s, p in items:
            hs.append(h)
            ss.append(s)
            ps.append(p)
            size += len(p) + 20
            if size >= _RUN_FRAME:
                w.add_frame(encode_items(hs, ss, ps), len(ps))
                hs, ss, ps, size = [], [], [], 0
        w.add_frame(encode_items(hs, ss, ps), len(ps))
    except BaseException as e:
        w.abort(e)
        raise
    return w.close()


_RUN_FRAME = 256 << 10


def _read_run(info: SpillInfo) -> Iterator[tuple[int, int, bytes]]:
    for raw, n in _iter_partition([info], 0):
        h, s, offsets, blob = decode_items(raw, n)
        for j, (hh, ss) in enumerate(zip(h.tolist(), s.tolist())):
            yield hh, ss, bytes(blob[offsets[j] : offsets[j + 1]])


def sorted_items(
    inputs: list[SpillInfo], partition: int, memory_budget: int, scratch_dir: str, stats: dict[str, int]
) -> Iterator[tuple[int, int, bytes]]:
    """All (hash, seq, record JSON) items of `partition` sorted by (hash, seq).

    When they exceed `memory_budget` bytes (their uncompressed size plus bookkeeping), sorts runs of half
    the budget, spills each to `scratch_dir` and merges them, in several passes when there are more runs
    than the budget can read at once (counted in `stats["spilled_runs"]`).
    """
    total = sum(i.raw_bytes(partition) + ITEM_OVERHEAD * i.items(partition) for i in inputs)
    if total <= memory_budget:
        run = _Run()
        for raw, n in _iter_partition(inputs, partition):
            run.add(raw, n)
        yield from run.sorted()
        return
    tag = storage.unique_tag()
    names = (storage.join(scratch_dir, f"r-{partition:05d}-{tag}-{i:05d}.spill") for i in itertools.count())
    runs: list[SpillInfo] = []
    try:
        run = _Run()
        for raw, n in _iter_partition(inputs, partition):
            run.add(raw, n)
            if run.bytes >= memory_budget // 2:
                runs.append(_write_run(run.sorted(), next(names)))
                run = _Run()
        if run.items:
            runs.append(_write_run(run.sorted(), next(names)))
        stats["spilled_runs"] = stats.get("spilled_runs", 0) + len(runs)
        # Each open run holds about one decoded frame (plus its items); merge as many at once as fit.
        fan_in = max(2, memory_budget // (4 * _RUN_FRAME))
        while len(runs) > fan_in:
            group, runs = runs[:fan_in], runs[fan_in:]
            runs.append(_write_run(heapq.merge(*map(_read_run, group)), next(names)))
            for r in group:
                storage.remove(r.path)
        yield from heapq.merge(*map(_read_run, runs))
    finally:
        for r in runs:
            storage.remove(r.path)


def reduce_groups(
    items: Iterator[tuple[int, int, bytes]], key_fn: Callable[[dict], Any],
    reducer: Callable[[Any, list[dict]], Any], label: str, stats: dict[str, int], *, keep_first: bool = False,
) -> Iterator[dict]:  # fmt: skip
    """Apply `reducer(key, records_in_input_order)` per group; it returns a record, records, or None.

    Items of one hash are split by their real key bytes (a hash collision makes two groups, counted in
    `stats["hash_collisions"]`). With `keep_first` (deduplication) only the first record of each key is
    kept in memory, however many duplicates it has.
    """
    groups = n_in = collisions = 0
    for _, grp in itertools.groupby(items, key=_hash_of):
        by_key: dict[bytes, list[dict]] = {}
        first = True
        for _, _, payload in grp:
            n_in += 1
            rec = decode_record(payload)
            if first:
                first = False
                single = rec
                continue
            if not by_key:
                by_key[record_key(key_fn, single, label)] = [single]
            kb = record_key(key_fn, rec, label)
            got = by_key.get(kb)
            if got is None:
                by_key[kb] = [rec]
            elif not keep_first:
                got.append(rec)
        subgroups = list(by_key.values()) if by_key else [[single]]
        collisions += len(subgroups) - 1
        for recs in subgroups:
            groups += 1
            out = reducer(key_fn(recs[0]), recs)
            if out is None:
                continue
            if isinstance(out, dict):
                yield out
            else:
                yield from out
    stats["groups"] = groups
    stats["in"] = n_in
    stats["hash_collisions"] = collisions


def _hash_of(item: tuple[int, int, bytes]) -> int:
    return item[0]


def keep_first(key: Any, records: list[dict]) -> dict:
    """The reducer of `deduplicate`: the first record of each group in input order."""
    return records[0]
