"""The curation tutorial end to end (`schooner run experiments/tutorials/curate_web.py`, a 5-step training
run): every stage removes what the offline crawl's truth says it should, and nothing it should not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("resiliparse")

from schooner.data import read_shards
from schooner.data.fixtures import read_truth

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "experiments" / "tutorials" / "curate_web.py"


def _dropped(output: str, truth: dict[str, dict]) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    for rec in read_shards(f"{output}/dropped"):
        out.setdefault(rec["metadata"]["drop_reason"], Counter())[truth[rec["metadata"]["url"]]["kind"]] += 1
    return out


@pytest.mark.slow
def test_each_stage_of_the_curation_tutorial_removes_what_the_crawl_planted(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("SCHOONER_CLUSTER", "XLA_FLAGS")}
    env.update(SCHOONER_TUTORIAL_STEPS="5", SCHOONER_PREFIX=str(tmp_path), COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "schooner.cluster.cli", "run", str(TUTORIAL)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    # its normal path warns of nothing (a validation split of ~100 pages at 2% was empty, and the run warned)
    assert "is empty" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    for line in ("1. Extraction", "2. Languages", "3. Filters", "4. Dedup", "5. Rule sets", "6. Held-out"):
        assert line in proc.stdout, proc.stdout[-3000:]
    records = {}
    for path in tmp_path.rglob(".schooner/step.json"):
        r = json.loads(path.read_text())
        records[r["name"]] = r
    truth = {t["url"]: t for t in read_truth(records["data/crawl-warc"]["output_path"])}
    kinds = Counter(t["kind"] for t in truth.values())

    filtered = _dropped(records["data/crawl-filtered"]["output_path"], truth)
    # language id: every page in another language (the two charset pages are French), no documentation
    lang = filtered["lang_not_en"]
    assert lang["foreign"] == kinds["foreign"] and lang["charset_undeclared"] + lang["charset_wrong"] == 2
    assert not lang["original"] and not lang["near_dup"] and not lang["exact_dup"]
    # Gopher quality: every keyword-spam page
    assert filtered["gopher_quality"]["spam"] == kinds["spam"]
    # the classifier: every fluent-spam page (no heuristic rule catches them), and nothing else
    assert filtered["quality_below_threshold"] == Counter({"seo_spam": kinds["seo_spam"]})

    clean_out = records["data/crawl-clean"]["output_path"]
    kept = {r["metadata"]["url"] for r in read_shards(clean_out)}
    # deduplication: no planted copy survives beside its original, and one of each pair does
    pairs = [(u, t["dup_of"]) for u, t in truth.items() if t["kind"] in ("exact_dup", "near_dup")]
    passed = {r["metadata"]["url"] for r in read_shards(records["data/crawl-filtered"]["output_path"])}
    pairs = [(u, d) for u, d in pairs if u in passed and d in passed]
    assert len(pairs) >= 25
    assert all((u in kept) != (d in kept) for u, d in pairs)
    # repeated paragraphs: cut from later copies, never from every copy (a first copy in a page dedup drops
    # took its paragraph out of the output altogether: 552 lines before paragraph_dedup had duplicates=)
    clean_result = records["data/crawl-clean"]["result"]
    assert clean_result["removed"]["paragraph_dups.spans"] > 1000
    assert clean_result["lost"].get("paragraph_dups", 0) == 0
    # decontamination: every planted copy of held-out text that reached it has spans cut out
    report = json.loads(
        (Path(records["attributes/filtered-decon"]["output_path"]) / "report.json").read_text()
    )
    flagged = {h["url"] for h in report["hits"]}
    planted = {u for u, t in truth.items() if t["kind"] == "contaminated" and u in passed}
    assert planted and planted <= flagged
    # ... against the held-out docs and every evaluation task the project ships (the bundled tasks' texts)
    tasks = report["index"]["tasks"]
    assert len(tasks) >= 3 and all(n > 0 for n in tasks.values())
    assert {h["task"] for h in report["hits"]} - {"python-docs-heldout"}
