"""Tutorial: curate a web crawl into clean training text, then train a tiny model on it, offline.

    uv run schooner run experiments/tutorials/curate_web.py     # 2-3 minutes on 2 cores

The crawl is built on the spot (no network): WARC files of the standard library's documentation pages,
rendered by pydoc, wrapped in site chrome, with planted duplicates, keyword spam, fluent spam (sentences
that pass every heuristic rule), thin pages, other languages, bad records, and a few pages that copy
held-out documentation (the text the model is evaluated on). The crawl knows what every page is, so the
summary can say what each stage removed.

1. `data/heldout-docs`: 40 held-out documents of Python's docs, the evaluation text; with the texts of
   every evaluation task the project ships (`eval/task-texts`: the bundled tasks built from the embedded
   corpus, each document's contexts and choices as a record), what the crawl is decontaminated against
   (a task jsonl of question/choices/answer rows, or a `core_suite`, works the same way).
2. `data/crawl-warc`: the crawl; `data/crawl-text`: main text extracted from its HTML (resiliparse).
3. Attributes, each computed once: language (fastText lid.176 lite), heuristic rules (Gopher quality and
   repetition, C4, FineWeb), a fastText quality classifier trained on Python's docs (positive) against
   junk (negative: spam, fluent spam, thin pages and site boilerplate from the crawl's generators with
   another seed, a stand-in for the labelled low-quality web text real pipelines sample), exact and fuzzy
   (MinHash + LSH + verification) duplicates, repeated paragraphs, contamination.
4. `data/crawl-filtered` then `data/crawl-clean`: `consolidate` applies the filters and removals, counting
   every drop by reason (the dropped pages, with their attributes, in each output's `dropped/`).
5. `tokenized/crawl-clean`, `checkpoints/curate-web-nano`, `eval/curate-web-nano`: a short training run on
   the clean text, evaluated on the held-out documentation.
Look at any record folder with `schooner browse PATH`.

Rule sets computed but not used as filters here (Gopher repetition, C4, FineWeb) are reported with what
they would remove: on API documentation they flag the documentation itself (pydoc repeats each class's
inherited methods; code holds braces), and nothing they flag is junk the other filters keep.
"""

import dataclasses
import os
from collections import Counter

from experiments.models import llama_nano
from experiments.tokenizer_defs import default_tokenizer
from schooner.cluster import ResourceConfig, RunResult, StepRunner
from schooner.data import read_shards
from schooner.data.curation import ClassifierConfig, iter_attributes, lang_is, not_dup, passes, score_at_least
from schooner.data.curation.steps import (
    consolidate,
    decontaminate,
    exact_dedup,
    extract_warc,
    fuzzy_dedup,
    held_out_docs,
    language_id,
    offline_crawl,
    offline_junk,
    paragraph_dedup,
    quality_rules,
    quality_scores,
    train_quality_classifier,
)
from schooner.data.fixtures import CrawlConfig, read_truth
from schooner.data.steps import source_records
from schooner.eval.steps import evaluate, task_texts
from schooner.tokenize.steps import tokenized
from schooner.train import AdamConfig
from schooner.train.steps import train_lm

NUM_TRAIN_STEPS = int(os.environ.get("SCHOONER_TUTORIAL_STEPS", "60"))
SEQ_LEN = 128

heldout = held_out_docs("data/heldout-docs", count=40)
crawl = offline_crawl("data/crawl-warc", CrawlConfig(num_pages=100, num_files=4, seo_spam_pages=8),
                      plant_from=heldout, plant=3)  # fmt: skip
pages = extract_warc("data/crawl-text", crawl)

# Attributes of every page, computed once.
langs = language_id("attributes/crawl-lang", pages)
rules = quality_rules("attributes/crawl-rules", pages)
junk = offline_junk("data/junk", count=400, seed=1)
# fastText's tutorial settings for a small training set (its defaults, 5 epochs at lr 0.1, underfit here)
classifier = train_quality_classifier("classifiers/docs-vs-junk", positives=source_records("python-docs"),
                                      negatives=junk, config=ClassifierConfig(epoch=25, lr=0.5))  # fmt: skip
scores = quality_scores("attributes/crawl-quality", pages, classifier)

