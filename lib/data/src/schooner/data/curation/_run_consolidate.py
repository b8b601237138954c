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
from ._rules import RULE_SETS
from ._run_decontam import DecontamStepConfig
from ._run_steps import AttributeStepConfig
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


# The attributes each attribute step writes that filters and removals read, and the builder that computes one.
_MAKERS = {"lang": "language_id", "lang_score": "language_id", "exact_dup": "exact_dedup",
           "fuzzy_dup": "fuzzy_dedup", "paragraph_dups": "paragraph_dedup", "paragraph_firsts": "paragraph_dedup",
           "contaminated": "decontaminate", "c4_lines": "quality_rules(..., rules=('c4',))",
           **{r: f"quality_rules(..., rules=({r!r},))" for r in RULE_SETS}}  # fmt: skip


def _computes(handle: Any) -> tuple[str, set[str]] | None:
    """`(what, attribute names)` a step computes, None where it is not known before it runs (a folder)."""
    cfg = getattr(handle, "config", None)
    if isinstance(cfg, DecontamStepConfig):
        return "decontaminate", {"contaminated"}
    if not isinstance(cfg, AttributeStepConfig):
        return None
    kind, p = cfg.kind, cfg.params
    keys = {"language_id": {"lang", "lang_score"}, "exact_dedup": {"exact_dup"}, "fuzzy_dedup": {"fuzzy_dup"},
            "paragraph_dedup": {"paragraph_dups", "paragraph_firsts"}}.get(kind)  # fmt: skip
    if kind == "quality_rules":
        names = [n for n, _ in p]
        return ", ".join(names), set(names) | ({"c4_lines"} if "c4" in names else set())
    if kind == "quality_scores":
        return f"quality_scores key {p!r}", {p}
    return (kind, keys) if keys is not None else None


def check_attributes(
    name: str, attributes: Sequence[Any], keep: Sequence[Keep], remove: Sequence[str]
) -> None:
    """Refuse a filter or removal that reads an attribute no attribute step computes (when every attribute
    input is a step whose attributes are known), naming the step that computes it."""
    computed = [_computes(a) for a in attributes]
    known = [k for k in computed if k is not None]
    if len(known) < len(computed):
        return
    have = set().union(*(keys for _, keys in known)) if known else set()
    what = "; ".join(f"{getattr(a, 'name', a)} computes {w}" for a, (w, _) in zip(attributes, known))
    wants = [(str(k), n) for k in keep for n in k.needs() if n != "lang_score"]
    wants += [(f"remove=[{r!r}]", r) for r in remove]
    for who, attr in wants:
        if attr not in have:
            maker = _MAKERS.get(attr, f"quality_scores(..., key={attr!r})")
            raise ValueError(
                f"consolidate({name!r}): {who} reads attribute {attr!r}, which none of its attribute steps "
                f"computes ({what or 'none given'}); add a {maker} step to `attributes`"
            )
