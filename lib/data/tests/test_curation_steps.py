"""The curation steps end to end on a small offline crawl (real worker processes, the step runner), and
the browse page of a consolidated folder in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("resiliparse")

from schooner.cluster import StepRunner
from schooner.data import read_shards
from schooner.data.curation import lang_is, not_dup, passes
from schooner.data.curation.steps import (
    consolidate,
    exact_dedup,
    extract_warc,
    fuzzy_dedup,
    language_id,
    offline_crawl,
    quality_rules,
)
from schooner.data.fixtures import CrawlConfig, read_truth

CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("prefix")
    crawl = offline_crawl("data/crawl", CrawlConfig(num_pages=20, num_files=2))
    pages = extract_warc("data/pages", crawl)
    langs = language_id("attributes/lang", pages)
    rules = quality_rules("attributes/rules", pages, rules=("gopher_quality", "c4"))
    exact = exact_dedup("attributes/exact", pages)
    fuzzy = fuzzy_dedup("attributes/fuzzy", pages)
    # API pages fail Gopher's alphabetic-word rule (datatrove's formula counts punctuation tokens as words)
    keep = [
        lang_is("en", 0.3),
        passes("gopher_quality", ignore=["alpha_words"]),
        not_dup("exact"),
        not_dup("fuzzy"),
    ]
    clean = consolidate("data/clean", pages, [langs, rules, exact, fuzzy], keep=keep)
    result = StepRunner(prefix=str(prefix)).run([clean])
    assert result.ok
    return {"result": result, "handles": locals()}


def test_consolidate_counts_every_drop_by_reason(run):
    result, h = run["result"], run["handles"]
    out = result[h["clean"]].result
    truth = read_truth(result[h["crawl"]].output_path)
    foreign = sum(1 for t in truth if t["kind"] == "foreign")
    assert out["dropped"]["lang_not_en"] >= foreign
    assert out["input_records"] == out["records"] + sum(out["dropped"].values())
    kept = list(read_shards(result[h["clean"]].output_path))
    assert all(r["metadata"]["attributes"]["lang"] == "en" for r in kept)
    urls = {r["metadata"]["url"] for r in kept}
    # no planted duplicate survives with its original
    assert not [t for t in truth if t["dup_of"] and t["url"] in urls and t["dup_of"] in urls]
    rules = result[h["rules"]].result["failures"]
    assert rules["gopher_quality.failed"] >= 1 and any(k.startswith("gopher_quality.") for k in rules)


def test_consolidate_writes_clean_text(run):
    """pydoc's pages hold `&nbsp;`: the extracted pages keep U+00A0, the consolidated text has plain spaces,
    no trailing whitespace and no run of blank lines, each repair counted."""
    result, h = run["result"], run["handles"]
    pages = "".join(r["text"] for r in read_shards(result[h["pages"]].output_path))
    assert "\u00a0" in pages
    kept = [r["text"] for r in read_shards(result[h["clean"]].output_path)]
    assert kept and not [t for t in kept if "\u00a0" in t or "\n\n\n" in t or re.search(r"[ \t]$", t, re.M)]
    cleaned = result[h["clean"]].result["cleaned"]
    assert cleaned["whitespace"] >= 1 and cleaned["whitespace.chars"] >= 0


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)"
)
def test_browse_page_shows_samples_and_dropped_records_in_chromium(run, tmp_path):
    result, h = run["result"], run["handles"]
    folder = result[h["clean"]].output_path
    out = tmp_path / "browse.html"
    proc = subprocess.run([sys.executable, "-m", "schooner.cluster.cli", "browse", folder, "--out", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0", "--dump-dom", out.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert dom.returncode == 0
    assert [ln for ln in dom.stderr.splitlines() if ":CONSOLE" in ln] == []
    assert "Dropped records (samples)" in dom.stdout and "lang_not_en" in dom.stdout
    kept = next(read_shards(folder))
    assert json.dumps(kept["id"])[1:-1] in dom.stdout
    assert os.path.getsize(out) > 1000


def test_paragraph_dedup_step_takes_the_dedup_steps(tmp_path):
    """`paragraph_dedup(duplicates=[fuzzy])`: the kept mirror B keeps the paragraphs it shares with the
    original A that fuzzy dedup drops; without it they are cut from B, lost, and the step record says how many."""
    import random

    from schooner.data import write_records
    from schooner.data.curation.steps import paragraph_dedup

    rng = random.Random(0)
    vocab = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "river",
        "stone",
        "light",
        "paper",
        "table",
        "window",
        "garden",
        "music",
        "silver",
        "cloud",
    ]
    a = "\n".join(" ".join(rng.choice(vocab) for _ in range(30)) + "." for _ in range(8))
    b = a + "\nMirrored, with one sentence added."
    write_records([{"id": i, "text": t, "source": "s", "metadata": {}} for i, t in (("A", a), ("B", b))],
                  str(tmp_path / "src"), num_shards=1)  # fmt: skip
    fuzzy = fuzzy_dedup("attributes/fuzzy", str(tmp_path / "src"))
    outs = {}
    for dups in ([fuzzy], []):
        par = paragraph_dedup(
            f"attributes/par{len(dups)}", str(tmp_path / "src"), min_chars=40, duplicates=dups
        )
        outs[len(dups)] = consolidate(f"data/clean{len(dups)}", str(tmp_path / "src"), [fuzzy, par],
                                      keep=[not_dup("fuzzy")], remove=["paragraph_dups"], dropped_samples=0)  # fmt: skip
    result = StepRunner(prefix=str(tmp_path / "prefix")).run(list(outs.values()))
    assert result.ok
    with_dups = [r["text"] for r in read_shards(result[outs[1]].output_path)]
    assert with_dups == [b] and result[outs[1]].result["lost"] == {}
    without = [r["text"] for r in read_shards(result[outs[0]].output_path)]
    assert without == ["Mirrored, with one sentence added."]
    assert result[outs[0]].result["lost"] == {"paragraph_dups": 8}


def test_quality_scores_step_reads_the_text_the_classifier_was_trained_on(tmp_path):
    """`ClassifierConfig(max_chars=200)`: the classifier learns from the first 200 characters, so the step's
    score of a page is that of its first 200 characters (it scored 20,000: a documentation opening followed
    by a long spam tail scored as spam)."""
    import random

    from schooner.data import write_records
    from schooner.data.curation import ClassifierConfig
    from schooner.data.curation.steps import quality_scores, train_quality_classifier

    rng = random.Random(1)
    good = ["function", "returns", "argument", "module", "class", "value", "the", "of", "a", "list", "string"]
    bad = ["casino", "bonus", "win", "free", "click", "prize", "cheap", "offer", "now", "best", "deal"]

    def text(vocab: list[str], n: int) -> str:
        return " ".join(rng.choice(vocab) for _ in range(n)) + "."

    def folder(name: str, texts: list[str]) -> str:
        recs = [{"id": f"{name}{i}", "text": t, "source": name, "metadata": {}} for i, t in enumerate(texts)]
        write_records(recs, str(tmp_path / name), num_shards=1)
        return str(tmp_path / name)

    pos = folder("pos", [text(good, 40) for _ in range(80)])
    neg = folder("neg", [text(bad, 40) for _ in range(80)])
    opening = text(good, 40)[:200]
    page = opening + " " + text(bad, 1500)
    pages = folder("pages", [page, opening])
    clf = train_quality_classifier("classifiers/q", positives=pos, negatives=neg,
                                   config=ClassifierConfig(epoch=10, lr=0.5, max_chars=200))  # fmt: skip
    scores = quality_scores("attributes/q", pages, clf)
    result = StepRunner(prefix=str(tmp_path / "prefix")).run([scores])
    assert result.ok
    from schooner.data.curation import iter_attributes

    got = [a["quality"] for a in iter_attributes(result[scores].output_path)]
    assert got[1] > 0.5  # the opening alone is documentation
    assert got[0] == got[1]


def test_lost_paragraphs_are_distinct_lines_a_kept_record_had(tmp_path, caplog):
    """r1; r2 an exact copy; r3 a longer near copy (its lines reworded); r4 sharing one line with r1. Without
    `duplicates=`, r1 holds the first copy of its 3 lines and dedup drops r1 and r2: lines A and B were only
    in r1/r2 (dropped as wholes, not paragraph losses); only S, also in the kept r4, is cut from every copy
    left. The reference: lines of the records the filters keep that appear in no output text."""
    import logging
    import random

    from schooner.data import write_records
    from schooner.data.curation.steps import paragraph_dedup

    rng = random.Random(5)
    vocab = ["alpha", "beta", "gamma", "delta", "river", "stone", "light", "paper", "table", "window"]

    def line() -> str:
        return " ".join(rng.choice(vocab) for _ in range(30)) + "."

    a, b, s = line(), line(), line()
    r1 = "\n".join([a, b, s])
    r3 = "\n".join([a[:-1] + " indeed.", b[:-1] + " indeed.", s[:-1] + " indeed.", "One more line here."])
    r4 = "\n".join([line(), s, line()])
    texts = {"r1": r1, "r2": r1, "r3": r3, "r4": r4}
    src = str(tmp_path / "src")
    write_records(
        [{"id": i, "text": t, "source": "s", "metadata": {}} for i, t in texts.items()], src, num_shards=2
    )
    exact = exact_dedup("attributes/exact", src)
    fuzzy = fuzzy_dedup("attributes/fuzzy", src)
    par = paragraph_dedup("attributes/par", src, min_chars=40)
    clean = consolidate("data/clean", src, [exact, fuzzy, par], keep=[not_dup("exact"), not_dup("fuzzy")],
                        remove=["paragraph_dups"], dropped_samples=0)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="schooner"):
        result = StepRunner(prefix=str(tmp_path / "prefix")).run([clean])
    assert result.ok
    out = list(read_shards(result[clean].output_path))
    assert sorted(r["id"] for r in out) == ["r3", "r4"]  # dedup kept the longer near copy, and r4
    out_lines = {ln for r in out for ln in r["text"].split("\n")}
    lost = {ln for i in ("r3", "r4") for ln in texts[i].split("\n") if len(ln) >= 40 and ln not in out_lines}
    assert lost == {s}
    assert result[clean].result["lost"] == {"paragraph_dups": len(lost)}
    warning = next(r.getMessage() for r in caplog.records if "repeated paragraph" in r.getMessage())
    assert "1 repeated paragraph " in warning and "3 repeated" not in warning


def test_paragraph_dedup_refuses_duplicates_that_are_not_dedup_steps(tmp_path):
    """`duplicates=` takes the exact/fuzzy dedup steps: a quality_rules step (no `exact_dup`/`fuzzy_dup`)
    did nothing at all; it is refused, naming the step."""
    from schooner.data import write_records
    from schooner.data.curation.steps import paragraph_dedup

    write_records([{"id": "a", "text": "a page", "source": "s", "metadata": {}}], str(tmp_path / "src"))
    rules = quality_rules("attributes/rules", str(tmp_path / "src"), rules=("c4",))
    with pytest.raises(
        ValueError, match=r"duplicates=.*exact_dedup/fuzzy_dedup.*'attributes/rules' \(quality_rules\)"
    ):
        paragraph_dedup("attributes/par", str(tmp_path / "src"), duplicates=[rules])


def test_paragraph_dedup_names_dedup_attributes_of_other_records(tmp_path):
    """Folders given as `duplicates`: one without dedup attributes is refused, naming it; dedup attributes of
    other records (here of a 2-record corpus, for a 4-record one) say they were computed from other records."""
    from schooner.data import DataError, write_records
    from schooner.data.curation._attributes import attribute_dataset
    from schooner.data.curation._exact import exact_dedup_attributes, paragraph_dedup_attributes

    def recs(n: int) -> list[dict]:
        return [{"id": f"d{i}", "text": f"line {i} of a page that is long enough\nshared line of every page, long enough",
                 "source": "s", "metadata": {}} for i in range(n)]  # fmt: skip

    src, other = str(tmp_path / "src"), str(tmp_path / "other")
    write_records(recs(4), src, num_shards=1)
    write_records(recs(2), other, num_shards=1)
    exact_other = str(tmp_path / "exact-other")
    exact_dedup_attributes(other, exact_other, work=str(tmp_path / "w0"), progress=False)
    with pytest.raises(DataError, match="computed from other records"):
        paragraph_dedup_attributes(src, str(tmp_path / "p1"), work=str(tmp_path / "w1"), duplicates=[exact_other],
                                   progress=False)  # fmt: skip
    lengths = str(tmp_path / "lengths")
    attribute_dataset(src, per_record=lambda r: {"chars": len(r["text"])}).write_jsonl(
        lengths, progress=False
    )
    with pytest.raises(DataError, match=r"lengths.*no exact_dup or fuzzy_dup"):
        paragraph_dedup_attributes(src, str(tmp_path / "p2"), work=str(tmp_path / "w2"), duplicates=[lengths],
                                   progress=False)  # fmt: skip
