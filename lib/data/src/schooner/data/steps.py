"""Step builders: data work as cached, versioned steps of an experiment graph.

Example:
    >>> from schooner.cluster import StepRunner
    >>> from schooner.data.steps import source_records
    >>> docs = source_records("python-docs")           # a lazy handle; nothing is written yet
    >>> StepRunner(prefix="/tmp/schooner").run([docs])  # doctest: +SKIP
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from schooner.cluster import ResourceConfig, StepHandle, step

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