# English at fastText score >= 0.3, not FineWeb's 0.65 (chosen for web prose): API reference pages
# (signatures, identifiers) score 0.4-1.0 as English here, while every page in another language scores
# >= 0.97 for its own; 0.65 would drop a quarter of the documentation (the summary counts them).
MIN_EN_SCORE = 0.3
# Gopher quality without its alphabetic-word rule: it counts punctuation tokens as words (as datatrove does),
# and API reference pages (signatures: brackets, commas, "=") hold fewer than 80% words with a letter, so it
# would drop almost every documentation page (201 of 220); keyword spam still fails its stop-word rule.
filtered = consolidate(
    "data/crawl-filtered", pages, [langs, rules, scores],
    keep=[lang_is("en", MIN_EN_SCORE), passes("gopher_quality", ignore=["alpha_words"]),
          score_at_least("quality", 0.5)],
    dropped_samples=10_000,
)  # fmt: skip

# Deduplication and decontamination of what passed the filters.
exact = exact_dedup("attributes/filtered-exact", filtered)
fuzzy = fuzzy_dedup("attributes/filtered-fuzzy", filtered)
# Given the dedup steps, the pages they drop take no part: a paragraph whose first copy is in a dropped page
# stays in the kept copy (without them, 552 lines had no copy left).
paragraphs = paragraph_dedup(
    "attributes/filtered-paragraphs", filtered, min_chars=40, duplicates=[exact, fuzzy]
)
# Against the held-out docs and every evaluation task the project ships (their texts as records).
eval_texts = task_texts("eval/task-texts", tasks=["bundled"])
decon = decontaminate("attributes/filtered-decon", filtered, against=[heldout, eval_texts])
clean = consolidate(
    "data/crawl-clean", filtered, [exact, fuzzy, paragraphs, decon],
    keep=[not_dup("exact"), not_dup("fuzzy")], remove=["paragraph_dups", "contaminated"], dropped_samples=10_000,
)  # fmt: skip

# No validation split of the crawl (2% of ~100 pages is one page or none): the run is scored on the held-out
# docs (their own cache, half of it validation), during training too.
docs = tokenized("tokenized/crawl-clean", paths=clean, tokenizer=default_tokenizer, validation_fraction=0)
heldout_tok = tokenized(
    "tokenized/heldout-docs", paths=heldout, tokenizer=default_tokenizer, validation_fraction=0.5
)
model = train_lm(
    "checkpoints/curate-web-nano",
    model=dataclasses.replace(llama_nano, max_seq_len=SEQ_LEN),
    optimizer=AdamConfig(learning_rate=6e-3, weight_decay=0.1, warmup=0.05),
    datasets={docs: 1.0},
    validation={"heldout-docs": heldout_tok},
    batch_size=16,
    seq_len=SEQ_LEN,
    num_train_steps=NUM_TRAIN_STEPS,
    checkpoint_every=None,
    resources=ResourceConfig.with_cpu(),
)
scores_eval = evaluate(
    "eval/curate-web-nano", checkpoint=model, datasets={"heldout-docs": heldout_tok}, tokenizer=default_tokenizer,
    seq_len=SEQ_LEN, max_tokens=20_000, resources=ResourceConfig.with_cpu(),
)  # fmt: skip


def _print_drops(result: RunResult, handle, kind_of: dict[str, str]) -> None:
    """Per filter of a consolidate step, in order: the kinds of the pages it dropped (from the crawl's
    truth) and, for a rule set, the rules they failed."""
    kinds: dict[str, Counter] = {}
    rules_failed: dict[str, Counter] = {}
    for rec in read_shards(f"{result[handle].output_path}/dropped"):
        reason = rec["metadata"]["drop_reason"]
        kinds.setdefault(reason, Counter())[kind_of[rec["metadata"]["url"]]] += 1
        rules_failed.setdefault(reason, Counter()).update(rec["metadata"]["attributes"].get(reason) or [])
    r = result[handle].result
    print(f"   {r['input_records']} -> {r['records']} pages")
    for reason in r["filters"]:
        if reason in kinds:
            why = f"; rules failed {dict(rules_failed[reason])}" if rules_failed[reason] else ""
            print(f"   dropped by {reason}: {sum(kinds[reason].values())} {dict(kinds[reason])}{why}")


