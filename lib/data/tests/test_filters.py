"""Filters the curated pipeline keeps or drops by: the trained quality classifier (held-out labels known),
`top_fraction` (exactly the top share, ties broken by input order, worked out by hand here), and Gopher
repetition's line rules (datatrove splits lines on runs of newlines: blank lines are not repeated lines)."""

from __future__ import annotations

import pytest

pytest.importorskip("floret")

from schooner.data import read_shards, write_records
from schooner.data.curation import GopherRepetition, attribute_dataset, top_fraction, with_attributes
from schooner.data.curation._classifier import ClassifierConfig, QualityScores, train_classifier
from schooner.data.curation._consolidate import Consolidator, resolve_top_fraction
from schooner.data.fixtures import junk_records
from schooner.data.sources import iter_source


def test_quality_classifier_separates_documentation_from_junk(tmp_path):
    docs = list(iter_source("python-docs"))
    junk = junk_records(400, seed=7)
    model = str(tmp_path / "model.bin")
    m = train_classifier(docs, junk, model, ClassifierConfig(epoch=25, lr=0.5))
    assert m["heldout.positive"] > 20 and m["heldout.negative"] > 20
    assert m["precision"] >= 0.95 and m["recall"] >= 0.95
    # unseen junk (another seed) scores low, documentation high; the probabilities are the model's, not
    # the top label's repeated (floret's list predict), so they spread instead of all sitting near 1
    unseen = junk_records(40, seed=99)
    junk_scores = [a["quality"] for a in QualityScores(model)(iter(unseen))]
    doc_scores = [a["quality"] for a in QualityScores(model)(iter(docs[:40]))]
    assert sum(s < 0.5 for s in junk_scores) >= 38
    assert sum(s > 0.5 for s in doc_scores) >= 38
    assert max(junk_scores) < 1.0 and len(set(junk_scores + doc_scores)) > 60


def _score(rec: dict) -> dict:
    return {"q": rec["metadata"]["q"]}


@pytest.mark.parametrize("fraction", [0.5, 0.3, 0.9])
def test_top_fraction_keeps_exactly_its_share_with_ties_broken_by_input_order(tmp_path, fraction):
    scores = [0.9, 0.5, 0.5, 0.1, 0.5, 0.5, 0.7, 0.5, 0.5, 0.2]  # many ties at 0.5
    recs = [
        {"id": f"r{i}", "text": f"text {i}", "source": "t", "metadata": {"q": s}}
        for i, s in enumerate(scores)
    ]
    src, att = str(tmp_path / "src"), str(tmp_path / "att")
    write_records(recs, src, num_shards=3)
    attribute_dataset(src, per_record=_score).write_jsonl(att, progress=False)
    # by hand: rank by score (high first), then by place in the input; keep round(fraction * n)
    ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    expected = {f"r{i}" for i in ranked[: round(fraction * len(scores))]}
    places = [(shard, row) for shard, n in enumerate(_shard_sizes(src)) for row in range(n)]
    keep = resolve_top_fraction(top_fraction("q", fraction), list(zip(scores, places)))
    kept = with_attributes(src, [att], locate=True).map_shard(Consolidator((keep,)), with_counters=True)
    got = {r["id"] for r in kept.collect(client="inline", progress=False)}
    assert got == expected


def _shard_sizes(folder: str) -> list[int]:
    from schooner.data import list_shards

    return [sum(1 for _ in read_shards(p)) for p in list_shards(folder)]


def test_gopher_repetition_does_not_count_blank_lines_as_repeated_lines():
    # distinct lines separated by blank lines: no line repeats (datatrove splits on "\n+")
    text = "\n\n".join(f"Line number {i} says something different from the others." for i in range(12))
    assert not {"dup_line_frac", "dup_line_char_frac"} & set(GopherRepetition().check(text))
    # the same lines, each twice: half the lines are repeats
    doubled = "\n".join(
        f"Line number {i} says something different.\nLine number {i} says something different."
        for i in range(12)
    )
    assert {"dup_line_frac", "dup_line_char_frac"} <= set(GopherRepetition().check(doubled))


