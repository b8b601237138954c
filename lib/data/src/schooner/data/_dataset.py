"""The lazy sharded `Dataset`: a plan of sources and operations, run stage by stage on a cluster client."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from . import _fs
from ._errors import SkipLog, check_on_error
from ._execute import CountSink, Execution, PartitionSink, SpillSink, Task, WriteSink, execute
from ._ops import Op, fn_name
from ._readers import detect_format
from ._shuffle import keep_first, partition_path, read_spill
from ._splits import FileSplit, HFSplit, ReadOptions, RecordsSplit, ReduceSplit, SpillSplit, load_hf
from ._writer import check_write_format, merge_counters, start_write, write_manifest

DEFAULT_MEMORY_BUDGET = 512 * 2**20
"""Bytes of shuffle data a `group_by` reduce task sorts in memory before spilling sorted runs to disk."""


@dataclass(frozen=True)
class _Take:
    n: int


@dataclass(frozen=True)
class _Reshard:
    n: int


@dataclass(frozen=True)
class _GroupBy:
    key: Callable[[dict], Any]
    reducer: Callable[[Any, list[dict]], Any]
    label: str
    num_partitions: int | None
    memory_budget: int
    dedup: bool


def _field_key(field: str) -> Callable[[dict], Any]:
    return _FieldKey(field)


@dataclass(frozen=True)
class _FieldKey:
    field: str

    def __call__(self, rec: dict) -> Any:
        return rec[self.field]

    @property
    def __name__(self) -> str:
        return self.field


class Dataset:
    """A lazy, sharded stream of records: build a plan, then run it with a terminal method.

    Per-record operations (`map`, `filter`, `flat_map`, `map_shard`, `select`) are fused and run as one
    task per shard on the current cluster client (`LocalClient` by default, `RayClient` for scale);
    `take`, `reshard` and `group_by`/`deduplicate` end a stage (`group_by` is a disk shuffle). Terminal
    methods (`write_jsonl`, `write_parquet`, `count`, `collect`, `iter_records`) take execution options
    (`client`, `max_workers`, `resources`, `retries`, `work_dir`, `progress`; see `Execution`).

    Example:
        >>> ds = Dataset.from_source("python-docs", num_shards=4)
        >>> ds = ds.filter(lambda r: len(r["text"]) > 200, reason="short")
        >>> manifest = ds.write_jsonl("/tmp/docs")  # doctest: +SKIP
        >>> manifest["counters"]["dropped.short"]  # doctest: +SKIP
    """

    def __init__(
        self, splits_fn: Callable[[], list[Any]], nodes: tuple[Any, ...] = (), describe: str = ""
    ) -> None:
        self._splits_fn = splits_fn
        self._nodes = nodes
        self._describe = describe

    # ------------------------------------------------------------------------------------------ sources

    @staticmethod
    def from_files(
        paths: str | Sequence[str],
        *,
        format: str | None = None,
        compression: str | None = None,
        text_field: str = "text",
        id_field: str = "id",
        source: str | None = None,
        columns: Sequence[str] | None = None,
        filter: Any = None,
        text_mode: str = "file",
        on_error: str = "raise",
        split_row_groups: bool = True,
    ) -> Dataset:
        """Records of files: paths, globs (any fsspec URL) or record folders; one shard per file, or per
        parquet row group (`split_row_groups`; row groups the `filter` excludes by statistics are skipped).
        See `read_records` for the other arguments."""
        check_on_error(on_error)
        opts = ReadOptions(
            text_field=text_field, id_field=id_field, source=source, format=format, compression=compression,
            columns=tuple(columns) if columns is not None else None, filter=filter, text_mode=text_mode,
            on_error=on_error,
        )  # fmt: skip
        plist = [paths] if isinstance(paths, str) else list(paths)

        def splits() -> list[Any]:
            from ._parquet import row_groups

            out: list[Any] = []
            for path in _fs.expand_paths(plist):
                fmt = format or detect_format(path)[0]
                if fmt == "parquet" and split_row_groups:
                    out.extend(FileSplit(path, opts, (rg,)) for rg in row_groups(path, filter))
                else:
                    out.append(FileSplit(path, opts))
            return out

        return Dataset(splits, describe=f"from_files({plist!r})")

    @staticmethod
    def from_records(records: Iterable[dict], *, num_shards: int = 1) -> Dataset:
        """Records held in memory, split contiguously into `num_shards` shards (the records travel with
        the tasks, so this is for small data and tests)."""
        _check_positive("num_shards", num_shards)
        recs = list(records)
        n = len(recs)
        shards = [tuple(recs[i * n // num_shards : (i + 1) * n // num_shards]) for i in range(num_shards)]
        return Dataset(
            lambda: [RecordsSplit(s, i) for i, s in enumerate(shards)], describe=f"from_records({n} records)"
        )

    @staticmethod
    def from_source(name: str, *, num_shards: int = 4) -> Dataset:
        """An embedded source of `schooner.data.sources` ("python-docs" or "python-code")."""
        from .sources import iter_source

        ds = Dataset.from_records(iter_source(name), num_shards=num_shards)
        ds._describe = f"from_source({name!r})"
        return ds

    @staticmethod
    def from_hf(
        path: str,
        *,
        split: str | None = None,
        text_field: str = "text",
        id_field: str = "id",
        source: str | None = None,
        num_shards: int = 1,
        on_error: str = "raise",
    ) -> Dataset:
        """A Hugging Face dataset: a folder written by `save_to_disk` (or a hub id, which needs network),
        in `num_shards` contiguous row ranges. Needs `datasets` (`schooner-data[hf]`)."""
        check_on_error(on_error)
        _check_positive("num_shards", num_shards)

        def splits() -> list[Any]:
            n = len(load_hf(path, split))
            return [
                HFSplit(
                    path,
                    split,
                    i * n // num_shards,
                    (i + 1) * n // num_shards,
                    text_field,
                    id_field,
                    source,
                    on_error,
                )
                for i in range(num_shards)
            ]

        return Dataset(splits, describe=f"from_hf({path!r}, split={split!r})")

    # ------------------------------------------------------------------------------------- operations

    def _with(self, node: Any) -> Dataset:
        return Dataset(self._splits_fn, self._nodes + (node,), self._describe)

    def _label(self, kind: str, fn: Any, name: str | None) -> str:
        base = name or f"{kind}:{fn_name(fn)}"
        used = {n.label for n in self._nodes if isinstance(n, Op | _GroupBy)}
        label, k = base, 2
        while label in used:
            label, k = f"{base}#{k}", k + 1
        return label

    def map(self, fn: Callable[[dict], dict], *, name: str | None = None) -> Dataset:
        """Replace each record by `fn(record)` (which must not return None; use `filter` to drop)."""
        return self._with(Op("map", fn, self._label("map", fn, name)))

    def filter(
        self, predicate: Callable[[dict], bool], *, reason: str | None = None, name: str | None = None
    ) -> Dataset:
        """Keep records where `predicate(record)` is true; drops count under `dropped.{reason}`."""
        label = self._label("filter", predicate, name)
        return self._with(Op("filter", predicate, label, reason or label))

    def flat_map(self, fn: Callable[[dict], Iterable[dict]], *, name: str | None = None) -> Dataset:
        """Replace each record by the records of `fn(record)` (zero or more)."""
        return self._with(Op("flat_map", fn, self._label("flat_map", fn, name)))

    def map_shard(
        self, fn: Callable[[Iterator[dict]], Iterable[dict]], *, name: str | None = None
    ) -> Dataset:
        """Replace each shard's record stream by `fn(stream)` (for per-shard state such as a loaded model)."""
        return self._with(Op("map_shard", fn, self._label("map_shard", fn, name)))

    def select(self, fields: Sequence[str]) -> Dataset:
        """Keep only `fields` of each record (missing fields are left out)."""
        fields = (fields,) if isinstance(fields, str) else tuple(fields)
        return self._with(Op("select", fields, self._label("select", None, "select")))

    def take(self, n: int) -> Dataset:
        """The first `n` records, in shard order."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"take(n) needs an integer n >= 0, got n={n!r}")
        return self._with(_Take(n))

    def reshard(self, num_shards: int) -> Dataset:
        """Redistribute the records, in order, into `num_shards` equal contiguous shards."""
        _check_positive("num_shards", num_shards)
        return self._with(_Reshard(num_shards))

    def group_by(
        self,
        key: str | Callable[[dict], Any],
        reducer: Callable[[Any, list[dict]], dict | Iterable[dict] | None],
        *,
        num_partitions: int | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        name: str | None = None,
    ) -> Dataset:
        """Group records by `key` (a field name or a function returning a JSON-able value) and replace each
        group by `reducer(key, records)` (a record, several, or None). A disk shuffle: map tasks partition
        by key hash to files; one reduce task per partition sorts its part, spilling sorted runs to disk
        past `memory_budget` bytes. Groups arrive in input order; one group must fit in memory."""
        key_fn = _field_key(key) if isinstance(key, str) else key
        if num_partitions is not None:
            _check_positive("num_partitions", num_partitions)
        _check_positive("memory_budget", memory_budget)
        label = self._label("group_by", key_fn, name)
        return self._with(_GroupBy(key_fn, reducer, label, num_partitions, memory_budget, dedup=False))

    def deduplicate(
        self,
        key: str | Callable[[dict], Any] = "text",
        *,
        num_partitions: int | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        name: str | None = None,
    ) -> Dataset:
        """Keep the first record (in input order) of each `key` value; drops count as `dropped.duplicate`."""
        key_fn = _field_key(key) if isinstance(key, str) else key
        _check_positive("memory_budget", memory_budget)
        label = self._label("deduplicate", key_fn, name)
        return self._with(_GroupBy(key_fn, keep_first, label, num_partitions, memory_budget, dedup=True))

    def explain(self) -> str:
        """The plan, one stage per line."""
        lines = [self._describe]
        for n in self._nodes:
            lines.append(f"  {n.kind}: {n.label}" if isinstance(n, Op) else f"  {n!r}")
        return "\n".join(lines)

    # --------------------------------------------------------------------------------------- terminals

    def write_jsonl(
        self,
        path: str,
        *,
        compression: str | None = "zst",
        compression_level: int = 3,
        skip_existing: bool = False,
        **execution: Any,
    ) -> dict:
        """Write one shard per task as `part-0000i-of-0000n.jsonl[.zst|.gz]` plus `manifest.json`.

        Args:
            path: Output folder (local path or fsspec URL).
            compression: `"zst"` (default), `"gz"` or None.
            compression_level: The zstd level (gzip uses its default).
            skip_existing: Keep shards an interrupted earlier run of the same pipeline finished.
            **execution: `Execution` options (client, max_workers, resources, retries, work_dir, progress).

        Returns:
            The manifest (records, bytes, shards, counters, skipped bad input).
        """
        formats = {
            None: "jsonl",
            "zst": "jsonl.zst",
            "zstd": "jsonl.zst",
            "gz": "jsonl.gz",
            "gzip": "jsonl.gz",
        }
        if compression not in formats:
            raise ValueError(f"compression must be None, 'zst' or 'gz', got compression={compression!r}")
        kw = (("zstd_level", compression_level),)
        return self._write(path, formats[compression], skip_existing, kw, Execution(**execution))

    def write_parquet(
        self,
        path: str,
        *,
        skip_existing: bool = False,
        row_group_size: int = 50_000,
        row_group_bytes: int = 64 << 20,
        compression_level: int = 3,
        **execution: Any,
    ) -> dict:
        """Write one parquet shard per task (record layout, zstd; metadata as JSON text) plus
        `manifest.json`; arguments as `write_jsonl`, plus the most records per row group and about the most
        text + metadata characters per row group (row groups are the units readers split work by)."""
        _check_positive("row_group_size", row_group_size)
        _check_positive("row_group_bytes", row_group_bytes)
        kw = (
            ("row_group_size", row_group_size),
            ("row_group_bytes", row_group_bytes),
            ("zstd_level", compression_level),
        )
        return self._write(path, "parquet", skip_existing, kw, Execution(**execution))

    def count(self, **execution: Any) -> int:
        """Run the pipeline and count the records it yields."""
        results, _, _ = self._run(lambda n, work: CountSink(), Execution(**execution), None)
        return sum(r["records"] for r in results)

    def collect(self, **execution: Any) -> list[dict]:
        """Run the pipeline and return all records, in shard order (for small results)."""
        return list(self.iter_records(**execution))

    def iter_records(self, **execution: Any) -> Iterator[dict]:
        """Run the pipeline, then yield its records in shard order from spill files."""
        exe = Execution(**execution)
        with self._work_dir(exe, None) as work:
            results, _, _ = self._run(lambda n, w: SpillSink(_fs.join(w, "out")), exe, work)
            for r in results:
                yield from read_spill(r["path"])

    def __iter__(self) -> Iterator[dict]:
        return self.iter_records()

    # -------------------------------------------------------------------------------------- execution

    @contextlib.contextmanager
    def _work_dir(self, exe: Execution, output: str | None) -> Iterator[str]:
        if exe.work_dir is not None:
            work = _fs.join(exe.work_dir, f"schooner-work-{uuid.uuid4().hex[:12]}")
        elif output is not None:
            work = _fs.join(output, f".work-{uuid.uuid4().hex[:12]}")
        else:
            work = tempfile.mkdtemp(prefix="schooner-data-")
        _fs.makedirs(work)
        try:
            yield work
        finally:
            with contextlib.suppress(OSError):
                _fs.remove_tree(work)

    def _write(self, path: str, fmt: str, skip_existing: bool, writer_kw: tuple, exe: Execution) -> dict:
        check_write_format(fmt)
        start_write(path, skip_existing=skip_existing)
        sinks: list[WriteSink] = []

        def make_sink(n: int, work: str) -> WriteSink:
            sinks.append(WriteSink(path, fmt, n, skip_existing, writer_kw))
            return sinks[-1]

        with self._work_dir(exe, path) as work:
            results, upstream, errors = self._run(make_sink, exe, work)
        names = [r["shard"] for r in results]
        return write_manifest(path, names, fmt, counters=upstream, errors=errors)

    def _run(
        self, make_sink: Callable[[int, str], Any], exe: Execution, work: str | None
    ) -> tuple[list[dict], dict[str, int], SkipLog]:
        """Run all stages; returns (final task results, counters of earlier stages, their skipped input)."""
        if work is None:
            with self._work_dir(exe, None) as w:
                return self._run(make_sink, exe, w)
        splits = self._splits_fn()
        if not splits:
            raise ValueError(f"{self._describe}: no input to read")
        counters: dict[str, int] = {}
        errors = SkipLog()
        ops: list[Op] = []
        stage = 0
        for node in self._nodes:
            if isinstance(node, Op):
                ops.append(node)
                continue
            stage_dir = _fs.join(work, f"stage-{stage:02d}")
            if isinstance(node, _Take | _Reshard):
                run_ops = ops + ([Op("limit", node.n, f"take[{node.n}]")] if isinstance(node, _Take) else [])
                results = self._stage(splits, run_ops, SpillSink(stage_dir), exe, f"stage {stage}")
                splits = (
                    _take_splits(results, node.n)
                    if isinstance(node, _Take)
                    else _reshard_splits(results, node.n)
                )
            else:
                p = node.num_partitions or len(splits)
                results = self._stage(
                    splits, ops, PartitionSink(stage_dir, node.key, p), exe, f"stage {stage} (shuffle)"
                )
                splits = _reduce_splits(results, node, stage_dir, p)
            for r in results:
                merge_counters(counters, r["counters"])
                errors.merge(r["errors"])
            ops, stage = [], stage + 1
        sink = make_sink(len(splits), work)
        results = self._stage(
            splits, ops, sink, exe, "write" if isinstance(sink, WriteSink) else f"stage {stage}"
        )
        if not isinstance(sink, WriteSink):
            for r in results:
                merge_counters(counters, r["counters"])
                errors.merge(r["errors"])
        return results, counters, errors

    @staticmethod
    def _stage(splits: list[Any], ops: list[Op], sink: Any, exe: Execution, label: str) -> list[dict]:
        tasks = [Task(i, s, tuple(ops), sink) for i, s in enumerate(splits)]
        return execute(tasks, exe, label)


def _take_splits(results: list[dict], n: int) -> list[Any]:
    out, left = [], n
    for r in results:
        k = min(r["records"], left)
        if k > 0:
            out.append(SpillSplit(((r["path"], 0, k),), len(out)))
        left -= k
    return out or [SpillSplit((), 0)]


def _reshard_splits(results: list[dict], num_shards: int) -> list[Any]:
    total = sum(r["records"] for r in results)
    bounds = [i * total // num_shards for i in range(num_shards + 1)]
    starts = []
    pos = 0
    for r in results:
        starts.append(pos)
        pos += r["records"]
    out = []
    for j in range(num_shards):
        lo, hi = bounds[j], bounds[j + 1]
        pieces = []
        for r, s in zip(results, starts):
            a, b = max(lo, s), min(hi, s + r["records"])
            if a < b:
                pieces.append((r["path"], a - s, b - s))
        out.append(SpillSplit(tuple(pieces), j))
    return out


def _reduce_splits(results: list[dict], node: _GroupBy, stage_dir: str, p: int) -> list[Any]:
    scratch = _fs.join(stage_dir, "runs")
    _fs.makedirs(scratch)
    out = []
    for part in range(p):
        files = tuple(
            partition_path(stage_dir, part, t) for t, r in enumerate(results) if r["partitions"][part]
        )
        out.append(
            ReduceSplit(
                files, node.key, node.reducer, node.label, node.memory_budget, scratch, part, node.dedup
            )
        )
    return out


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {name}={value!r}")
