"""Decontamination against evaluation tasks laid out as an evaluation suite writes them (records with
`source` = task, `id` = task/doc index), as ARC's own rows (question, choices with labels, answerKey), as a
`Dataset` and as plain jsonl; the step on the step runner, its report (task, item, n-gram, training
document) and its removals. Expected hits come from how each training page was built."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("rbloom")

from schooner.cluster import StepRunner
from schooner.data import Dataset, read_shards
from schooner.data.curation import build_index, contamination_hits, load_eval_items
from schooner.data.curation._text import normalized_words
from schooner.data.curation.steps import decontaminate

# Science questions in ARC's manner (written for this test), as an eval suite writes them: one record a doc.
ARC_EASY = [
    ("Which property of a mineral can be determined just by looking at it when it is held up to the light "
     "in a classroom?", ["luster", "mass", "weight", "hardness"], 0),
    ("A student wants to find out how the amount of sunlight a bean plant receives changes how tall the "
     "plant grows over three weeks. What should the student measure?", ["soil", "height", "color", "water"], 1),
    ("Which of these forms of energy is stored in the chemical bonds of the food that animals eat every day "
     "in order to grow and move?", ["sound", "light", "chemical", "nuclear"], 2),
]  # fmt: skip
ARC_CHALLENGE_ROWS = [
    {"id": "Mercury_0001", "question": "An astronomer observes that a planet rotates faster after a meteorite "
     "impact. Which is the most likely effect of this increase in rotation on the length of a day?",
     "choices": {"text": ["Planetary density will decrease.", "Planetary days will become shorter.",
                          "Planetary years will become longer.", "Planetary gravity will become stronger."],
                 "label": ["A", "B", "C", "D"]}, "answerKey": "B"},
    {"id": "Mercury_0002", "question": "Which technology is newest?",
     "choices": {"text": ["cellular telephone", "television", "refrigerator", "airplane"],
                 "label": ["A", "B", "C", "D"]}, "answerKey": "A"},
    {"id": "Mercury_0003", "question": "Which gas do plants take in from the air?",
     "choices": {"text": ["oxygen", "carbon dioxide"], "label": ["1", "2"]}, "answerKey": "2"},
]  # fmt: skip
STORY = ("the lighthouse keeper climbed the spiral stairs every evening to light the great lamp that warned "
         "the fishing boats away from the rocks below the cliff")  # fmt: skip
FILLER = [
    "Welcome to our homework help forum where students and parents share tips about science projects.",
    "Remember to be kind to other members and to search the archive before you post a new question.",
    "Our moderators review every post within a day and remove advertising and other off-topic messages.",
]


def _eval_record(task: str, i: int, q: str, choices: list[str], answer: int) -> dict:
    text = (
        q
        + "\n"
        + "\n".join(f"{'ABCD'[k]}. {c}" for k, c in enumerate(choices))
        + f"\nAnswer: {choices[answer]}"
    )
    return {"id": f"{task}/{i}", "text": text, "source": task, "metadata": {"task": task, "doc": i}}


@pytest.fixture(scope="module")
def evals(tmp_path_factory):
    root = tmp_path_factory.mktemp("evals")
    suite = [_eval_record("arc_easy", i, *row) for i, row in enumerate(ARC_EASY)]
    Dataset.from_records(suite).write_jsonl(str(root / "suite"), progress=False)
    (root / "arc_challenge.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ARC_CHALLENGE_ROWS))
    story = Dataset.from_records([{"id": "stories/0", "text": STORY, "source": "stories", "metadata": {}}])
    return {"suite": str(root / "suite"), "arc_challenge": str(root / "arc_challenge.jsonl"), "story": story}


def _page(i: int, body: list[str]) -> dict:
    text = "\n".join([FILLER[i % 3], *body, FILLER[(i + 1) % 3]])
    return {
        "id": f"page-{i}",
        "text": text,
        "source": "crawl",
        "metadata": {"url": f"https://forum.example/{i}"},
    }


def _pages() -> tuple[list[dict], dict[str, set[tuple[str, str]]], dict[str, list[str]]]:
    """Training pages, the `(task, eval item)` each one copies, and the copied lines of each page."""
    q1, q2 = ARC_EASY[1][0], ARC_CHALLENGE_ROWS[0]["question"]
    words = STORY.split()
    wrapped = [" ".join(words[i : i + 7]) for i in range(0, len(words), 7)]  # hard-wrapped lines of 7 words
    near = " ".join(ARC_EASY[0][0].split()[:10]) + " and other things people say about rocks and stones."
    bodies = {
        "page-0": ([f"Q: {q1.upper()}"], {("arc_easy", "arc_easy/1")}),
        "page-1": ([f"Homework: {q2} Answer: Planetary days will become shorter."],
                   {("arc_challenge", "Mercury_0001")}),
        "page-2": (wrapped, {("stories", "stories/0")}),
        "page-3": ([near], set()),  # 10 words of a question: under 13, no n-gram hits
        "page-4": (["I love biology class, especially the part about plants and light."], set()),
        # an item of 11 words, under an n-gram: found whole (GPT-3's shorter n), and not by its start alone
        "page-5": (["Quiz time: which gas do plants take in from the air? Carbon dioxide, said Sam."],
                   {("arc_challenge", "Mercury_0003")}),
        "page-6": (["Which gas do plants take in from the soil? Water, mostly, and some minerals."], set()),
    }  # fmt: skip
    pages = [_page(i, bodies[f"page-{i}"][0]) for i in range(len(bodies))]
    expected = {k: v[1] for k, v in bodies.items() if v[1]}
    copied = {k: v[0] for k, v in bodies.items() if v[1]}
    return pages, expected, copied


def test_eval_items_from_suite_records_arc_rows_datasets_and_dicts(evals):
    items = load_eval_items([evals["suite"], evals["arc_challenge"], evals["story"]])
    by_id = {it["id"]: it for it in items}
    assert [it["id"] for it in items] == ["arc_easy/0", "arc_easy/1", "arc_easy/2", "Mercury_0001",
                                          "Mercury_0002", "Mercury_0003", "stories/0"]  # fmt: skip
    assert {it["task"] for it in items} == {"arc_easy", "arc_challenge", "stories"}
    # ARC's own layout: the question followed by the text of the labelled answer
    assert by_id["Mercury_0001"]["text"].endswith("? Planetary days will become shorter.")
    assert by_id["Mercury_0002"]["text"] == "Which technology is newest? cellular telephone"
    assert by_id["Mercury_0003"]["text"].endswith("from the air? carbon dioxide")
    assert by_id["arc_easy/2"]["text"].endswith("Answer: chemical")
    rows = [{"question": "Is a bat a bird or a mammal that flies at night?", "choices": ["bird", "mammal"],
             "answer": "B"}, {"text": "a plain record without id or source"}]  # fmt: skip
    got = load_eval_items(rows)
    assert [(it["id"], it["task"], it["text"][-6:]) for it in got] == [
        ("eval/0", "eval", "mammal"), ("eval/1", "eval", "source")]  # fmt: skip


def test_bad_eval_input_is_named(evals, tmp_path):
    bad = tmp_path / "quiz.jsonl"
    bad.write_text('{"question": "fine question here?", "answer": "yes"}\n{"choices": ["a", "b"]}\n')
    with pytest.raises(ValueError, match=r"quiz.jsonl:2: .*no text, question"):
        load_eval_items(str(bad))
    bad.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match=r"quiz.jsonl:2: not JSON"):
        load_eval_items(str(bad))
    with pytest.raises(ValueError, match="'Mercury_0001' at .* was already given"):
        load_eval_items([evals["arc_challenge"], evals["arc_challenge"]])
    with pytest.raises(TypeError, match="give jsonl files"):
        load_eval_items([3])


def test_hits_name_task_item_ngram_and_paragraph(evals, tmp_path):
    items = load_eval_items([evals["suite"], evals["arc_challenge"], evals["story"]])
    built = build_index(items, str(tmp_path / "index"))
    assert built["tasks"] == {"arc_easy": 3, "arc_challenge": 3, "stories": 1}
    assert built["shorter_than_ngram"] == 1  # Mercury_0003: 11 words
    assert built["too_short_examples"] == ["Mercury_0002"]  # 5 words, under min_words
    pages, expected, copied = _pages()
    texts = {it["id"]: " ".join(normalized_words(it["text"])) for it in items}
    for page in pages:
        hits = contamination_hits(page["text"], str(tmp_path / "index"))
        assert {(h["task"], h["eval_item"]) for h in hits} == expected.get(page["id"], set()), page["id"]
        if not hits:
            continue
        assert [page["text"][slice(*h["span"])].rstrip("\n") for h in hits] == copied[page["id"]]
        for h in hits:
            n = min(13, len(texts[h["eval_item"]].split()))
            assert len(h["ngram"].split()) == n and h["ngram"] in texts[h["eval_item"]]
            assert h["ngram"] in " ".join(normalized_words(page["text"]))


def test_decontaminate_step_reports_counts_and_removes(evals, tmp_path):
    pages, expected, copied = _pages()
    crawl = str(tmp_path / "crawl")
    Dataset.from_records(pages, num_shards=2).write_jsonl(crawl, progress=False)
    against = [evals["suite"], evals["arc_challenge"], evals["story"]]
    by_par = decontaminate("reports/decon", crawl, against=against, remove="paragraphs")
    by_doc = decontaminate("reports/decon-docs", crawl, against=against, remove="documents")
    assert (
        by_par.key != decontaminate("reports/decon", crawl, against=evals["suite"], remove="paragraphs").key
    )
    assert by_par.key == decontaminate("reports/decon", crawl, against=against, remove="paragraphs").key
    result = StepRunner(prefix=str(tmp_path / "prefix")).run([by_par, by_doc])
    assert result.ok
    out = result[by_par].result
    report = json.loads((tmp_path / result[by_par].output_path / "report.json").read_text())
    assert {(h["document"], h["task"], h["eval_item"]) for h in report["hits"]} == {
        (d, t, i) for d, pairs in expected.items() for t, i in pairs}  # fmt: skip
    page_1 = next(h for h in report["hits"] if h["document"] == "page-1")
    assert page_1["url"] == "https://forum.example/1" and page_1["source"] == "crawl"
    assert page_1["paragraph"] == copied["page-1"][0] and page_1["eval_text"].startswith("An astronomer")
    n_copied = sum(len(v) for v in copied.values())
    assert out["contaminated_paragraphs"] == n_copied and out["contaminated_documents"] == len(expected)
    assert out["eval_items_matched"] == 4 and out["records"] == len(pages)
    assert out["by_task"]["arc_easy"] == {"items": 3, "items_matched": 1, "paragraphs": 1, "documents": 1,
                                          "chars": len(copied["page-0"][0]) + 1}  # fmt: skip
    assert out["by_task"]["stories"]["paragraphs"] == len(copied["page-2"])
    assert out["removed"] == {"mode": "paragraphs", "records_in": 7, "records_out": 7, "documents": 0,
                              "paragraphs": n_copied, "chars": out["contaminated_chars"]}  # fmt: skip
    cleaned = {r["id"]: r["text"] for r in read_shards(f"{result[by_par].output_path}/records")}
    for page in pages:
        lines = page["text"].split("\n")
        assert cleaned[page["id"]].rstrip("\n").split("\n") == [
            ln for ln in lines if ln not in copied.get(page["id"], [])
        ]
    kept = {r["id"] for r in read_shards(f"{result[by_doc].output_path}/records")}
    assert kept == {p["id"] for p in pages} - set(expected)
    assert result[by_doc].result["removed"]["documents"] == len(expected)


def test_decontaminate_rejects_unknown_removal():
    with pytest.raises(ValueError, match="remove='spans'"):
        decontaminate("x", "crawl", against="evals.jsonl", remove="spans")


def test_short_item_inside_a_training_text_shorter_than_an_ngram(tmp_path):
    """An 11-word eval item (a short question and its answer) quoted in a 12-word line: 11 of its 12 words
    lie in the item, so the line is contaminated (hand count: 11/12 >= 0.5), as it is in a longer line."""
    item = "Which module parses command line options and writes usage messages? argparse"
    build_index([{"id": "q1", "task": "quiz", "text": item}], str(tmp_path / "idx"))
    for text, n_words in [
        ("Quiz: Which module parses command-line options and writes usage messages? Argparse!", 12),
        ("Which module parses command line options and writes usage messages? argparse. Yes", 12),
        ("Quiz: which module parses command line options and writes usage messages? argparse, yes", 13),
    ]:
        assert len(normalized_words(text)) == n_words
        hits = contamination_hits(text, str(tmp_path / "idx"))
        assert [(h["span"], h["eval_item"]) for h in hits] == [([0, len(text)], "q1")], text
        assert hits[0]["fraction"] == round(11 / n_words, 4)
    # the item alone is found once, the whole text
    assert [h["fraction"] for h in contamination_hits(item, str(tmp_path / "idx"))] == [1.0]


@pytest.mark.parametrize("name", ["quiz.jsonl.gz", "quiz.jsonl.zst", "quiz.ndjson", "quiz.json"])
def test_task_rows_in_compressed_and_json_files(tmp_path, name):
    """Task rows (question/choices/answer) are eval items in any JSON file the readers take (HumanEval
    ships as `HumanEval.jsonl.gz`), not only in plain `.jsonl`."""
    import gzip

    import zstandard

    rows = [
        {
            "question": "Which module parses command-line options?",
            "choices": ["argparse", "shlex"],
            "answer": 0,
        },
        {"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    return the sum of a and b"},
    ]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    if name.endswith(".json"):
        data = json.dumps(rows).encode()
    elif name.endswith(".gz"):
        data = gzip.compress(data)
    elif name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    (tmp_path / name).write_bytes(data)
    items = load_eval_items(str(tmp_path / name))
    assert [(it["id"], it["task"], it["text"]) for it in items] == [
        ("quiz/0", "quiz", "Which module parses command-line options? argparse"),
        ("quiz/1", "quiz", "def add(a, b):\n    return the sum of a and b"),
    ]


def test_bad_task_row_in_compressed_file_is_named(tmp_path):
    import gzip

    (tmp_path / "quiz.jsonl.gz").write_bytes(
        gzip.compress(b'{"question": "Which?", "answer": 1}\n{"choices": [1]}\n')
    )
    with pytest.raises(ValueError, match=r"quiz\.jsonl\.gz:2: .*no text, question"):
        load_eval_items(str(tmp_path / "quiz.jsonl.gz"))
    (tmp_path / "bad.jsonl.gz").write_bytes(gzip.compress(b'{"question": "Which?"}\n{not json\n'))
    with pytest.raises(ValueError, match=r"bad\.jsonl\.gz:2: not JSON"):
        load_eval_items(str(tmp_path / "bad.jsonl.gz"))


# An eval passage and copies of it as web pages carry it: soft hyphens a CMS puts into long words (`&shy;`),
# zero-width spaces and joiners, word joiners and byte-order marks pasted inside words, upper case with
# German sharp s ("STRASSE" is the capital of "Straße", `str.casefold`'s full case folding).
PASSAGE = (
    "The committee met on Hauptstraße to discuss the international cooperation agreement and agreed that "
    "every participating university would publish its measurements openly before the end of the year."
)
INVISIBLE = {
    "soft hyphen": lambda t: t.replace("international", "inter\u00adnational").replace("cooperation", "co\u00adoper\u00adation").replace("participating", "partic\u00adipating"),
    "zero-width space": lambda t: t.replace("committee", "commit\u200btee").replace("measurements", "measure\u200bments").replace("university", "uni\u200bversity"),
    "zero-width joiners": lambda t: t.replace("discuss", "dis\u200ccuss").replace("agreement", "agree\u200dment").replace("publish", "pub\u200dlish"),
    "word joiner and BOM": lambda t: t.replace("openly", "open\u2060ly").replace("before", "be\ufefffore").replace("every", "ev\u2060ery"),
    "upper case": lambda t: t.upper(),  # Hauptstraße -> HAUPTSTRASSE
}  # fmt: skip


@pytest.mark.parametrize("how", list(INVISIBLE))
def test_copies_with_invisible_characters_or_in_capitals_are_found(tmp_path, how):
    build_index([{"id": "p1", "task": "reading", "text": PASSAGE}], str(tmp_path / "idx"))
    copy = INVISIBLE[how](PASSAGE)
    assert copy != PASSAGE and copy.isprintable() is False or how == "upper case"
    page = "A blog post about a meeting.\n" + copy + "\nComments are closed."
    hits = contamination_hits(page, str(tmp_path / "idx"))
    start = page.index(copy)
    assert [(h["span"], h["eval_item"], h["fraction"]) for h in hits] == [
        ([start, start + len(copy) + 1], "p1", 1.0)
    ], how
    # and the other way round: an eval item with the invisible characters finds the plain copy
    build_index([{"id": "p2", "task": "reading", "text": copy}], str(tmp_path / "idx2"))
    hits = contamination_hits("Intro line.\n" + PASSAGE, str(tmp_path / "idx2"))
    assert [h["eval_item"] for h in hits] == ["p2"], how


def test_word_normalisation_rule():
    """The rule both sides share: NFKC, full case folding, format characters (Unicode Cf) deleted, words of
    letters and digits (hand-written expectations)."""
    assert normalized_words("Straße STRASSE straße") == ["strasse", "strasse", "strasse"]
    assert normalized_words("co\u00adop\u200beration \ufb01le ΣΊΣΥΦΟΣ") == ["cooperation", "file", "σίσυφοσ"]
    assert normalized_words("don't\u2060stop") == ["don", "tstop"]


def test_the_format_characters_are_unicodes_category_cf():
    import sys
    import unicodedata

    from schooner.data.curation._text import FORMAT_CHARS

    cf = "".join(c for c in map(chr, range(sys.maxunicode + 1)) if unicodedata.category(c) == "Cf")
    every = "".join(map(chr, range(sys.maxunicode + 1)))
    assert "".join(FORMAT_CHARS.findall(every)) == cf


def test_an_index_built_by_another_rule_or_checked_with_another_ngram_is_refused(tmp_path):
    import os

    from schooner.data.curation import DecontamConfig, contaminated_spans

    build_index([{"id": "p1", "task": "reading", "text": PASSAGE}], str(tmp_path / "idx"))
    with pytest.raises(ValueError, match="built with ngram=13, min_words=8.*ngram=8"):
        contaminated_spans(PASSAGE, str(tmp_path / "idx"), DecontamConfig(ngram=8))
    build_index([{"id": "p1", "task": "reading", "text": PASSAGE}], str(tmp_path / "old"))
    os.remove(tmp_path / "old" / "index.json")  # as an earlier schooner-data wrote it
    with pytest.raises(ValueError, match=f"{tmp_path / 'old'}.*rebuild it with build_index"):
        contaminated_spans(PASSAGE, str(tmp_path / "old"))


def test_an_index_rebuilt_in_the_same_folder_is_the_one_checked(tmp_path):
    """A notebook builds an index, checks a page, then rebuilds the index in the same folder against other
    eval items: the check reads the new index (it read the first one, cached, and missed the new item)."""
    from schooner.data.curation import contaminated_spans

    other = "A completely different passage about rivers and mountains that is long enough to index as text."
    folder = str(tmp_path / "idx")
    build_index([{"id": "p1", "task": "reading", "text": PASSAGE}], folder)
    assert [s[2] for s in contaminated_spans(PASSAGE, folder)] == ["p1"]
    build_index([{"id": "p2", "task": "reading", "text": other}], folder)
    assert [s[2] for s in contaminated_spans(other, folder)] == ["p2"]
    assert contaminated_spans(PASSAGE, folder) == []


def test_normalized_words_named_in_the_docs_is_public():
    """docs/curation/decontamination.md names `normalized_words` as the rule eval and training text share: a
    user checks why a paragraph matched with it. Expected words hand-computed: the soft hyphen deleted,
    "ß" case-folded to "ss", full-width letters NFKC'd, punctuation dropped."""
    from schooner.data.curation import normalized_words

    assert normalized_words("Stra\u00dfen\u00adbahn, STRASSE! \uff21\uff22c") == [
        "strassenbahn",
        "strasse",
        "abc",
    ]


