"""What the extraction, attribute and classifier steps of `schooner.data.curation.steps` run on a worker:
their configs (the steps' identity: class names and fields, not modules) and step functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schooner.data import DataError, storage
from schooner.data.step_inputs import input_locations

from ._attributes import attribute_dataset, iter_attributes
from ._classifier import ClassifierConfig, QualityScores, train_classifier
from ._exact import exact_dedup_attributes, paragraph_dedup_attributes
from ._fuzzy import fuzzy_dedup_attributes
from ._html import ExtractConfig
from ._langid import LanguageAttributes
from ._rules import RULE_SETS, RuleAttributes
from ._step_io import one_folder, read_all, summary
from ._warc import warc_dataset


@dataclass(frozen=True)
class ExtractStepConfig:
    inputs: Any
    extract: ExtractConfig = ExtractConfig()
    on_error: str = "skip"
    source: str | None = None
    num_shards: int | None = None
    max_shard_bytes: int | None = None


def run_extract(config: ExtractStepConfig, output_path: str) -> dict:
    ds = warc_dataset(
        input_locations(config.inputs), config.extract, on_error=config.on_error, source=config.source
    )
    shards = {"num_shards": config.num_shards} if config.num_shards is not None else {}
    if not shards and config.max_shard_bytes is not None:
        shards = {"max_shard_bytes": config.max_shard_bytes}
    manifest = ds.write_jsonl(output_path, skip_existing=True, **shards)
    if not manifest["records"]:
        errors = manifest["errors"]
        reasons = {k: len(v) for k, v in sorted(errors.get("reasons", {}).items())}
        raise DataError(
            ", ".join(input_locations(config.inputs)),
            f"no page was extracted: skipped {reasons or 'nothing'}, counted {manifest['counters']}; first "
            f"skips: {errors.get('examples', [])[:3]}",
            fix="check that the inputs are WARC or WET files of HTML responses (an empty output is refused, "
            "not cached as a success)",
            kind="no_pages",
        )
    return summary(manifest)


@dataclass(frozen=True)
class AttributeStepConfig:
    inputs: Any
    kind: str
    params: Any = None
    extra_inputs: Any = ()


def count_failures(folder: str, names: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for attrs in iter_attributes(folder, names):
        for n in names:
            failed = attrs.get(n) or []
            if failed:
                counts[f"{n}.failed"] = counts.get(f"{n}.failed", 0) + 1
            for rule in failed:
                counts[f"{n}.{rule}"] = counts.get(f"{n}.{rule}", 0) + 1
    return dict(sorted(counts.items()))


def run_attributes(config: AttributeStepConfig, output_path: str) -> dict:
    src = one_folder(config.inputs, config.kind)
    work = storage.join(output_path, ".scratch")
    kind, p = config.kind, config.params
    if kind == "language_id":
        ds = attribute_dataset(src, per_shard=LanguageAttributes(p))
        manifest = ds.write_jsonl(output_path)
        langs: dict[str, int] = {}
        for a in iter_attributes(output_path, ["lang"]):
            langs[a["lang"]] = langs.get(a["lang"], 0) + 1
        return {**summary(manifest), "languages": dict(sorted(langs.items(), key=lambda kv: -kv[1]))}
    if kind == "quality_rules":
        rules = tuple((n, RULE_SETS[n](**dict(kw))) for n, kw in p)
        manifest = attribute_dataset(src, per_record=RuleAttributes(rules)).write_jsonl(output_path)
        return {**summary(manifest), "failures": count_failures(output_path, [n for n, _ in p])}
    if kind == "quality_scores":
        folder = one_folder(config.extra_inputs, "classifier")
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
        return {**summary(manifest), "quantiles": q}
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


@dataclass(frozen=True)
class ClassifierStepConfig:
    positives: Any
    negatives: Any
    config: ClassifierConfig = ClassifierConfig()


def run_classifier(config: ClassifierStepConfig, output_path: str) -> dict:
    storage.makedirs(output_path)
    pos = read_all(config.positives)
    neg = read_all(config.negatives)
    local = storage.join(output_path, "model.bin")
    metrics = train_classifier(pos, neg, storage.local_path(local), config.config)
    storage.write_json(storage.join(output_path, "metrics.json"), metrics)
    # what scoring must read of each text: the characters the model was trained on
    storage.write_json(storage.join(output_path, "classifier.json"), {"max_chars": config.config.max_chars})
    return metrics
