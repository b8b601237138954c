"""Running a pipeline stage: one task per shard on the current cluster client, with retries and progress."""

from __future__ import annotations

import functools
import itertools
import logging
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import storage
from ._errors import DataError, SkipLog
from ._ops import Op, apply_ops
from ._shuffle import PartitionWriter
from ._spill import SpillError, SpillInfo, record_json, write_lines
from ._spill import write_spill_records as write_spill
from ._splits import Split
from ._writer import finished_shard, merge_counters, shard_name, write_shard

_logger = logging.getLogger("schooner.data")

# Errors a rerun cannot fix (bad input, bugs in user functions): never retried.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, TypeError, KeyError, AttributeError, IndexError, NotImplementedError, ImportError, SpillError,
)  # fmt: skip


@dataclass(frozen=True)
class Execution:
    """Where and how pipeline tasks run.

    Attributes:
        client: A `schooner.cluster.Client`; None means `current_client()` (LocalClient by default);
            `"inline"` runs every task in this process, one after another (debugging, and small collects:
            the records of the last stage then stream to the caller with nothing written).
        max_workers: At most this many tasks at once (None: as many as the client fits).
        resources: Resources of each task (None: one CPU).
        retries: Reruns of a task that failed with a transient error (I/O, a lost worker); bad input and
            errors in user functions fail at once.
        work_dir: Folder (local or fsspec URL, reachable from all workers) for shuffle and spill files;
            None: a hidden folder inside the output folder (`.work-*`), or a local temp folder. For a
            fingerprinted plan the folder survives a failure, so a rerun reuses the stage tasks that
            finished; it is removed once the plan succeeds.
        progress: Report progress while running (a live line on a terminal, else log lines).
    """

    client: Any = None
    max_workers: int | None = None
    resources: Any = None
    retries: int = 2
    work_dir: str | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"Execution.retries must be an integer >= 0, got retries={self.retries!r}")
        if self.max_workers is not None and (not isinstance(self.max_workers, int) or self.max_workers < 1):
            raise ValueError(
                f"Execution.max_workers must be None or an integer >= 1, got {self.max_workers!r}"
            )


# -------------------------------------------------------------------------------------------------- sinks

Stats = Callable[[], tuple[dict, SkipLog]]
"""Reads a task's counters and skipped input so far (call it after the records are consumed)."""


class Sink(ABC):
    """Where a task's records go. `done` may return the result of an identical earlier run of the task
    (then nothing is read); `commit` persists a finished task's full result when the sink can reuse it."""

    def done(self, index: int) -> dict | None:
        return None

    @abstractmethod
    def consume(self, records: Iterator[dict], index: int, stats: Stats) -> dict:
        """Drain `records`; returns the task's result (at least `records` and `bytes`)."""

    def commit(self, index: int, result: dict) -> None:
        return None


@dataclass(frozen=True)
class WriteSink(Sink):
    """Write the task's records as shard `index` of a record folder (its stats carry the plan)."""

    folder: str
    format: str
    num_shards: int
    skip_existing: bool
    plan: str | None
    writer_kw: tuple[tuple[str, Any], ...] = ()

    def name(self, index: int) -> str:
        return shard_name(index, self.num_shards, self.format)

    def done(self, index: int) -> dict | None:
        if not self.skip_existing:
            return None
        prior = finished_shard(self.folder, self.name(index), self.plan)
        if prior is None:
            return None
        return {"shard": self.name(index), "records": prior["records"], "bytes": prior["bytes"],
                "counters": {}, "errors": SkipLog().to_dict()}  # fmt: skip

    def consume(self, records: Iterator[dict], index: int, stats: Stats) -> dict:
        name = self.name(index)
        counters: dict[str, int] = {}
        skips = SkipLog()

        def tracked() -> Iterator[dict]:
            yield from records
            c, s = stats()
            counters.update(c)
            skips.merge(s)

        out = write_shard(
            self.folder, name, tracked(), counters=counters, errors=skips, plan=self.plan,
            **dict(self.writer_kw),
        )  # fmt: skip
        return {"shard": name, "records": out["records"], "bytes": out["bytes"]}


