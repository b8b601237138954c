"""Running a `Dataset` plan stage by stage: stage boundaries, fingerprints, work folders and reuse.

A plan is its source splits and a chain of nodes: per-record `Op`s (fused into the tasks of a stage) and
stage boundaries (`Take`, `Reshard`, `GroupBy`). Every stage's output (spill files of `take`/`reshard`,
the map side of a shuffle) is fingerprinted with the plan up to it; in a stable work folder
(`<output>/.work-<fingerprint>`, or under `work_dir=`), a rerun of the same plan after a failure reuses the
stage tasks that finished and redoes only the rest. The work folder is removed once the plan succeeds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from . import storage
from ._errors import SkipLog
from ._execute import Execution, PartitionSink, Sink, SpillSink, Task, WriteSink, execute
from ._fingerprint import Unfingerprintable, fingerprint, token
from ._ops import LimitOp, Op, fn_name
from ._shuffle import keep_first
from ._spill import SpillInfo
from ._splits import ReduceSplit, SpillSplit, Split
from ._writer import merge_counters, plan_shards

_logger = logging.getLogger("schooner.data")


@dataclass(frozen=True)
class Take:
    n: int

    def token(self) -> Any:
        return ["take", self.n]

    def describe(self) -> str:
        return f"take {self.n} (stage boundary)"


@dataclass(frozen=True)
class Reshard:
    n: int

    def token(self) -> Any:
        return ["reshard", self.n]

    def describe(self) -> str:
        return f"reshard into {self.n} shards (stage boundary)"


@dataclass(frozen=True)
class GroupBy:
    key: Callable[[dict], Any]
    reducer: Callable[[Any, list[dict]], Any]
    label: str
    num_partitions: int | None
    memory_budget: int
    dedup: bool

    def token(self) -> Any:
        # The memory budget changes how the shuffle runs, never what it returns.
        return ["group_by", self.label, token(self.key), token(self.reducer), self.num_partitions, self.dedup]

    def describe(self) -> str:
        parts = self.num_partitions if self.num_partitions is not None else "one per input shard"
        what = "deduplicate" if self.dedup else f"group_by reducer={fn_name(self.reducer)}"
        return (
            f"{what} key={fn_name(self.key)} (as {self.label!r}; disk shuffle, partitions: {parts}, "
            f"memory_budget={self.memory_budget:,} bytes)"
        )


Node = Op | Take | Reshard | GroupBy


@dataclass(frozen=True)
class ShardTarget:
    """How many shards the final write produces: one per task (all None), a count, a size, or one per task
    at least and more where the tasks' output is over `max_shard_bytes`."""

    num_shards: int | None = None
    shard_bytes: int | None = None
    max_shard_bytes: int | None = None

    @property
    def given(self) -> bool:
        return self.num_shards is not None or self.shard_bytes is not None or self.max_shard_bytes is not None


def chain_tokens(splits: list[Split], nodes: tuple[Node, ...]) -> list[Any] | None:
    """Tokens of the plan: its source, then each node (None when some part cannot be fingerprinted)."""
    try:
        return [["source", [s.token() for s in splits]], *(n.token() for n in nodes)]
    except Unfingerprintable as e:
        _logger.warning("this pipeline cannot be fingerprinted (%s): nothing of an earlier run is reused", e)
        return None


def _fp(chain: list[Any] | None, upto: int, *extra: Any) -> str | None:
    return None if chain is None else fingerprint(chain[: upto + 1], *extra)


def has_stages(nodes: tuple[Node, ...], target: ShardTarget = ShardTarget()) -> bool:
    """Whether the plan runs stages before its last one (whose outputs go to the work folder)."""
    return target.given or any(not isinstance(n, Op) for n in nodes)


