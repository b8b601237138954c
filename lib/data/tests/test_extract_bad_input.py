"""Extraction of hostile or mislabelled web bytes (review r17): charsets decoded as browsers decode them (the
WHATWG Encoding Standard), byte-order marks, HTTP transfer and content encodings, decompression bombs, bad WARC
lengths. Bodies are built here from the text the page should show, with Python's codec of the right WHATWG
encoding; expected text is that text, never the code's output."""

from __future__ import annotations

import pytest

pytest.importorskip("resiliparse")

from schooner.data.curation._html import decode_html

# text that only the WHATWG decoder of each label decodes (cp1252 punctuation in 0x80-0x9F, NEC/IBM rows of
# cp932, UHC syllables of cp949, a 4-byte gb18030 character)
FRENCH = "Le café “crème” coûte 3 € – c’est"
JAPANESE = "①②③ 髙橋さんの日本語"
KOREAN = "한국어 똠방각하"
CHINESE = "中文网页 䶮 €"
WHATWG_CASES = [
    (FRENCH, "cp1252", ["iso-8859-1", "ISO-8859-1", "latin1", "us-ascii", "ascii", "windows-1252"]),
    (JAPANESE, "cp932", ["shift_jis", "Shift_JIS", "sjis", "x-sjis", "windows-31j"]),
    (KOREAN, "cp949", ["euc-kr", "EUC-KR", "ks_c_5601-1987"]),
    (CHINESE, "gb18030", ["gb2312", "gbk", "GB2312"]),
]


def _page(text: str) -> str:
    return f"<html><head><title>t</title></head><body><p>{text}</p></body></html>"


@pytest.mark.parametrize(("text", "codec", "labels"), WHATWG_CASES, ids=[c[1] for c in WHATWG_CASES])
def test_declared_charset_labels_decode_as_the_whatwg_encoding(text, codec, labels):
    body = _page(text).encode(codec)
    for label in labels:
        html, used, fell_back = decode_html(body, label)  # HTTP header
        assert (text in html, used, fell_back) == (True, codec, False), label
        meta = f'<html><head><meta charset="{label}"><title>t</title></head><body><p>{text}</p></body></html>'
        html, used, _ = decode_html(meta.encode(codec), None)  # <meta charset>
        assert (text in html, used) == (True, codec), label


def test_detected_encoding_is_mapped_to_the_whatwg_encoding():
    # uchardet names this page Shift_JIS; its ① and 髙 are only in cp932 (WHATWG's Shift_JIS decoder)
    text = (
        "日本語のテキストです。これは日本のウェブページの本文で、ひらがなとカタカナと漢字が含まれています。"
        * 10
    )
    html, used, _ = decode_html(_page(text + JAPANESE).encode("cp932"), None)
    assert (text + JAPANESE in html, used) == (True, "cp932")
    # a UHC page uchardet detects (as CP949); mapped to its WHATWG name's decoder, not to utf-8
    text = "한국어 웹 페이지의 본문입니다. 이것은 한국어 텍스트이며 여러 문장이 포함되어 있습니다. " * 10
    html, used, _ = decode_html(_page(text + KOREAN).encode("cp949"), None)
    assert (text + KOREAN in html, used) == (True, "cp949")


def test_a_header_charset_that_fails_and_a_meta_charset_that_works_counts_as_a_fallback():
    body = f'<html><head><meta charset="windows-1252"></head><body><p>{FRENCH}</p></body></html>'.encode(
        "cp1252"
    )
    html, used, fell_back = decode_html(body, "utf-8")
    assert (FRENCH in html, used, fell_back) == (True, "cp1252", True)


@pytest.mark.parametrize(
    ("bom", "codec", "name"),
    [(b"\xef\xbb\xbf", "utf-8", "utf-8"), (b"\xff\xfe", "utf-16-le", "utf-16-le"),
     (b"\xfe\xff", "utf-16-be", "utf-16-be")],
)  # fmt: skip
def test_a_byte_order_mark_overrides_any_declared_charset(bom, codec, name):
    text = FRENCH + " " + KOREAN
    body = bom + _page(text).encode(codec)
    for declared in ("iso-8859-1", "shift_jis", None):
        html, used, _ = decode_html(body, declared)
        assert (html.startswith("<html>"), text in html, used) == (True, True, name), declared
    meta = bom + f'<html><head><meta charset="iso-8859-1"></head><body>{text}</body></html>'.encode(codec)
    assert decode_html(meta, None)[1] == name