@dataclass(frozen=True)
class _StageSink(Sink):
    """A sink whose output is an intermediate spill file, reusable by a rerun of the same plan: the task's
    result is saved as `t-NNNNN.json` next to it once the task has finished."""

    stage_dir: str
    plan: str | None
    durable: bool = field(default=True, kw_only=True)
    """False in a temporary work folder (removed when the plan ends, never reused): no fsync, no task file."""

    def _manifest(self, index: int) -> str:
        return storage.join(self.stage_dir, f"t-{index:05d}.json")

    def done(self, index: int) -> dict | None:
        if self.plan is None or not storage.exists(self._manifest(index)):
            return None
        try:
            saved = storage.read_json(self._manifest(index))
            info = SpillInfo.from_dict(saved["spill"])
            ok = saved.get("plan") == self.plan and storage.file_size(info.path) == info.size
        except (OSError, ValueError, KeyError):
            return None
        return saved["result"] if ok else None

    def commit(self, index: int, result: dict) -> None:
        if self.plan is not None and self.durable:
            storage.write_json(
                self._manifest(index), {"plan": self.plan, "spill": result["spill"], "result": result}
            )

    def _path(self, index: int) -> str:
        return storage.join(self.stage_dir, f"t-{index:05d}-{storage.unique_tag()}.spill")


@dataclass(frozen=True)
class SpillSink(_StageSink):
    """Write the task's records to an intermediate spill file."""

    def consume(self, records: Iterator[dict], index: int, stats: Stats) -> dict:
        info, n = write_spill(self._path(index), records, durable=self.durable)
        return {"spill": info.to_dict(), "records": n, "bytes": info.size}


@dataclass(frozen=True)
class MemorySink(_StageSink):
    """Pass the task's records back with its result, as JSON lines (the encoding of spill files, so they
    come back exactly as through one; no file, no fsync). A task whose records pass `max_bytes` of JSON
    writes them all to a spill file instead (a collect of big shards must not hold them in memory twice)."""

    max_bytes: int = 64 << 20

    def consume(self, records: Iterator[dict], index: int, stats: Stats) -> dict:
        lines: list[bytes] = []
        size = 0
        for rec in records:
            line = record_json(rec, "a pipeline's output", newline=True)
            lines.append(line)
            size += len(line)
            if size > self.max_bytes:
                rest = (record_json(r, "a pipeline's output", newline=True) for r in records)
                info, n = write_lines(self._path(index), itertools.chain(lines, rest), durable=self.durable)
                return {"spill": info.to_dict(), "records": n, "bytes": info.size}
        return {"lines": b"".join(lines), "records": len(lines), "bytes": size}


@dataclass(frozen=True)
class PartitionSink(_StageSink):
    """Hash-partition the task's records by key into one spill file (the map side of `group_by`)."""

    key_fn: Callable[[dict], Any] = None  # type: ignore[assignment]
    num_partitions: int = 1
    memory_budget: int = 1 << 29
    label: str = "group_by"
    keep_first: bool = False

    def consume(self, records: Iterator[dict], index: int, stats: Stats) -> dict:
        w = PartitionWriter(self._path(index), self.num_partitions, self.memory_budget, index, self.key_fn,
                            self.label, keep_first=self.keep_first, durable=self.durable)  # fmt: skip
        info = w.write(records)
        extra = (
            {f"{self.label}.dropped_early": w.dropped, "dropped.duplicate": w.dropped}
            if self.keep_first
            else {}
        )
        return {"spill": info.to_dict(), "partitions": w.counts, "records": sum(w.counts), "bytes": info.size,
                "extra_counters": extra}  # fmt: skip


@dataclass(frozen=True)
class CountSink(Sink):
    def consume(self, records: Iterator[dict], index: int, stats: Stats) -> dict:
        n = 0
        for _ in records:
            n += 1
        return {"records": n, "bytes": 0}


# -------------------------------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class Task:
    """One task of a stage: read `split`, apply the fused `ops`, feed `sink`."""

    index: int
    split: Split
    ops: tuple[Op, ...]
    sink: Sink


def _counting_reader(it: Iterator[dict], box: list[int]) -> Iterator[dict]:
    for r in it:
        box[0] += 1
        yield r