@contextlib.contextmanager
def work_folder(
    exe: Execution, output: str | None, chain: list[Any] | None, *, needed: bool = True
) -> Iterator[str]:
    """The folder for spill files. For a fingerprinted plan written to a folder (or with `work_dir=`) it is
    stable, named after the plan's source, and survives a failure, so a rerun finds the stage outputs
    that finished (each stage folder is named after the plan up to that stage); else a fresh folder, made
    only when `needed` (a plan of one stage whose output does not go to files needs none). Either way it is
    removed once the plan succeeds."""
    stable = chain is not None and (exe.work_dir is not None or output is not None)
    source = fingerprint(chain[:1]) if stable and chain is not None else None
    tag = source[:16] if source is not None else uuid.uuid4().hex[:12]
    if exe.work_dir is not None:
        work = storage.join(exe.work_dir, f"schooner-work-{tag}")
    elif output is not None:
        work = storage.join(output, f".work-{tag}")
    elif needed:
        work = tempfile.mkdtemp(prefix="schooner-data-")
    else:  # a name only: nothing is written there (should something be, it is removed all the same)
        work = os.path.join(tempfile.gettempdir(), f"schooner-data-{tag}")
    if needed or stable:
        storage.makedirs(work)
    ok = False
    try:
        yield work
        ok = True
    finally:
        if ok or source is None:
            with contextlib.suppress(OSError):
                storage.remove_tree(work)


def run_plan(
    splits: list[Split], nodes: tuple[Node, ...], make_sink: Callable[[int, str | None], Sink], exe: Execution,
    work: str, chain: list[Any] | None, target: ShardTarget = ShardTarget(), *, durable: bool = True,
) -> tuple[list[dict], dict[str, int], SkipLog]:  # fmt: skip
    """Run all stages; returns (final task results, counters of earlier stages, their skipped input).

    `make_sink(num_tasks, final_plan)` makes the sink of the last stage; `final_plan` fingerprints the
    whole plan (with the resolved shard count).
    """
    last = run_stages(splits, nodes, exe, work, chain, target, durable=durable)
    sink = make_sink(len(last.splits), last.plan)
    label = "write" if isinstance(sink, WriteSink) else f"stage {last.stage}"
    results = _stage(last.splits, last.ops, sink, exe, label)
    if not isinstance(sink, WriteSink):
        last.add(results)
    return results, last.counters, last.errors


@dataclass
class LastStage:
    """What remains of a plan once the stages before its last one ran: the last stage's splits and fused
    ops, its plan fingerprint, and the counters and skipped input of the stages before."""

    splits: list[Split]
    ops: list[Op]
    plan: str | None
    stage: int
    counters: dict[str, int]
    errors: SkipLog

    def tasks(self, sink: Sink) -> list[Task]:
        return [Task(i, s, tuple(self.ops), sink) for i, s in enumerate(self.splits)]

    def add(self, results: list[dict]) -> None:
        """Count the results of a stage's tasks in `counters` and `errors`."""
        for r in results:
            merge_counters(self.counters, r["counters"])
            self.errors.merge(r["errors"])