def test_words_joined_by_zero_width_spaces_are_found(tmp_path):
    """A copy whose words are joined by zero-width spaces instead of spaces (it renders as the passage) is
    found, as is one with zero-width spaces inside words (above): both readings of U+200B are checked."""
    build_index([{"id": "p1", "task": "reading", "text": PASSAGE}], str(tmp_path / "idx"))
    copy = PASSAGE.replace(" ", "\u200b")
    page = "A blog post about a meeting.\n" + copy + "\nComments are closed."
    hits = contamination_hits(page, str(tmp_path / "idx"))
    start = page.index(copy)
    assert [(h["span"], h["eval_item"]) for h in hits] == [([start, start + len(copy) + 1], "p1")]
    # and an eval item written with them finds the plain copy
    build_index([{"id": "p2", "task": "reading", "text": copy}], str(tmp_path / "idx2"))
    assert [h["eval_item"] for h in contamination_hits("Intro.\n" + PASSAGE, str(tmp_path / "idx2"))] == [
        "p2"
    ]


LONG_PARAGRAPH = " ".join(
    f"Sentence {i} of a long forum post talks about the weather, the garden and the neighbours' dog."
    for i in range(20)
)


def test_a_whole_eval_item_inside_a_long_paragraph_is_flagged_and_counted(tmp_path):
    """A whole eval item (31 words) inside a paragraph of ~370 words covers under half of it, the
    paragraph threshold: it is flagged all the same (`whole_item`), while a part of the item is not."""
    build_index([{"id": "p1", "task": "reading", "text": PASSAGE}], str(tmp_path / "idx"))
    half = LONG_PARAGRAPH.index("Sentence 10")
    page = "Title\n" + LONG_PARAGRAPH[:half] + PASSAGE + " " + LONG_PARAGRAPH[half:] + "\nEnd."
    [hit] = contamination_hits(page, str(tmp_path / "idx"))
    assert hit["eval_item"] == "p1" and hit["whole_item"] and hit["fraction"] < 0.5
    assert hit["span"][0] == len("Title\n")
    part = " ".join(PASSAGE.split()[:20])  # 8 of its 19 n-grams
    page = "Title\n" + LONG_PARAGRAPH[:half] + part + " " + LONG_PARAGRAPH[half:] + "\nEnd."
    assert contamination_hits(page, str(tmp_path / "idx")) == []
