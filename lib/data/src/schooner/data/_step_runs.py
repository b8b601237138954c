"""What the data steps of `schooner.data.steps` run on a worker: their configs (the steps' identity) and
the functions that write their output folders."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._dataset import Dataset
from ._writer import WRITE_FORMATS, write_records
from .sources import SOURCES, iter_source, source_report
from .step_inputs import function_path, input_locations, resolve_function


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


def write_source(config: SourceRecordsConfig, output_path: str) -> dict:
    """The step function of `source_records`."""
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


IDENTITY_PIPELINE = "schooner.data.steps:_identity"
"""The pipeline of `import_files` (this name, not the function's new home, is in existing step keys)."""


@dataclass(frozen=True)
class TransformConfig:
    """Config of `transform`/`import_files`: inputs, the pipeline function and the output format."""

    inputs: Any
    """Step handles / InputPaths (paths when the step runs) and `InputFiles` (user files keyed by content)."""
    pipeline: str = IDENTITY_PIPELINE
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


def run_transform(config: TransformConfig, output_path: str) -> dict:
    """The step function of `transform` and `import_files`."""
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
