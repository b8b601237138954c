"""Clean text (what `consolidate` writes): whitespace normalised as a plain-Python reference normalises it, and
mojibake repaired as ftfy's own `fix_text` repairs it (mojibake made here from known text, so the expected
text is that text, never the code's output)."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("ftfy")

import ftfy

from schooner.data import write_records
from schooner.data.curation import (
    attribute_dataset,
    clean_text,
    fix_text,
    normalize_whitespace,
    remove_invisible,
    with_attributes,
)
from schooner.data.curation._consolidate import Consolidator


def _reference_whitespace(text: str) -> str:
    """Unicode spaces (category Zs: no-break, thin, ideographic, ...) to a plain space; lines as
    `str.splitlines` splits them, each without trailing whitespace; at most one blank line in a row, none at
    the start or the end."""
    lines = [
        "".join(" " if unicodedata.category(c) == "Zs" else c for c in ln).rstrip()
        for ln in text.splitlines()
    ]
    out: list[str] = []
    for ln in lines:
        if ln or (out and out[-1]):
            out.append(ln)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out)


NBSP_TEXT = (
    "\u00a0\u00a0Heading\u00a0with\u00a0no-break\u00a0spaces\u00a0\u00a0\n"
    "  indented code\u2009(thin space)\u202fand\u3000ideographic \t \n"
    + "\n" * 22
    + "after twenty-two newlines\r\nand a CRLF line\u2028and a line separator\n\n\n \u00a0\n"
)


def test_the_unicode_spaces_are_unicodes_space_separators():
    from schooner.data.curation._clean import UNICODE_SPACES

    zs = {chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Zs"}
    assert set(UNICODE_SPACES) == zs - {" "}


def test_whitespace_is_normalised_as_the_reference_does():
    got = normalize_whitespace(NBSP_TEXT)
    assert got == _reference_whitespace(NBSP_TEXT)
    assert "\u00a0" not in got and "\u2009" not in got and "\n\n\n" not in got
    assert got.startswith(
        "  Heading with no-break spaces\n  indented code (thin space) and ideographic\n\nafter"
    )
    assert got.endswith("and a CRLF line\nand a line separator")


_SPACEY = st.sampled_from(
    [
        "\u00a0",
        "\u2009",
        "\u202f",
        "\u3000",
        "\u2003",
        " ",
        "\t",
        "\n",
        "\r",
        "\r\n",
        "\u2028",
        "\x0c",
        "\x85",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_SPACEY, st.text(alphabet="ab é€\u200b", max_size=4)), max_size=40))
@example(["a", "\r", "\u2028", "a"])  # a lone \r before another break is two breaks, not a \r\n
def test_whitespace_normalisation_matches_the_reference_on_any_text(parts):
    text = "".join(parts)
    assert normalize_whitespace(text) == _reference_whitespace(text)


MOJIBAKE_CASES = [
    "Le café “crème” coûte 3 € – c’est",
    "naïve façade, Straße, smörgåsbord",
    "Schrödinger’s cat — “quoted” … and ½",
]


@pytest.mark.parametrize("clean", MOJIBAKE_CASES)
@pytest.mark.parametrize("codec", ["cp1252", "latin-1"])
def test_mojibake_is_repaired_as_ftfy_repairs_it(clean, codec):
    broken = clean.encode("utf-8").decode(codec, errors="replace" if codec == "cp1252" else "strict")
    if codec == "cp1252" and "\ufffd" in broken:  # bytes cp1252 leaves undefined: not recoverable mojibake
        pytest.skip("cp1252 leaves one of these bytes undefined")
    assert broken != clean
    # ftfy's own fix_text, with the options that leave text alone (quotes, widths, ligatures, entities)
    ours = ftfy.fix_text(broken, unescape_html=False, uncurl_quotes=False, fix_character_width=False,
                         fix_latin_ligatures=False)  # fmt: skip
    assert fix_text(broken) == ours == clean
    if "“" not in clean and "’" not in clean:
        assert fix_text(broken) == ftfy.fix_text(broken)  # its defaults too, where they uncurl nothing


def test_clean_text_is_left_alone_by_the_repair():
    for text in [
        *MOJIBAKE_CASES,
        "Plain ASCII.",
        "日本語のテキスト",
        "«guillemets» and ‘single’ quotes",
        "ＡＢＣ ﬁne &amp;",
    ]:
        assert fix_text(text) == text


def _spans(rec: dict) -> dict:
    return {"spans": rec["metadata"]["spans"]}


def _records():
    body = "First paragraph.\n" + "cut line\n" * 22 + "Last\u00a0paragraph with caf\u00c3\u00a9.  \n"
    start = len("First paragraph.\n")
    spans = [[start + 9 * i, start + 9 * i + 8] for i in range(22)]  # each line's text, not its newline
    return [{"id": "a", "text": body, "source": "t", "metadata": {"spans": spans}}]


@pytest.mark.parametrize(("fix", "whitespace"), [(True, True), (False, True), (True, False), (False, False)])
def test_consolidate_cleans_kept_text_by_default_and_each_repair_can_be_turned_off(tmp_path, fix, whitespace):
    src, att = str(tmp_path / "src"), str(tmp_path / "att")
    write_records(_records(), src)
    attribute_dataset(src, per_record=_spans).write_jsonl(att, progress=False)
    kw = {} if fix and whitespace else {"fix_text": fix, "normalize_whitespace": whitespace}
    c = Consolidator((), ("spans",), False, **kw)
    out = with_attributes(src, [att], locate=True).map_shard(c, with_counters=True)
    [rec] = out.collect(client="inline", progress=False)
    removed = "First paragraph.\n" + "\n" * 22 + "Last\u00a0paragraph with caf\u00c3\u00a9.  \n"
    want = ftfy.fix_text(removed) if fix else removed
    want = _reference_whitespace(want) if whitespace else want
    assert rec["text"] == want
    if fix and whitespace:
        assert rec["text"] == "First paragraph.\n\nLast paragraph with café."


# Invisible characters a page carries inside words: soft hyphens (`&shy;`, a CMS's hyphenation points),
# zero-width spaces (line-break points in long words and URLs), word joiners and byte-order marks.
INVISIBLE_TEXT = "The inter\u00adnational co\u00adoper\u00adation\u200b agree\u2060ment\ufeff is signed."


def test_clean_text_removes_soft_hyphens_and_zero_width_characters():
    assert clean_text(INVISIBLE_TEXT) == "The international cooperation agreement is signed."
    assert clean_text(INVISIBLE_TEXT, fix=False, whitespace=False) == (
        "The international cooperation agreement is signed."
    )
    assert clean_text(INVISIBLE_TEXT, invisible=False, fix=False) == INVISIBLE_TEXT


def test_clean_text_keeps_the_joiners_and_marks_that_change_how_text_reads():
    """Zero-width joiner (emoji sequences, Indic conjuncts), non-joiner (Persian) and direction marks are
    part of the text: removing them changes what a reader sees."""
    kept = ["👩\u200d💻 developer", "می\u200cخواهم", "क्\u200dष", "abc \u200fשלום\u200e def"]
    for text in kept:
        assert clean_text(text) == text


def _words_at(text: str, spans: list) -> list[str]:
    return [text[s:e] for s, e, *_ in spans]


def test_spans_attached_by_consolidate_point_at_the_same_words_after_cleaning(tmp_path):
    """Every span attribute a kept record carries is moved with the cleaning (span removal, invisible
    characters, mojibake, whitespace): each still covers its word in the output text."""
    words = ["Heading", "inter\u00adnational", "caf\u00c3\u00a9", "agree\u200bment", "tail"]
    want = ["Heading", "international", "café", "agreement", "tail"]
    body = ("\u00a0\u00a0Heading  \r\n\n\n\n\nAn inter\u00adnational\u00a0meeting at the caf\u00c3\u00a9.\n"
            + "cut this line\n" * 3 + "The agree\u200bment \t\n\n\n\nholds.\u2028tail\n\n")  # fmt: skip
    spans = [[body.index(w), body.index(w) + len(w), "word"] for w in words]
    cut = [[m, m + len("cut this line\n")] for m in range(body.index("cut"), body.index("The agree"), 14)]
    rec = {"id": "a", "text": body, "source": "t", "metadata": {"marks": spans, "cut": cut, "n": [1, 2]}}
    src, att = str(tmp_path / "src"), str(tmp_path / "att")
    write_records([rec], src)
    attribute_dataset(src, per_record=lambda r: dict(r["metadata"])).write_jsonl(att, progress=False)
    c = Consolidator((), ("cut",), True)
    out = with_attributes(src, [att], locate=True).map_shard(c, with_counters=True)
    [out] = out.collect(client="inline", progress=False)
    assert "cut this line" not in out["text"] and "\u00ad" not in out["text"]
    attrs = out["metadata"]["attributes"]
    assert _words_at(out["text"], attrs["marks"]) == want, out["text"]
    assert [m[2] for m in attrs["marks"]] == ["word"] * 5  # what follows start and end is kept
    assert attrs["cut"] == []  # the removed spans are gone from the text, and so from its attributes
    assert attrs["n"] == [1, 2]  # not spans: left alone


def test_the_repair_reads_a_soft_hyphen_of_mojibake_before_it_is_removed():
    """UTF-8 "í" read as windows-1252 is "Ã" and a soft hyphen: the repair comes first, so "aquí" is restored
    (removing the soft hyphen first left "aquÃ")."""
    assert clean_text("aqu\u00c3\u00ad est\u00c3\u00a1") == "aquí está"


_PIECES = st.sampled_from(
    ["word", "inter\u00adnational", "zero\u200bwidth", "joined\u2060up", "\ufeffbom", "café", "x"]
)
_GAPS = st.sampled_from([" ", "  ", "\u00a0", "\t", "\n", "\n\n\n\n", " \n", "\r\n", "\u2028", "\u3000 \n"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_GAPS, _PIECES), min_size=1, max_size=30), _GAPS)
def test_spans_follow_invisible_and_whitespace_cleaning_on_any_text(parts, last):
    """Each word's span, moved by the cleaning's offsets, covers that word without its invisible characters."""
    from schooner.data.curation._clean import clean_text_offsets
    from schooner.data.curation._offsets import move_spans

    text, spans = "", []
    for gap, word in parts:
        text += gap
        spans.append([len(text), len(text) + len(word), word])
        text += word
    text += last
    out, offsets = clean_text_offsets(text, fix=False)
    assert out == clean_text(text, fix=False)
    moved = move_spans({"w": spans}, offsets)["w"] if offsets else spans
    assert [out[s:e] for s, e, _ in moved] == [remove_invisible(w) for _, w in parts]
