"""Step builders: data work as cached, versioned steps of an experiment graph.

Example:
    >>> from schooner.cluster import StepRunner
    >>> from schooner.data.steps import source_records
    >>> docs = source_records("python-docs")           # a lazy handle; nothing is written yet
    >>> StepRunner(prefix="/tmp/schooner").run([docs])  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from schooner.cluster import ResourceConfig, StepHandle, step

from . import step_inputs as _inputs
from ._dataset import Dataset
from ._step_runs import IDENTITY_PIPELINE, SourceRecordsConfig, TransformConfig, run_transform, write_source
from .pipelines import identity as _identity  # noqa: F401  (IDENTITY_PIPELINE names it: existing step keys)

# Step inputs moved to `schooner.data.step_inputs`; these two stay importable from here, without a warning,
# while schooner-tokenize still imports them from this module.
from .step_inputs import as_step_inputs as as_step_inputs
from .step_inputs import input_locations as input_locations

__all__ = ["SourceRecordsConfig", "TransformConfig", "import_files", "source_records", "transform"]


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
        write_source,
        config,
        version="source-records-v1",
        resources=resources,
        description=f"embedded source {name!r} as records",
        resumable=True,  # finished shards are kept and skipped (their stats name the plan that wrote them)
    )


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
        inputs=inputs, pipeline=_inputs.function_path(pipeline), params=dict(params or {}), format=format,
        text_field=text_field, id_field=id_field, source=source, on_error=on_error, num_shards=num_shards,
        shard_bytes=shard_bytes,
    )  # fmt: skip
    # Resumable: finished shards (listed with their stats) are kept and skipped on a rerun.
    return step(
        name, run_transform, config, version=f"transform-{version}", resources=resources, resumable=True
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
        name, paths, IDENTITY_PIPELINE, format=format, text_field=text_field, id_field=id_field, source=source,
        on_error=on_error, num_shards=num_shards, shard_bytes=shard_bytes, resources=resources,
        version="import-v1",
    )  # fmt: skip


_MOVED = {
    "exact_dedup": ("schooner.data.pipelines", "drop_exact_duplicates"),
    "length_filter": ("schooner.data.pipelines", "length_filter"),
    "function_path": ("schooner.data.step_inputs", "function_path"),
    "resolve_function": ("schooner.data.step_inputs", "resolve_function"),
    # imported here before steps.py held only builders (schooner-tokenize's S3 test imported it from here)
    "write_records": ("schooner.data", "write_records"),
}


def __getattr__(name: str) -> Any:
    """The names that moved out of this module, for one release, with a `DeprecationWarning`."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, new = _MOVED[name]
    what = f"schooner.data.steps.{name}"
    warnings.warn(
        f"{what} moved: use `from {module} import {new}`"
        + (
            " (renamed: the curation step `exact_dedup` marks duplicates, this pipeline drops them)"
            if name != new
            else ""
        )
        + "; the old name goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), new)
