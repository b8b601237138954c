"""Records of a plan handed to the caller (`Dataset.iter_records`, `collect`), with no durable staging.

Output folders need a shard per task, written atomically and durably; records returned in memory need
none of that. The last stage of a plan (every stage before it still ends in spill files) therefore runs:

- `client="inline"`: in this process, its records streamed to the caller as each task yields them (no
  file, no serialization: each record is copied as its JSON round trip would give it, ~4 us a page);
- on a `LocalClient`: in its worker processes, each task's records passed back with its result as JSON
  lines (the encoding of spill files; no file, no fsync; a task with over 64 MiB of them spills to a file);
- on any other client (Ray, whose workers may be on other hosts), or with `work_dir=` (which keeps every
  stage's finished tasks for a rerun): to spill files in the work folder, read back in order.

All three give the same records in the same order, count the same skipped input (a warning names how
many and the first few), and raise the same `DataError` for bad input (file and line); an exception raised by
a user's function arrives as itself in-process and, from a worker, wrapped in the client's `JobError` (as
for every operation run on a client); `stream` is the in-process path, on its own so tests
can compare it with the spill files (`via_files=True`).
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from typing import Any

from ._errors import SkipLog
from ._execute import (
    PERMANENT_ERRORS,
    CountSink,
    Execution,
    MemorySink,
    Progress,
    SpillSink,
    Task,
    execute_iter,
    open_task,
    resolve_client,
)
from ._json import copy_json
from ._plan import LastStage, Node, has_stages, log_reused, run_stages, work_folder
from ._spill import SpillInfo, decode_lines, read_spill_records, record_json
from ._splits import Split

_logger = logging.getLogger("schooner.data")

_WHERE = "a pipeline's output"


def iter_plan(
    splits: list[Split], nodes: tuple[Node, ...], exe: Execution, chain: list[Any] | None, *,
    via_files: bool = False,
) -> Iterator[dict]:  # fmt: skip
    """The records of the plan, in shard order (see the module docstring for where they travel)."""
    mode = "files" if via_files or exe.work_dir is not None else _mode(exe)
    # inline, the last stage writes nothing; a LocalClient task's records may spill past their budget, into
    # a folder made now (mkdtemp: private), not made on the way by the write (default permissions)
    with work_folder(exe, None, chain, needed=mode != "inline" or has_stages(nodes)) as work:
        durable = exe.work_dir is not None  # else a temporary folder: removed at the end, never reused
        last = run_stages(splits, nodes, exe, work, chain, durable=durable)
        out = f"{work}/out"
        if mode == "inline":
            yield from stream(last, exe)
        else:
            sink = (MemorySink(out, None, durable=False) if mode == "memory"
                    else SpillSink(out, last.plan, durable=durable))  # fmt: skip
            results: list[dict] = []
            for r in execute_iter(last.tasks(sink), exe, f"stage {last.stage}"):
                results.append(r)
                yield from records_of(r)
            log_reused(results, f"stage {last.stage}")
            last.add(results)
    report_skips(last.errors)


def _mode(exe: Execution) -> str:
    if exe.client == "inline":
        return "inline"
    from schooner.cluster import LocalClient

    return "memory" if isinstance(resolve_client(exe), LocalClient) else "files"


def records_of(result: dict) -> Iterator[dict]:
    """The records a `MemorySink` or `SpillSink` task result holds."""
    if "lines" in result:
        return iter(decode_lines(result["lines"]))
    return read_spill_records(SpillInfo.from_dict(result["spill"]))


def stream(last: LastStage, exe: Execution) -> Iterator[dict]:
    """Run the last stage's tasks in this process, one after another, yielding each record as it comes;
    the tasks' counters and skipped input go to `last`."""
    progress = Progress(f"stage {last.stage}", len(last.splits), enabled=exe.progress)
    try:
        for task in last.tasks(CountSink()):  # the sink is never fed: the records come here
            result = yield from _stream_task(task, exe.retries)
            last.add([result])
            progress.update(result)
    finally:
        progress.close()


def _stream_task(task: Task, retries: int) -> Generator[dict, None, dict]:
    """One task's records; returns its result. A transient error is retried as `run_task_with_retries`
    does, as long as none of the task's records has reached the caller (they cannot be taken back)."""
    attempt = 0
    while True:
        it, stats = open_task(task)
        n = 0
        try:
            for rec in it:
                yield copy_json(rec, _encode)
                n += 1
        except PERMANENT_ERRORS:  # bad input (DataError) and errors in user functions
            raise
        except Exception as e:
            if attempt >= retries or n:
                raise
            attempt += 1
            _logger.warning(
                "task %d (%s) failed (%r); retry %d of %d", task.index, task.split.label, e, attempt, retries
            )
            continue
        counters, skips = stats()
        return {
            "records": n,
            "bytes": 0,
            "counters": counters,
            "errors": skips.to_dict(),
            "attempts": attempt + 1,
        }


def _encode(rec: Any) -> bytes:
    return record_json(rec, _WHERE)


def report_skips(errors: SkipLog) -> None:
    """Say how much bad input was skipped (a collect has no manifest to count it in)."""
    if errors.skipped:
        _logger.warning(
            "skipped %d bad input record(s) (on_error='skip'; by reason: %s); the first: %s",
            errors.skipped,
            ", ".join(f"{k} {n}" for k, n in errors.counts().items()),
            "; ".join(errors.examples),
        )
