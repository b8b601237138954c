"""What the `consolidate` step runs: its config, the scores a `top_fraction` ranks, and the step function
that filters, cuts and cleans records and counts every change by reason."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from schooner.data import storage
from schooner.data._folders import list_shards
from schooner.data._readers import read_records
from schooner.data.step_inputs import input_locations

from ._attributes import with_attributes
from ._consolidate import Consolidator, Keep, TopFraction, lost_paragraph_lines, resolve_top_fraction
from ._step_io import one_folder, summary

logger = logging.getLogger("schooner.data.curation.steps")


@dataclass(frozen=True)
class ConsolidateConfig:
    inputs: Any
    attributes: Any
    keep: tuple[Keep, ...] = ()
    remove: tuple[str, ...] = ()
    attach_attributes: bool = True
    dropped_samples: int = 20
    num_shards: int | None = None
    extra: dict = field(default_factory=dict)
    fix_text: bool = True
    normalize_whitespace: bool = True
    remove_invisible: bool = True


def _scored(
    folders: Sequence[str], key: str, before: Sequence[Keep] = ()
) -> list[tuple[float, tuple[int, int]]]:
    """`(score, (shard, row))` of every record with a score `key` in the attribute folders (merged as
    `with_attributes` merges them, later folders winning) that the filters `before` keep: the records a
    `top_fraction` after them sees."""
    out = []
    shards = [list_shards(f) for f in folders]
    for i in range(min(map(len, shards), default=0)):
        readers = [read_records(s[i]) for s in shards]
        for j, recs in enumerate(zip(*readers)):
            attrs: dict[str, Any] = {}
            for r in recs:
                attrs.update(r["metadata"])
            v = attrs.get(key)
            if v is not None and all(k.check(attrs, (i, j)) for k in before):
                out.append((float(v), (i, j)))
    return out


def run_consolidate(config: ConsolidateConfig, output_path: str) -> dict:
    src = one_folder(config.inputs, "consolidate")
    folders = input_locations(config.attributes)
    keep: list[Keep] = []
    for k in config.keep:  # a top fraction is a share of the records the filters before it keep
        keep.append(
            resolve_top_fraction(k, _scored(folders, k.key, keep)) if isinstance(k, TopFraction) else k
        )
    c = Consolidator(tuple(keep), tuple(config.remove), config.attach_attributes, fix_text=config.fix_text,
                     normalize_whitespace=config.normalize_whitespace,
                     remove_invisible=config.remove_invisible)  # fmt: skip
    ds = with_attributes(src, folders, locate=True)
    manifest = ds.map_shard(c, with_counters=True, name="consolidate").write_jsonl(
        output_path, skip_existing=True, num_shards=config.num_shards
    )
    if config.dropped_samples:
        sampler = replace(c, attach=True, mode="dropped", sample=config.dropped_samples)
        ds.map_shard(sampler, with_counters=True, name="dropped").write_jsonl(
            storage.join(output_path, "dropped"), num_shards=1, progress=False
        )
    counters = manifest["counters"]
    dropped = {k.removeprefix("dropped."): v for k, v in counters.items() if k.startswith("dropped.")}
    removed = {k.removeprefix("removed."): v for k, v in counters.items() if k.startswith("removed.")}
    cleaned = {k.removeprefix("cleaned."): v for k, v in counters.items() if k.startswith("cleaned.")}
    lost: dict[str, int] = {}
    if counters.get("paragraph_firsts.dropped"):  # dropped records held first copies: count the lines lost
        n = lost_paragraph_lines(ds, keep)
        if n:
            lost["paragraph_dups"] = n
    if lost.get("paragraph_dups"):
        n = lost["paragraph_dups"]
        logger.warning(
            "consolidate %s: %d repeated paragraph%s (distinct lines) %s gone from the output: the first copy "
            "is in a dropped record and every copy in the kept records was cut (remove=['paragraph_dups']); "
            "compute paragraph_dedup with duplicates=[the exact_dedup/fuzzy_dedup steps] so the kept member of "
            "a cluster keeps them",
            output_path, n, "" if n == 1 else "s", "is" if n == 1 else "are",
        )  # fmt: skip
    return {**summary(manifest), "input_records": counters.get("read.records", 0), "dropped": dropped,
            "removed": removed, "lost": lost, "cleaned": cleaned, "filters": [k.name for k in keep],
            "thresholds": {k.name: getattr(k, "threshold", None) for k in keep},
            "ties_cut_at": {k.name: list(k.cut) for k in keep if isinstance(k, TopFraction) and k.cut}}  # fmt: skip
