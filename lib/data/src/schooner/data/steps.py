"""Step builders: data work as cached, versioned steps of an experiment graph.

Example:
    >>> from schooner.cluster import StepRunner
    >>> from schooner.data.steps import source_records
    >>> docs = source_records("python-docs")           # a lazy handle; nothing is written yet
    >>> StepRunner(prefix="/tmp/schooner").run([docs])  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from schooner.cluster import InputFiles, InputPath, ResourceConfig, StepHandle, step

from ._dataset import Dataset
from ._writer import WRITE_FORMATS, write_records
from .sources import SOURCES, iter_source, source_report


@dataclass(frozen=True)
class SourceRecordsConfig:
    """Config of `source_records`: which embedded source, and how to shard it."""

    source: str
    """One of `schooner.data.sources.SOURCES`."""
    format: str = "jsonl.zst"
    """Shard format, one of `WRITE_FORMATS`."""
    num_shards: int = 4
    """Number of shards of the output folder."""
    python: str = ""
    """The Python version the records come from (part of the identity: another version, other records)."""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(
                f"SourceRecordsConfig.source={self.source!r} is not an embedded source; use one of {sorted(SOURCES)}"
            )
        if self.format not in WRITE_FORMATS:
            raise ValueError(f"SourceRecordsConfig.format={self.format!r}; use one of {WRITE_FORMATS}")
        if isinstance(self.num_shards, bool) or not isinstance(self.num_shards, int) or self.num_shards < 1:
            raise ValueError(
                f"SourceRecordsConfig.num_shards must be an integer >= 1, got {self.num_shards!r}"
            )


def source_records(
    name: str,
    *,
    step_name: str | None = None,
    format: str = "jsonl.zst",
    num_shards: int = 4,
    resources: ResourceConfig | None = None,
) -> StepHandle:
    """A step writing embedded source `name` ("python-docs" or "python-code") as a record folder.

    The output folder holds `part-0000i-of-0000n.<format>` shards and `manifest.json` (with the source's
    build report: Python version, files, skips by reason); `read_records`/`list_shards` read it.
    """
    config = SourceRecordsConfig(
        source=name, format=format, num_shards=num_shards, python=sys.version.split()[0]
    )
    return step(
        step_name or f"data/{name}",
        _write_source,
        config,
        version="source-records-v1",
        resources=resources,
        description=f"embedded source {name!r} as records",
        resumable=True,  # finished shards are kept and skipped (their stats name the plan that wrote them)
    )


def _write_source(config: SourceRecordsConfig, output_path: str) -> dict:
    if config.python and config.python != sys.version.split()[0]:
        raise RuntimeError(
            f"step built for Python {config.python} runs on Python {sys.version.split()[0]}: the embedded corpus "
            "would differ; run it on the same Python version or rebuild the step"
        )
    report = source_report(config.source)
    manifest = write_records(
        iter_source(config.source),
        output_path,
        format=config.format,
        num_shards=config.num_shards,
        skip_existing=True,
        counters={"source.records": report["records"]},
        extra_manifest={"source_report": report},
    )
    return {"records": manifest["records"], "bytes": manifest["bytes"], "source_report": report}


# ------------------------------------------------------------------------------------ generic dataset steps


def function_path(fn: Callable[..., Any] | str) -> str:
    """`"package.module:function"` for a module-level function (what a step config stores)."""
    if isinstance(fn, str):
        if ":" not in fn:
            raise ValueError(f"pipeline={fn!r} must look like 'package.module:function'")
        return fn
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<" in qualname or module == "__main__":
        raise ValueError(
            f"pipeline={fn!r} must be a module-level function of an importable module (not a lambda, a nested "
            "function or a __main__ function): steps store it by name so workers can import it"
        )
    return f"{module}:{qualname}"


def resolve_function(path: str) -> Callable[..., Any]:
    """The function named by `function_path`."""
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _identity(ds: Dataset) -> Dataset:
    return ds


def length_filter(ds: Dataset, min_chars: int = 0, max_chars: int | None = None) -> Dataset:
    """A pipeline for `transform`: keep records whose text has `min_chars..max_chars` characters."""
    return ds.filter(_LengthBetween(min_chars, max_chars), reason="length")


@dataclass(frozen=True)
class _LengthBetween:
    lo: int
    hi: int | None

    def __call__(self, rec: dict) -> bool:
        n = len(rec["text"])
        return n >= self.lo and (self.hi is None or n <= self.hi)


def exact_dedup(ds: Dataset, key: str = "text") -> Dataset:
    """A pipeline for `transform`: keep the first record of each exact `key` value (a disk shuffle)."""
    return ds.deduplicate(key)


def as_step_inputs(items: Any, *, what: str = "inputs") -> list[Any]:
    """Step inputs from what a user passes: handles (and `handle / "sub"`) stay, paths, globs and URLs become
    `InputFiles`, keyed by their content (relative names, sizes, hashes), never by where they sit: moving a
    folder reruns nothing, editing a file reruns the steps that read it.

    Example:
        >>> as_step_inputs([])
        Traceback (most recent call last):
        ...
        ValueError: inputs is empty; give record folders, files, globs, URLs or step handles
    """
    if isinstance(items, str | StepHandle | InputPath | InputFiles) or not isinstance(items, Sequence):
        items = [items]
    if not items:
        raise ValueError(f"{what} is empty; give record folders, files, globs, URLs or step handles")
    return [InputFiles(os.fspath(x)) if isinstance(x, str | os.PathLike) else x for x in items]


def input_locations(inputs: Sequence[Any]) -> list[str]:
    """The paths a running step reads: its inputs as resolved by the runner, `InputFiles` as the patterns
    they were given (absolute), so a record folder is read as a folder."""
    out: list[str] = []
    for x in inputs:
        out.extend(x.patterns if isinstance(x, InputFiles) else [x])
    return out


@dataclass(frozen=True)
class TransformConfig:
    """Config of `transform`/`import_files`: inputs, the pipeline function and the output format."""

    inputs: Any
    """Step handles / InputPaths (paths when the step runs) and `InputFiles` (user files keyed by content)."""
    pipeline: str = "schooner.data.steps:_identity"
    """`module:function` taking a `Dataset` (and `params`) and returning the `Dataset` to write."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """JSON-able keyword arguments of the pipeline function (part of the step's identity)."""
    format: str = "jsonl.zst"
    """Output shard format, one of `WRITE_FORMATS`."""
    text_field: str = "text"
    """Input field holding the text."""
    id_field: str = "id"
    """Input field holding the id."""
    source: str | None = None
    """`source` of input rows that carry none (default: each file's stem)."""
    on_error: str = "raise"
    """Bad input: 'raise' or 'skip' (skips are counted in the manifest)."""
    num_shards: int | None = None
    """Output shards (records redistributed in order); None: one per input shard or reduce partition."""
    shard_bytes: int | None = None
    """Instead of `num_shards`: about this many bytes of JSON records per output shard."""

    def __post_init__(self) -> None:
        if self.format not in WRITE_FORMATS:
            raise ValueError(f"TransformConfig.format={self.format!r}; use one of {WRITE_FORMATS}")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"TransformConfig.on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.num_shards is not None and self.shard_bytes is not None:
            raise ValueError(
                f"TransformConfig: pass num_shards or shard_bytes, not both (got {self.num_shards=}, {self.shard_bytes=})"
            )
        for name in ("num_shards", "shard_bytes"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"TransformConfig.{name} must be None or an integer >= 1, got {name}={v!r}")
        function_path(self.pipeline)


def transform(
    name: str,
    inputs: Any,
    pipeline: Callable[..., Dataset] | str,
    *,
    params: Mapping[str, Any] | None = None,
    format: str = "jsonl.zst",
    version: str = "v1",
    text_field: str = "text",
    id_field: str = "id",
    source: str | None = None,
    on_error: str = "raise",
    num_shards: int | None = None,
    shard_bytes: int | None = None,
    resources: ResourceConfig | None = None,
) -> StepHandle:
    """A step that reads `inputs`, applies `pipeline(dataset, **params)` and writes a record folder.

    The pipeline is stored by name, so bump `version` when its code changes. The write resumes at shard
    granularity when a run is interrupted (each shard's stats carry the fingerprint of the plan, code
    included, that wrote it: a shard of another plan is rewritten). `num_shards` / `shard_bytes` set the
    output sharding (default: one shard per input shard). The step record holds the manifest's counters.

    Example:
        >>> def long_docs(ds, min_chars):   # in an importable module
        ...     return ds.filter(lambda r: len(r["text"]) >= min_chars, reason="short")
        >>> docs = source_records("python-docs")
        >>> long = transform("data/long-docs", docs, long_docs, params={"min_chars": 500})  # doctest: +SKIP
    """
    inputs = as_step_inputs(inputs, what=f"transform({name!r}) inputs")
    config = TransformConfig(
        inputs=inputs, pipeline=function_path(pipeline), params=dict(params or {}), format=format,
        text_field=text_field, id_field=id_field, source=source, on_error=on_error, num_shards=num_shards,
        shard_bytes=shard_bytes,
    )  # fmt: skip
    # Resumable: finished shards (listed with their stats) are kept and skipped on a rerun.
    return step(
        name, _run_transform, config, version=f"transform-{version}", resources=resources, resumable=True
    )


def import_files(
    name: str,
    paths: str | Sequence[str],
    *,
    format: str = "jsonl.zst",
    text_field: str = "text",
    id_field: str = "id",
    source: str | None = None,
    on_error: str = "raise",
    num_shards: int | None = None,
    shard_bytes: int | None = None,
    resources: ResourceConfig | None = None,
) -> StepHandle:
    """A step that normalises files (any readable format, globs, fsspec URLs, Hugging Face `save_to_disk`
    folders) into a record folder of `num_shards` shards or shards of about `shard_bytes` (default: one
    shard per input file)."""
    return transform(
        name, paths, _identity, format=format, text_field=text_field, id_field=id_field, source=source,
        on_error=on_error, num_shards=num_shards, shard_bytes=shard_bytes, resources=resources,
        version="import-v1",
    )  # fmt: skip


def _run_transform(config: TransformConfig, output_path: str) -> dict:
    ds = Dataset.from_files(
        input_locations(config.inputs), text_field=config.text_field, id_field=config.id_field, source=config.source,
        on_error=config.on_error,
    )  # fmt: skip
    out = resolve_function(config.pipeline)(ds, **dict(config.params))
    if not isinstance(out, Dataset):
        raise TypeError(f"pipeline {config.pipeline} returned {type(out).__name__}, expected a Dataset")
    n, size = config.num_shards, config.shard_bytes
    if config.format == "parquet":
        manifest = out.write_parquet(output_path, skip_existing=True, num_shards=n, shard_bytes=size)
    else:
        compression = {"jsonl": None, "jsonl.gz": "gz", "jsonl.zst": "zst"}[config.format]
        manifest = out.write_jsonl(
            output_path, compression=compression, skip_existing=True, num_shards=n, shard_bytes=size
        )
    return {
        "records": manifest["records"],
        "bytes": manifest["bytes"],
        "counters": manifest["counters"],
        "errors": manifest["errors"],
    }