def _unused_rule_sets(result: RunResult, kind_of: dict[str, str]) -> None:
    """What the rule sets that are not filters here flag: pages the filters dropped anyway, and among the
    pages they kept (by kind), what they would remove."""
    kept = {r["metadata"]["url"] for r in read_shards(result[filtered].output_path)}
    urls = [r["metadata"]["url"] for r in read_shards(result[pages].output_path)]
    for ruleset in ("gopher_repetition", "c4", "fineweb"):
        flagged = [(u, a[ruleset]) for u, a in zip(urls, iter_attributes(result[rules].output_path, [ruleset]))
                   if a[ruleset]]  # fmt: skip
        would = [(u, f) for u, f in flagged if u in kept]
        top = Counter(rule for _, failed in would for rule in failed).most_common(3)
        print(f"   {ruleset}: flags {len(flagged)} pages, {len(flagged) - len(would)} of them dropped by the "
              f"filters anyway; would remove {len(would)} of the {len(kept)} kept: "
              f"{dict(Counter(kind_of[u] for u, _ in would))}, most failed rules {dict(top)}")  # fmt: skip


def print_summary(result: RunResult) -> None:
    """What each stage removed and why (works on a cached rerun too)."""
    if result.dry_run or scores_eval.key not in {o.key for o in result.steps}:
        return
    kind_of = {t["url"]: t["kind"] for t in read_truth(result[crawl].output_path)}
    ex = result[pages].result
    print("\n1. Extraction:", f"{ex['records']} pages from {len(kind_of)} WARC records;",
          {k: v for k, v in ex["counters"].items() if k.startswith(("warc.skipped", "extract."))})  # fmt: skip
    for e in ex["errors"]["examples"][:4]:
        print("   skipped:", e)
    print("2. Languages:", result[langs].result["languages"])
    urls = [r["metadata"]["url"] for r in read_shards(result[pages].output_path)]
    lang = list(iter_attributes(result[langs].output_path, ["lang", "lang_score"]))
    fineweb = Counter(
        kind_of[u] for u, a in zip(urls, lang) if a["lang"] == "en" and MIN_EN_SCORE <= a["lang_score"] < 0.65
    )
    print(
        f"   English at score >= {MIN_EN_SCORE} kept; FineWeb's 0.65 would also drop {sum(fineweb.values())}: {dict(fineweb)}"
    )
    print("   Classifier (held out):", {k: result[classifier].result[k] for k in ("precision", "recall", "f1")},
          "score quantiles", result[scores].result["quantiles"])  # fmt: skip
    for label, h in (("3. Filters", filtered), ("4. Dedup and decontamination", clean)):
        print(f"{label}:")
        _print_drops(result, h, kind_of)
    fz = result[fuzzy].result
    print("   fuzzy dedup:", {k: fz[k] for k in ("candidate_pairs", "candidate_documents", "duplicates",
                                                "unverified_candidates", "seconds")})  # fmt: skip
    removed = result[clean].result["removed"]
    print(f"   repeated paragraphs removed: {removed.get('paragraph_dups.spans', 0)} lines, "
          f"{removed.get('paragraph_dups.chars', 0)} characters; lines with no copy left: "
          f"{result[clean].result['lost'].get('paragraph_dups', 0)}")  # fmt: skip
    dc = result[decon].result
    task = dc["by_task"]
    print(f"   contamination: {dc['contaminated_paragraphs']} paragraphs flagged in {dc['contaminated_documents']} "
          f"pages, matching {dc['eval_items_matched']} of {sum(t['items'] for t in task.values())} eval texts; "
          f"cut from the kept pages: {removed.get('contaminated.spans', 0)} paragraphs, "
          f"{removed.get('contaminated.chars', 0)} characters; by task (eval texts matched, paragraphs):",
          {t: (v["items_matched"], v["paragraphs"]) for t, v in task.items()}, "e.g.")  # fmt: skip
    seen: set[str] = set()
    for e in dc["examples"]:
        if e["url"] not in seen and len(seen) < 2:
            seen.add(e["url"])
            print(f"     {e['url']} ~ {e['task']}/{e['eval_item']}: {e['ngram']!r}")
    print("5. Rule sets computed but not filters here (among the kept pages they flag documentation only):")
    _unused_rule_sets(result, kind_of)
    ev = result[scores_eval].result
    print("6. Held-out docs:", {n: round(d["bpb"], 3) for n, d in ev["datasets"].items()}, "bits/byte;",
          f"this run took {result.duration_s:.0f} s")  # fmt: skip
    print(f"Browse: schooner browse {result[clean].output_path}")


if __name__ == "__main__":
    print_summary(StepRunner().main([scores_eval]))