def run_stages(
    splits: list[Split], nodes: tuple[Node, ...], exe: Execution, work: str, chain: list[Any] | None,
    target: ShardTarget = ShardTarget(), *, durable: bool = True,
) -> LastStage:  # fmt: skip
    """Run every stage but the last (see `run_plan`); `durable=False` in a temporary work folder (its spill
    files are not fsync'd and no task files are kept for a rerun)."""
    last = LastStage(splits, [], None, 0, {}, SkipLog())
    for k, node in enumerate(nodes):
        if isinstance(node, Op):
            last.ops.append(node)
            continue
        splits, ops, stage = last.splits, last.ops, last.stage
        plan = _fp(chain, k + 1)
        stage_dir = storage.join(work, f"stage-{stage:02d}-{(plan or uuid.uuid4().hex)[:12]}")
        if isinstance(node, Take | Reshard):
            run_ops = ops + ([LimitOp(f"take[{node.n}]", node.n)] if isinstance(node, Take) else [])
            results = _stage(
                splits, run_ops, SpillSink(stage_dir, plan, durable=durable), exe, f"stage {stage}"
            )
            splits = (_take_splits(results, node.n, plan) if isinstance(node, Take)
                      else _reshard_splits(results, node.n, plan))  # fmt: skip
        else:
            p = node.num_partitions or len(splits)
            sink = PartitionSink(stage_dir, _fp(chain, k + 1, p), node.key, p, node.memory_budget, node.label,
                                 node.dedup, durable=durable)  # fmt: skip
            results = _stage(splits, ops, sink, exe, f"stage {stage} (shuffle)")
            splits = _reduce_splits(results, node, stage_dir, p, sink.plan)
        last.add(results)
        if isinstance(node, Take):  # each task passed on up to n records; the stage keeps the first n of all
            done = sum(r["records"] for r in results)
            key = f"take[{node.n}].out"
            last.counters[key] = last.counters.get(key, 0) - done + min(done, node.n)
        last.splits, last.ops, last.stage = splits, [], stage + 1
    if target.given and target.num_shards != len(last.splits):
        most = [target.max_shard_bytes] if target.max_shard_bytes is not None else []
        plan = _fp(chain, len(nodes), "shards", target.num_shards, target.shard_bytes, *most)
        stage_dir = storage.join(work, f"stage-{last.stage:02d}-{(plan or uuid.uuid4().hex)[:12]}")
        label = f"stage {last.stage} (to shards)"
        results = _stage(last.splits, last.ops, SpillSink(stage_dir, plan, durable=durable), exe, label)
        sizes = [SpillInfo.from_dict(r["spill"]).raw_bytes() for r in results]
        n = plan_shards(target.num_shards, target.shard_bytes, sizes, max_shard_bytes=target.max_shard_bytes)
        last.add(results)
        last.splits, last.ops = _reshard_splits(results, n, plan), []
    last.plan = _fp(chain, len(nodes), "final", len(last.splits))
    return last


def _stage(splits: list[Split], ops: list[Op], sink: Sink, exe: Execution, label: str) -> list[dict]:
    tasks = [Task(i, s, tuple(ops), sink) for i, s in enumerate(splits)]
    results = execute(tasks, exe, label)
    log_reused(results, label)
    return results


def log_reused(results: list[dict], label: str) -> None:
    reused = sum(1 for r in results if r.get("reused"))
    if reused:
        _logger.info(
            "%s: reused %d of %d finished tasks of an earlier run of this plan", label, reused, len(results)
        )


def _take_splits(results: list[dict], n: int, plan: str | None) -> list[Split]:
    out: list[Split] = []
    left = n
    for r in results:
        k = min(r["records"], left)
        if k > 0:
            out.append(SpillSplit(((r["spill"], 0, k),), len(out), plan))
        left -= k
    return out or [SpillSplit((), 0, plan)]


def _reshard_splits(results: list[dict], num_shards: int, plan: str | None) -> list[Split]:
    total = sum(r["records"] for r in results)
    bounds = [i * total // num_shards for i in range(num_shards + 1)]
    starts, pos = [], 0
    for r in results:
        starts.append(pos)
        pos += r["records"]
    out: list[Split] = []
    for j in range(num_shards):
        lo, hi = bounds[j], bounds[j + 1]
        pieces = []
        for r, s in zip(results, starts):
            a, b = max(lo, s), min(hi, s + r["records"])
            if a < b:
                pieces.append((r["spill"], a - s, b - s))
        out.append(SpillSplit(tuple(pieces), j, plan))
    return out


def _reduce_splits(
    results: list[dict], node: GroupBy, stage_dir: str, p: int, plan: str | None
) -> list[Split]:
    scratch = storage.join(stage_dir, "runs")
    storage.makedirs(scratch)
    out: list[Split] = []
    for part in range(p):
        inputs = tuple(r["spill"] for r in results if r["partitions"][part])
        reducer = keep_first if node.dedup else node.reducer
        out.append(ReduceSplit(inputs, part, node.key, reducer, node.label, node.memory_budget, scratch, plan,
                               node.dedup))  # fmt: skip
    return out
