"""Tutorial: curate a web crawl into clean training text, then train a tiny model on it, offline.

    uv run schooner run experiments/tutorials/curate_web.py     # a few minutes on 2 cores

The crawl is built on the spot (no network): WARC files of the standard library's documentation pages,
rendered by pydoc, wrapped in site chrome, with planted duplicates, spam, thin pages, other languages,
bad records, and a few pages that copy held-out documentation (the text the model is evaluated on).

1. `data/heldout-docs`: 40 held-out documents of Python's docs: the evaluation text, and what the crawl
   must be decontaminated against (the project ships no benchmark tasks yet; a task jsonl of
   question/choices/answer rows works the same way).
2. `data/crawl-warc`: the crawl; `data/crawl-text`: main text extracted from its HTML (resiliparse).
3. Attributes, each computed once: language (fastText lid.176 lite), heuristic rules (Gopher quality and
   repetition, C4, FineWeb), a fastText quality classifier trained on Python's docs against the crawl's
   spam, exact and fuzzy (MinHash + LSH + verification) duplicates, repeated paragraphs, contamination.
4. `data/crawl-filtered` then `data/crawl-clean`: `consolidate` applies the filters and removals, counting
   every drop by reason (samples of dropped pages in each output's `dropped/`).
5. `tokenized/crawl-clean`, `checkpoints/curate-web-nano`, `eval/curate-web-nano`: a short training run on
   the clean text, evaluated on the held-out documentation.
Look at any record folder with `schooner browse PATH`.
"""

import dataclasses
import os

from experiments.models import llama_nano
from experiments.tokenizers import default_tokenizer
from schooner.cluster import ResourceConfig, RunResult, StepRunner
from schooner.data.curation import lang_is, not_dup, passes, top_fraction
from schooner.data.curation.crawl import CrawlConfig
from schooner.data.curation.steps import (
    consolidate,
    decontaminate,
    exact_dedup,
    extract_warc,
    fuzzy_dedup,
    held_out_docs,
    language_id,
    offline_crawl,
    paragraph_dedup,
    quality_rules,
    quality_scores,
    train_quality_classifier,
)
from schooner.data.steps import source_records
from schooner.eval.steps import evaluate
from schooner.tokenize.steps import tokenized
from schooner.train import AdamConfig
from schooner.train.steps import train_lm

NUM_TRAIN_STEPS = int(os.environ.get("SCHOONER_TUTORIAL_STEPS", "60"))
SEQ_LEN = 128

heldout = held_out_docs("data/heldout-docs", count=40)
crawl = offline_crawl("data/crawl-warc", CrawlConfig(num_pages=100, num_files=4), plant_from=heldout, plant=3)
pages = extract_warc("data/crawl-text", crawl)

# Attributes of every page, computed once.
langs = language_id("attributes/crawl-lang", pages)
rules = quality_rules("attributes/crawl-rules", pages)
classifier = train_quality_classifier("classifiers/docs-vs-crawl", positives=source_records("python-docs"),
                                      negatives=pages)  # fmt: skip
scores = quality_scores("attributes/crawl-quality", pages, classifier)

filtered = consolidate(
    "data/crawl-filtered", pages, [langs, rules, scores],
    keep=[lang_is("en", 0.65), passes("gopher_quality"), top_fraction("quality", 0.9)],
)  # fmt: skip

# Deduplication and decontamination of what passed the filters.
exact = exact_dedup("attributes/filtered-exact", filtered)
fuzzy = fuzzy_dedup("attributes/filtered-fuzzy", filtered)
paragraphs = paragraph_dedup("attributes/filtered-paragraphs", filtered, min_chars=40)
decon = decontaminate("attributes/filtered-decon", filtered, against=heldout)
clean = consolidate(
    "data/crawl-clean", filtered, [exact, fuzzy, paragraphs, decon],
    keep=[not_dup("exact"), not_dup("fuzzy")], remove=["paragraph_dups", "contaminated"],
)  # fmt: skip

docs = tokenized("tokenized/crawl-clean", paths=clean, tokenizer=default_tokenizer)
heldout_tok = tokenized(
    "tokenized/heldout-docs", paths=heldout, tokenizer=default_tokenizer, validation_fraction=0.5
)
model = train_lm(
    "checkpoints/curate-web-nano",
    model=dataclasses.replace(llama_nano, max_seq_len=SEQ_LEN),
    optimizer=AdamConfig(learning_rate=6e-3, weight_decay=0.1, warmup=0.05),
    datasets={docs: 1.0},
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


def print_summary(result: RunResult) -> None:
    """What each stage removed and why (works on a cached rerun too)."""
    if result.dry_run or scores_eval.key not in {o.key for o in result.steps}:
        return
    ex = result[pages].result
    print("\nExtraction:", f"{ex['records']} pages;", "bad input skipped:", ex["errors"]["skipped"],
          {k: v for k, v in ex["counters"].items() if k.startswith(("warc.skipped", "dropped", "extract."))})  # fmt: skip
    print("Languages:", result[langs].result["languages"])
    print(
        "Rule failures:", {k: v for k, v in result[rules].result["failures"].items() if k.endswith(".failed")}
    )
    print("Classifier (held out):", {k: result[classifier].result[k] for k in ("precision", "recall", "f1")})
    for name, h in (("filtered", filtered), ("clean", clean)):
        r = result[h].result
        print(
            f"{name}: {r['input_records']} -> {r['records']} records; dropped {r['dropped']}; removed {r['removed']}"
        )
    fz = result[fuzzy].result
    print("Fuzzy dedup:", {k: fz[k] for k in ("candidate_pairs", "candidate_documents", "duplicates",
                                               "unverified_candidates", "largest_clusters")})  # fmt: skip
    dc = result[decon].result
    print("Decontamination:", dc["contaminated_paragraphs"], "paragraphs in", dc["contaminated_documents"],
          "documents;", [(e["url"], e["eval_item"]) for e in dc["examples"][:3]])  # fmt: skip
    ev = result[scores_eval].result
    print("Held-out docs:", {n: round(d["bpb"], 3) for n, d in ev["datasets"].items()}, "bits/byte")
    print(f"Browse: schooner browse {result[clean].output_path}")


if __name__ == "__main__":
    print_summary(StepRunner().main([scores_eval]))
