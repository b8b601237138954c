"""What the `decontaminate` step runs: its config, what `against=` becomes, and the report naming every hit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from schooner.data import Dataset, storage
from schooner.data.step_inputs import as_step_inputs, input_locations

from ._attributes import attribute_dataset, with_attributes
from ._consolidate import Consolidator, not_contaminated
from ._decontam import (
    DecontamAttributes,
    DecontamConfig,
    EvalTexts,
    build_index,
    contamination_hits,
    load_eval_items,
    load_index,
)
from ._step_io import one_folder, summary


@dataclass(frozen=True)
class DecontamStepConfig:
    inputs: Any
    against: Any
    config: DecontamConfig = DecontamConfig()
    remove: str | None = None


def decontam_against(against: Any) -> list[Any]:
    """Step inputs of `decontaminate(against=...)`: handles and paths as inputs, a `Dataset` or records
    (dicts) read now into `EvalTexts` (eval sets are small; the step is keyed by their content)."""
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
            "fraction": h["fraction"], "whole_item": h["whole_item"], "paragraph": rec["text"][s:e].rstrip("\n")[:300], "eval_text": eval_text[:300]}  # fmt: skip


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
    below = sum(1 for h in hits if h["whole_item"] and h["fraction"] < config.threshold)
    return {"index": built, "contaminated_paragraphs": len(hits), "whole_items_below_threshold": below,
            "contaminated_documents": len({h["document"] for h in hits}),
            "contaminated_chars": sum(h["span"][1] - h["span"][0] for h in hits),
            "eval_items_matched": len(matched), "by_task": by_task, "hits": hits}  # fmt: skip


def run_decontam(config: DecontamStepConfig, output_path: str) -> dict:
    src = one_folder(config.inputs, "decontaminate")
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
            fix_text=False, normalize_whitespace=False, remove_invisible=False,
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
        **summary(manifest),
        **{k: v for k, v in report.items() if k != "hits"},
        "examples": report["hits"][:10],
    }