def open_task(task: Task) -> tuple[Iterator[dict], Stats]:
    """The task's output records (its split read through the fused ops) and the reader of its counters."""
    skips = SkipLog()
    split_counters: dict[str, int] = {}
    n_read = [0]
    reader = _counting_reader(task.split.iterate(skips, split_counters), n_read)
    it, op_counters = apply_ops(reader, task.ops)

    def stats() -> tuple[dict, SkipLog]:
        c: dict[str, int] = {}
        if task.split.reads_input:
            c["read.records"] = n_read[0]
            c["read.skipped"] = skips.skipped
        merge_counters(c, split_counters)
        merge_counters(c, op_counters())
        return c, skips

    return it, stats


def run_task(task: Task) -> dict:
    """Read the split, apply the fused ops, feed the sink; returns the sink result plus counters."""
    prior = task.sink.done(task.index)
    if prior is not None:
        return {**prior, "reused": True}
    it, stats = open_task(task)
    result = task.sink.consume(it, task.index, stats)
    counters, skips = stats()
    merge_counters(counters, result.pop("extra_counters", {}))
    result = {**result, "counters": counters, "errors": skips.to_dict()}
    task.sink.commit(task.index, result)
    return result


def run_task_with_retries(task: Task, retries: int) -> dict:
    """`run_task`, rerun up to `retries` times on transient errors. A `DataError` comes back as a value
    so the caller re-raises it unchanged (same type and message) whichever client ran the task."""
    attempt = 0
    while True:
        try:
            result = run_task(task)
            result["attempts"] = attempt + 1
            return result
        except DataError as e:
            return {"data_error": e}
        except PERMANENT_ERRORS:
            raise
        except Exception as e:
            if attempt >= retries:
                raise
            attempt += 1
            _logger.warning(
                "task %d (%s) failed (%r); retry %d of %d", task.index, task.split.label, e, attempt, retries
            )


def execute(tasks: Sequence[Task], exe: Execution, label: str) -> list[dict]:
    """Run `tasks` (one per shard) and return their results in order; re-raises bad input as `DataError`."""
    return list(execute_iter(tasks, exe, label))


def execute_iter(tasks: Sequence[Task], exe: Execution, label: str) -> Iterator[dict]:
    """`execute`, yielding each result as soon as it and those before it are done."""
    fn = functools.partial(run_task_with_retries, retries=exe.retries)
    if exe.client == "inline":
        results: Iterator[dict] = map(fn, tasks)
    else:
        results = resolve_client(exe).map(
            fn, list(tasks), resources=exe.resources, max_workers=exe.max_workers, name=label
        )
    progress = Progress(label, len(tasks), enabled=exe.progress)
    try:
        for r in results:
            if "data_error" in r:
                raise r["data_error"]
            progress.update(r)
            yield r
    finally:
        progress.close()
        # Stop the client's map now (not whenever the garbage collector finds it), so workers still busy
        # with abandoned shards are released before anything else runs.
        close = getattr(results, "close", None)
        if close is not None:
            close()


def resolve_client(exe: Execution) -> Any:
    """The cluster client tasks run on: `exe.client`, else `current_client()` (not for `"inline"`)."""
    from schooner.cluster import current_client

    return exe.client if exe.client is not None else current_client()


class Progress:
    """Tasks done, records and MB so far: a live line on a terminal, else a log line every 10 s."""

    def __init__(self, label: str, total: int, *, enabled: bool = True) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self.done = self.records = self.bytes = 0
        self.t0 = self.last = time.monotonic()
        self.tty = enabled and sys.stderr.isatty()

    def update(self, result: dict) -> None:
        self.done += 1
        self.records += int(result.get("records", 0))
        self.bytes += int(result.get("bytes", 0))
        now = time.monotonic()
        if self.tty:
            sys.stderr.write("\r" + self.line() + " " * 4)
            sys.stderr.flush()
        elif self.enabled and now - self.last >= 10:
            _logger.info("%s", self.line())
            self.last = now

    def line(self) -> str:
        dt = max(time.monotonic() - self.t0, 1e-9)
        return (
            f"[schooner.data] {self.label}: {self.done}/{self.total} shards, {self.records:,} records, "
            f"{self.records / dt:,.0f} rec/s"
        )

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\r" + self.line() + "\n")
            sys.stderr.flush()
        elif self.enabled and self.done:
            _logger.info("%s", self.line())