def test_top_fraction_is_the_share_of_what_reaches_it(tmp_path):
    """`consolidate(keep=[lang_is("en"), top_fraction("q", 0.2)])` keeps the top 20% of the English pages
    (DCLM takes its top 10% of the pool the earlier filters leave): 10 English pages of 40 -> 2, the two best
    English scores (hand count). The share was taken of every scored page, so 20% of 40 = 8 places went to
    the better-scored French pages, which `lang_is` drops: no English page was kept."""
    from schooner.cluster import StepRunner
    from schooner.data.curation import lang_is
    from schooner.data.curation.steps import consolidate

    recs, attrs = [], []
    for i in range(40):
        en = i % 4 == 0  # 10 English pages, scores 0.10-0.19; 30 French pages, scores 0.50-0.79
        q = 0.1 + i / 400 if en else 0.5 + i / 100
        recs.append({"id": f"p{i}", "text": f"page {i}", "source": "s", "metadata": {}})
        attrs.append({"id": f"p{i}", "text": "", "source": "attributes",
                      "metadata": {"lang": "en" if en else "fr", "lang_score": 0.9, "q": round(q, 4)}})  # fmt: skip
    write_records(recs, str(tmp_path / "src"), num_shards=2)
    write_records(attrs, str(tmp_path / "attrs"), num_shards=2)
    clean = consolidate("data/clean", str(tmp_path / "src"), [str(tmp_path / "attrs")],
                        keep=[lang_is("en"), top_fraction("q", 0.2)], dropped_samples=0)  # fmt: skip
    result = StepRunner(prefix=str(tmp_path / "prefix")).run([clean])
    assert result.ok
    english = sorted((a["metadata"]["q"], a["id"]) for a in attrs if a["metadata"]["lang"] == "en")
    want = sorted(i for _, i in english[-2:])
    assert sorted(r["id"] for r in read_shards(result[clean].output_path)) == want
    assert result[clean].result["dropped"] == {"lang_not_en": 30, "q_not_top_0.2": 8}


def test_quality_classifier_trains_on_and_scores_texts_with_a_lone_surrogate(tmp_path):
    """JSON allows a lone surrogate (`"\\udc80"`); fastText reads UTF-8. A text holding one is trained on and
    scored as its text with U+FFFD in that place (what floret's own binding gives for that text)."""
    import json

    import floret

    docs = list(iter_source("python-docs"))[:60]
    junk = junk_records(60, seed=7)
    odd = json.loads('"Open the file \\udc80 and read its lines one at a time with a for loop."')
    model = str(tmp_path / "model.bin")
    m = train_classifier([*docs, {"id": "odd", "text": odd}], junk, model, ClassifierConfig(holdout=0.0))
    assert m["train.positive"] == 61
    [got] = QualityScores(model)(iter([{"id": "x", "text": odd}]))
    fixed = " ".join(odd.replace("\udc80", "\ufffd").lower().split())
    pairs = floret.load_model(model).f.predict(fixed + "\n", 2, 0.0, "strict")
    assert got["quality"] == round(min(dict((lab, p) for p, lab in pairs)["__label__hq"], 1.0), 6)


def test_a_text_about_fasttext_labels_adds_no_label_to_the_quality_classifier(tmp_path):
    """fastText reads every token starting `__label__` as a label: a page explaining fastText's training
    format ("__label__spam buy now") made a third label, and weighed its page towards it. The model has
    exactly the two labels (floret's own `get_labels`), and such a page scores as the same text without the
    prefix does."""
    import floret

    docs = list(iter_source("python-docs"))[:60]
    junk = junk_records(60, seed=7)
    about = ("Each line of a fastText training file starts with its labels, such as __label__spam or "
             "__label__ham, followed by the text: __label__spam buy cheap pills now.")  # fmt: skip
    model = str(tmp_path / "model.bin")
    train_classifier([*docs, {"id": "about", "text": about}], junk, model, ClassifierConfig(holdout=0.0))
    assert sorted(floret.load_model(model).get_labels()) == ["__label__hq", "__label__lq"]
    [got] = QualityScores(model)(iter([{"id": "x", "text": about}]))
    [plain] = QualityScores(model)(iter([{"id": "y", "text": about.replace("__label__", "label__")}]))
    assert got == plain


def test_a_classifier_retrained_to_the_same_path_is_the_one_that_scores(tmp_path):
    """Train, score, retrain with the classes swapped to the same file, score again (a notebook): the scores
    are the new model's (floret loading the file itself), not the first model's, cached."""
    import floret

    docs = list(iter_source("python-docs"))[:60]
    junk = junk_records(60, seed=7)
    model = str(tmp_path / "model.bin")
    config = ClassifierConfig(holdout=0.0, epoch=25, lr=0.5)
    train_classifier(docs, junk, model, config)
    [first] = QualityScores(model)(iter(docs[:1]))
    train_classifier(junk, docs, model, config)  # swapped: docs are now low quality
    [second] = QualityScores(model)(iter(docs[:1]))
    line = " ".join(docs[0]["text"][:20_000].lower().split())
    pairs = floret.load_model(model).f.predict(line + "\n", 2, 0.0, "strict")
    assert second["quality"] == round(min(dict((lab, p) for p, lab in pairs)["__label__hq"], 1.0), 6)
    assert first["quality"] > 0.5 > second["quality"]
