"""The lazy sharded `Dataset`: a plan of sources and operations, run stage by stage on a cluster client."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ._collect import iter_plan
from ._errors import check_on_error
from ._execute import CountSink, Execution, WriteSink
from ._fingerprint import fingerprint
from ._folders import expand_paths
from ._ops import FilterOp, FlatMapOp, MapOp, MapShardOp, Op, SelectOp, fn_name
from ._plan import GroupBy, Node, Reshard, ShardTarget, Take, chain_tokens, has_stages, run_plan, work_folder
from ._readers import check_text_mode, detect_format
from ._shuffle import keep_first
from ._splits import FileSplit, HFSplit, ReadOptions, RecordsSplit, Split, load_hf
from ._writer import check_write_format, start_write, write_manifest

DEFAULT_MEMORY_BUDGET = 512 * 2**20
"""Bytes a shuffle task holds in memory (map-side buffers, reduce-side sorting) before spilling to disk."""


@dataclass(frozen=True)
class _FieldKey:
    """The key function of `group_by("field")`: a named, fingerprintable `record[field]`."""

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
        self, splits_fn: Callable[[], list[Split]], nodes: tuple[Node, ...] = (), describe: str = ""
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
        locate: bool = False,
    ) -> Dataset:
        """Records of files: paths, globs (any fsspec URL), record folders or folders written by Hugging Face
        `save_to_disk`; one shard per file, or per parquet row group (`split_row_groups`; row groups the
        `filter` excludes by statistics are skipped). With `locate`, each record gets
        `"_loc": [file index, record index in the file]` (one shard per file: row groups are not split).
        See `read_records` for the other arguments."""
        opts = ReadOptions(
            text_field=text_field, id_field=id_field, source=source, format=format, compression=compression,
            columns=tuple(columns) if columns is not None else None, filter=filter,
            text_mode=check_text_mode(text_mode), on_error=check_on_error(on_error), locate=locate,
        )  # fmt: skip
        plist = [paths] if isinstance(paths, str) else list(paths)

        def splits() -> list[Split]:
            out: list[Split] = []
            for i, path in enumerate(expand_paths(plist)):
                fmt = format or detect_format(path)[0]
                if fmt == "parquet" and split_row_groups and not locate:
                    from ._parquet import row_groups

                    out.extend(FileSplit(path, opts, (rg,)) for rg in row_groups(path, filter))
                else:
                    out.append(FileSplit(path, opts, index=i))
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

        def splits() -> list[Split]:
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

    def _with(self, node: Node) -> Dataset:
        return Dataset(self._splits_fn, self._nodes + (node,), self._describe)

    def _label(self, kind: str, fn: Any, name: str | None) -> str:
        base = name or f"{kind}:{fn_name(fn)}"
        used = {n.label for n in self._nodes if isinstance(n, Op | GroupBy)}
        label, k = base, 2
        while label in used:
            label, k = f"{base}#{k}", k + 1
        return label

    def map(self, fn: Callable[[dict], dict], *, name: str | None = None) -> Dataset:
        """Replace each record by `fn(record)` (which must not return None; use `filter` to drop)."""
        return self._with(MapOp(self._label("map", fn, name), fn))

    def filter(
        self, predicate: Callable[[dict], bool], *, reason: str | None = None, name: str | None = None
    ) -> Dataset:
        """Keep records where `predicate(record)` is true; drops count under `dropped.{reason}`."""
        label = self._label("filter", predicate, name)
        return self._with(FilterOp(label, predicate, reason or label))

    def flat_map(self, fn: Callable[[dict], Iterable[dict]], *, name: str | None = None) -> Dataset:
        """Replace each record by the records of `fn(record)` (zero or more)."""
        return self._with(FlatMapOp(self._label("flat_map", fn, name), fn))

    def map_shard(
        self, fn: Callable[..., Iterable[dict]], *, name: str | None = None, with_counters: bool = False
    ) -> Dataset:
        """Replace each shard's record stream by `fn(stream)` (for per-shard state such as a loaded model).
        With `with_counters`, `fn(stream, counters)` also gets a dict whose integer counts are added to the
        pipeline's counters (e.g. `counters["dropped.spam"] += 1`)."""
        return self._with(MapShardOp(self._label("map_shard", fn, name), fn, with_counters))

    def select(self, fields: Sequence[str]) -> Dataset:
        """Keep only `fields` of each record (missing fields are left out)."""
        fields = (fields,) if isinstance(fields, str) else tuple(fields)
        return self._with(SelectOp(self._label("select", None, "select"), fields))

    def take(self, n: int) -> Dataset:
        """The first `n` records, in shard order."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"take(n) needs an integer n >= 0, got n={n!r}")
        return self._with(Take(n))

    def reshard(self, num_shards: int) -> Dataset:
        """Redistribute the records, in order, into `num_shards` equal contiguous shards."""
        _check_positive("num_shards", num_shards)
        return self._with(Reshard(num_shards))

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
        key_fn = _FieldKey(key) if isinstance(key, str) else key
        if num_partitions is not None:
            _check_positive("num_partitions", num_partitions)
        _check_positive("memory_budget", memory_budget)
        label = self._label("group_by", key_fn, name)
        return self._with(GroupBy(key_fn, reducer, label, num_partitions, memory_budget, dedup=False))

    def deduplicate(
        self,
        key: str | Callable[[dict], Any] = "text",
        *,
        num_partitions: int | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        name: str | None = None,
    ) -> Dataset:
        """Keep the first record (in input order) of each `key` value; drops count as `dropped.duplicate`."""
        key_fn = _FieldKey(key) if isinstance(key, str) else key
        if num_partitions is not None:
            _check_positive("num_partitions", num_partitions)
        _check_positive("memory_budget", memory_budget)
        label = self._label("deduplicate", key_fn, name)
        return self._with(GroupBy(key_fn, keep_first, label, num_partitions, memory_budget, dedup=True))

    def explain(self) -> str:
        """The plan, one node per line (functions by name; stage boundaries marked)."""
        return "\n".join([self._describe, *(f"  {n.describe()}" for n in self._nodes)])

    # --------------------------------------------------------------------------------------- terminals

    def write_jsonl(
        self,
        path: str,
        *,
        compression: str | None = "zst",
        compression_level: int = 3,
        skip_existing: bool = False,
        num_shards: int | None = None,
        shard_bytes: int | None = None,
        max_shard_bytes: int | None = None,
        **execution: Any,
    ) -> dict:
        """Write `part-0000i-of-0000n.jsonl[.zst|.gz]` shards plus `manifest.json`.

        Args:
            path: Output folder (local path or fsspec URL).
            compression: `"zst"` (default), `"gz"` or None.
            compression_level: The zstd level (gzip uses its default).
            skip_existing: Keep shards an interrupted earlier run of the SAME plan finished (each shard's
                stats carry the plan's fingerprint: shards of another plan are rewritten, never reused).
            num_shards: Write this many shards (records redistributed in order), whatever the input's
                sharding; default: one shard per input shard (or per reduce partition).
            shard_bytes: Instead of `num_shards`: about this many bytes of JSON records per shard.
            max_shard_bytes: Instead of either: one shard per input shard at least, and more (records
                redistributed in order) where the output holds over this many bytes of JSON records (one
                large input file becomes several shards that later steps process in parallel).
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
        target = _target(num_shards, shard_bytes, max_shard_bytes)
        return self._write(path, formats[compression], skip_existing, kw, Execution(**execution), target)

    def write_parquet(
        self,
        path: str,
        *,
        skip_existing: bool = False,
        num_shards: int | None = None,
        shard_bytes: int | None = None,
        row_group_size: int = 50_000,
        row_group_bytes: int = 64 << 20,
        compression_level: int = 3,
        **execution: Any,
    ) -> dict:
        """Write parquet shards (record layout, zstd; metadata as typed columns, see `docs/formats.md`)
        plus `manifest.json`; arguments as `write_jsonl`, plus the most records per row group and about the
        most text + metadata characters per row group (row groups are the units readers split work by)."""
        _check_positive("row_group_size", row_group_size)
        _check_positive("row_group_bytes", row_group_bytes)
        kw = (
            ("row_group_size", row_group_size),
            ("row_group_bytes", row_group_bytes),
            ("zstd_level", compression_level),
        )
        target = _target(num_shards, shard_bytes)
        return self._write(path, "parquet", skip_existing, kw, Execution(**execution), target)

    def count(self, **execution: Any) -> int:
        """Run the pipeline and count the records it yields."""
        exe = Execution(**execution)
        splits = self._splits()
        with work_folder(exe, None, None, needed=has_stages(self._nodes)) as work:
            results, _, _ = run_plan(
                splits, self._nodes, lambda n, plan: CountSink(), exe, work, None, durable=False
            )
        return sum(r["records"] for r in results)

    def collect(self, **execution: Any) -> list[dict]:
        """Run the pipeline and return all records, in shard order (for small results; see `iter_records`)."""
        return list(self.iter_records(**execution))

    def iter_records(self, **execution: Any) -> Iterator[dict]:
        """Run the pipeline and yield its records in shard order.

        Nothing is staged durably for records that come back in memory: with `client="inline"` the last
        stage runs in this process and its records stream as they are made; on a `LocalClient` they come
        back from its workers with each task's result; on other clients (Ray), or with `work_dir=` (whose
        staged tasks a rerun reuses), they go through spill files in the work folder. Stages before the
        last (`take`, `reshard`, `group_by`) always end in spill files. Bad input skipped with
        `on_error="skip"` is counted and named in a warning (writes count it in their manifest)."""
        exe = Execution(**execution)
        splits = self._splits()
        chain = chain_tokens(splits, self._nodes) if exe.work_dir is not None else None
        return iter_plan(splits, self._nodes, exe, chain)

    def __iter__(self) -> Iterator[dict]:
        return self.iter_records()

    # -------------------------------------------------------------------------------------- execution

    def _splits(self) -> list[Split]:
        splits = self._splits_fn()
        if not splits:
            raise ValueError(f"{self._describe}: no input to read")
        return splits

    def _write(
        self, path: str, fmt: str, skip_existing: bool, writer_kw: tuple, exe: Execution, target: ShardTarget
    ) -> dict:
        check_write_format(fmt)
        splits = self._splits()
        chain = chain_tokens(splits, self._nodes)
        settings = ["write", fmt, [list(kv) for kv in writer_kw]]
        start_write(path, skip_existing=skip_existing)

        def make_sink(n: int, plan: str | None) -> WriteSink:
            return WriteSink(path, fmt, n, skip_existing, plan and fingerprint(plan, settings), writer_kw)

        with work_folder(exe, path, chain) as work:
            results, upstream, errors = run_plan(splits, self._nodes, make_sink, exe, work, chain, target)
        names = [r["shard"] for r in results]
        return write_manifest(path, names, fmt, counters=upstream, errors=errors)


def _target(
    num_shards: int | None, shard_bytes: int | None, max_shard_bytes: int | None = None
) -> ShardTarget:
    given = {k: v for k, v in (("num_shards", num_shards), ("shard_bytes", shard_bytes),
                               ("max_shard_bytes", max_shard_bytes)) if v is not None}  # fmt: skip
    if len(given) > 1:
        raise ValueError(
            f"pass num_shards or shard_bytes, not both (nor max_shard_bytes with either), got {given}"
        )
    for k, v in given.items():
        _check_positive(k, v)
    return ShardTarget(num_shards, shard_bytes, max_shard_bytes)


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {name}={value!r}")
