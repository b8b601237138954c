"""HTML to text: charset detection and main-content extraction (resiliparse, or trafilatura).

resiliparse (Bevendorff et al., "Resiliparse", ECIR 2018; the extractor of Dolma/OLMo and datatrove's
`Trafilatura` alternative) removes navigation, footers, sidebars and banners with its main-content heuristics
and keeps `<pre>` blocks; trafilatura (Barbaresi, ACL 2021; FineWeb's extractor) is ~15x slower, pure Python.
Both are imported only here.
"""

from __future__ import annotations

import codecs
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

EXTRACTORS = ("resiliparse", "trafilatura")
"""Main-content extractors `extract_text` knows."""

_LINE_END_SPACE = re.compile(r"\n[^\S\n]+")  # in reversed text: a newline, then the line's trailing space
_BLANK_RUN = re.compile(r"\n\n\n+")
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_\-:.]+)""", re.IGNORECASE)

RESILIPARSE_OPTIONS: Mapping[str, bool] = MappingProxyType({
    "preserve_formatting": True, "list_bullets": True, "alt_texts": False, "links": False,
    "form_fields": False, "noscript": False, "comments": False,
})  # fmt: skip
"""`extract_plain_text`'s options besides `main_content`: lines and bullets kept; image alt texts, link
targets, form fields, `<noscript>` and comment sections left out."""


class BadPage(ValueError):
    """A page that cannot become a record (the caller names its file and offset); `kind` names the reason
    (what skips are listed by: `"empty_body"`, `"over_max_bytes"`, ...)."""

    def __init__(self, message: str, kind: str = "bad_page") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class ExtractConfig:
    """How pages become records."""

    extractor: str = "resiliparse"
    """`"resiliparse"` (main content, fast) or `"trafilatura"` (pure Python, ~15x slower)."""
    main_content: bool = True
    """Drop boilerplate (navigation, footers, sidebars, cookie banners) with the extractor's heuristics."""
    content_types: tuple[str, ...] = ("text/html", "application/xhtml+xml")
    """Content types extracted (a record's WARC-Identified-Payload-Type, else its HTTP Content-Type, else HTML
    sniffed from the body); other responses are counted (`warc.skipped_content_type`) and skipped."""
    max_bytes: int = 10 * 2**20
    """Pages larger than this (10 MB) are bad input (named, counted), never parsed; a compressed body is
    inflated no further than this (a decompression bomb is refused, not inflated)."""
    min_chars: int = 1
    """Pages whose extracted text is shorter are dropped (`dropped.empty_text`)."""
    keep_status: tuple[int, ...] = (200,)
    """HTTP status codes extracted; others are counted (`warc.skipped_status`)."""

    def __post_init__(self) -> None:
        if self.extractor not in EXTRACTORS:
            raise ValueError(f"ExtractConfig.extractor={self.extractor!r}; use one of {EXTRACTORS}")
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes < 1:
            raise ValueError(f"ExtractConfig.max_bytes must be an integer >= 1, got {self.max_bytes!r}")
        if not isinstance(self.min_chars, int) or self.min_chars < 0:
            raise ValueError(f"ExtractConfig.min_chars must be an integer >= 0, got {self.min_chars!r}")
        object.__setattr__(self, "content_types", tuple(t.lower() for t in self.content_types))
        object.__setattr__(self, "keep_status", tuple(self.keep_status))


_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
# Python codecs that decode less than the WHATWG decoder a label maps to (what browsers use): cp1252's
# punctuation in 0x80-0x9F, cp932's NEC/IBM rows, cp949's UHC syllables, gb18030's 4-byte characters, cp874's
# 0x80-0x9F; keyed by resiliparse's WHATWG-mapped name (`map_encoding_to_html5`)
_WHATWG_SUPERSET = {"shift_jis": "cp932", "euc_kr": "cp949", "gbk": "gb18030", "iso8859-11": "cp874"}


@functools.lru_cache(maxsize=1024)  # a handful of labels on a whole crawl; ~2 us a call uncached
def whatwg_codec(label: str, *, detected: bool = False) -> str | None:
    """The Python codec that decodes a charset label as browsers do (WHATWG Encoding Standard): iso-8859-1,
    latin1 and ascii are windows-1252 (cp1252), shift_jis is cp932, euc-kr is cp949, gb2312 and gbk are
    gb18030. `None` for a label WHATWG does not know (a browser ignores it); a `detected` name (uchardet's)
    that WHATWG does not list is kept when Python knows it (e.g. `cp949`)."""
    from resiliparse.parse.encoding import map_encoding_to_html5

    mapped = map_encoding_to_html5(label.strip().lower(), fallback_utf8=False)
    if mapped is None:
        if not detected:
            return None
        try:
            mapped = codecs.lookup(label.strip()).name
        except LookupError:
            return None
    return _WHATWG_SUPERSET.get(mapped, mapped)


def decode_html(body: bytes, declared: str | None) -> tuple[str, str, bool]:
    """`(text, charset, fell_back)`, as a browser decodes (HTML5, WHATWG Encoding Standard): a byte-order mark
    first, whatever is declared; else the HTTP-declared charset, else the `<meta>` charset, else what uchardet
    detects. Labels are mapped to the WHATWG encoding (`whatwg_codec`: iso-8859-1 is cp1252, ...) and
    `charset` is the codec used. A declared charset that does not decode (a wrong declaration) falls back to
    the next one, then detection (`fell_back` is then true).

    Raises:
        BadPage: a binary body (NUL bytes in the first KiB of a body without a byte-order mark).
    """
    for bom, enc in _BOMS:
        if body.startswith(bom):
            return body[len(bom) :].decode(enc, "replace"), enc, False
    head = body[:1024]
    if b"\x00" in head:
        raise BadPage("binary body (NUL bytes), not text", "binary_body")
    candidates: list[str | None] = []
    if declared:
        candidates.append(whatwg_codec(declared))
    m = _META_CHARSET.search(head)
    if m:
        meta = whatwg_codec(m.group(1).decode("ascii", "replace"))
        # a <meta> read as ASCII cannot be UTF-16: HTML5 takes it as UTF-8
        candidates.append("utf-8" if meta in ("utf-16-le", "utf-16-be") else meta)
    failed = False
    for label in candidates:  # None: a label WHATWG does not know, a wrong declaration too
        try:
            if label is not None:
                return body.decode(label), label, failed
        except (LookupError, UnicodeDecodeError):
            pass
        failed = True
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    raw = detect_encoding(body, html5_compatible=False)
    enc = (whatwg_codec(raw, detected=True) if raw else None) or "utf-8"
    return bytes_to_str(body, enc), enc, failed


@functools.cache
def _resiliparse() -> tuple[Any, Any]:
    """`(HTMLTree.parse, extract_plain_text)`, imported once: an import statement per page costs ~9 us."""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    return HTMLTree.parse, extract_plain_text


def html_title(html: str) -> str:
    """The page's `<title>` text ("" when it has none)."""
    return _title(_resiliparse()[0](html))


def _title(tree: Any) -> str:
    return " ".join((tree.title or "").split())


def extract_text(html: str, config: ExtractConfig = ExtractConfig()) -> str:
    """The main text of a page: paragraphs and headings as lines, lists with bullets, code blocks verbatim,
    table rows one per line; boilerplate removed when `config.main_content`.

    Raises:
        BadPage: the extractor failed on this page.
    """
    return extract_page(html, config)[0]


def extract_page(html: str, config: ExtractConfig = ExtractConfig()) -> tuple[str, str]:
    """`(main text, title)` of a page (see `extract_text`), the HTML parsed once for both with resiliparse.

    Raises:
        BadPage: the extractor failed on this page.
    """
    parse, extract_plain_text = _resiliparse()
    try:
        tree = parse(html)
        if config.extractor == "resiliparse":
            if config.main_content:
                _drop_ads(tree, html)
            text = extract_plain_text(tree, main_content=config.main_content, **RESILIPARSE_OPTIONS)
            if "<pre" in html or "<PRE" in html or "<Pre" in html:
                return _tidy_around(text, _pre_texts(tree)), _title(tree)
        else:
            import trafilatura

            text = trafilatura.extract(
                html, include_tables=True, include_comments=False, include_images=False, include_links=False,
                favor_precision=config.main_content, deduplicate=False, with_metadata=False, fast=True,
            ) or ""  # fmt: skip
    except (ValueError, RuntimeError, TypeError) as e:  # the extractors' parse errors
        raise BadPage(f"{config.extractor} could not extract this page ({e})", "extractor_failed") from None
    return _tidy(text), _title(tree)


AD_WORDS = frozenset(
    ["ad", "ads", "advert", "adverts", "advertisement", "advertisements", "advertising", "adsbygoogle",
     "sponsor", "sponsors", "sponsored"]
)  # fmt: skip
"""Words of a class or id that mark an element as an ad in main-content mode (the words of a name split at
anything but letters and digits: "ad-slot", "sponsored_links", "ad advertisement" are ads; "header",
"load-more", "adaptive" are not). resiliparse's main-content mode keeps such blocks when they sit beside
the article (trafilatura drops them)."""
# class and id attributes with their value (literal first, no lookbehind: ~10x faster than a case-blind
# pattern with one, ~0.1 ms on a 12 KB page); the name must start the attribute (checked after the match)
_NAMES = re.compile(r"""(class|id|CLASS|ID|Class|Id)\s*=\s*(?:"([^"<>]*)"|'([^'<>]*)'|([^\s"'<>=`]+))""")
_NAME_WORDS = re.compile(r"[a-z0-9]+")


def _drop_ads(tree: Any, html: str) -> None:
    """Remove the elements whose class or id words (`AD_WORDS`) mark them as ads: their attribute values
    are found in the page's source `html` and matched by lexbor's selectors (reading each element's
    attributes from Python costs ~2 ms an element); innermost first, so no removed element is touched again."""
    selectors = set()
    for m in _NAMES.finditer(html):
        if m.start() == 0 or html[m.start() - 1] not in " \t\n\r\f\"'/":
            continue  # "data-id", "valid": another attribute
        value = m.group(2) if m.group(2) is not None else m.group(3) if m.group(3) is not None else m.group(4)
        if value.isprintable() and not AD_WORDS.isdisjoint(_NAME_WORDS.findall(value.lower())):
            quoted = value.replace("\\", "\\\\").replace('"', '\\"')
            selectors.add(f'[{m.group(1).lower()}="{quoted}"]')
    if not selectors:
        return
    for el in reversed(tree.document.query_selector_all(", ".join(sorted(selectors)))):
        el.decompose()


def _pre_texts(tree: Any) -> list[str]:
    """The text of each `<pre>` block of the page (outermost blocks, in document order) whose lines are worth
    keeping as they are: its blank lines before its first line and its whitespace after its last line cut,
    blocks of one line left out (tidying only trims their end)."""
    out = []
    for el in tree.document.query_selector_all("pre"):
        text = el.text if el.query_selector("br") is None else _text_with_breaks(el)
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        text = text.rstrip()
        head = len(text) - len(text.lstrip())
        text = text[text.rfind("\n", 0, head) + 1 :]  # from the start of its first non-blank line
        if "\n" in text and not _inside_pre(el):  # a <pre> inside a <pre>: part of the outer one's text
            out.append(text)
    return out


def _text_with_breaks(el: Any) -> str:
    """An element's text with each `<br>` a newline (as the extractor writes it)."""
    from resiliparse.parse.html import NodeType

    parts = []
    for node in el.child_nodes:
        if node.type == NodeType.TEXT:
            parts.append(node.text)
        elif node.type == NodeType.ELEMENT:
            parts.append("\n" if node.tag == "br" else _text_with_breaks(node))
    return "".join(parts)


def _inside_pre(el: Any) -> bool:
    parent = el.parent
    while parent is not None:
        if parent.tag == "pre":
            return True
        parent = parent.parent
    return False


def _tidy_around(text: str, keep: list[str]) -> str:
    """`_tidy(text)`, except that each of `keep` (a `<pre>` block's text, in order) found in `text` is left
    as it is: its blank lines, trailing spaces and tabs are the page's code (PEP 8's two blank lines)."""
    if not keep:
        return _tidy(text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    pieces, pos = [], 0
    for block in keep:
        at = text.find(block, pos)
        if (
            at < 0
        ):  # left out as boilerplate, or extracted otherwise (a <div> a line in it): tidied as the rest is
            continue
        pieces += [_tidy_middle(text[pos:at]), block]
        pos = at + len(block)
    pieces.append(_tidy_middle(text[pos:]))
    return "".join(pieces).rstrip().lstrip("\n")


def _tidy_middle(text: str) -> str:
    """`_tidy` of a part of a text (between `<pre>` blocks): no trailing whitespace on a line, runs of blank
    lines made one, its ends left (the line before a block keeps its end; a block starts on its own line)."""
    text = _LINE_END_SPACE.sub("\n", text[::-1])[::-1]
    return _BLANK_RUN.sub("\n\n", text) if "\n\n\n" in text else text


def _tidy(text: str) -> str:
    """Unix newlines, no trailing whitespace on a line, no leading or trailing blank lines, at most one
    blank line in a row.

    Written for speed (it runs on every page, ~200 lines of a 6 KB text): trailing whitespace is cut by one
    regex over the reversed text, where a line's trailing whitespace follows its newline, so the pattern
    starts with a literal `\\n` and is tried only at newlines (forwards, `[^\\S\\n]+\\n` is tried at every space
    between words, ~6x slower); `\\s` is `str.isspace`, what `str.rstrip()` strips. Runs of blank lines are
    then plain runs of newlines. Splitting into lines, `rstrip` and `join` cost ~3x more."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _LINE_END_SPACE.sub("\n", text[::-1])[::-1].rstrip()  # the last line has no newline after it
    if "\n\n\n" in text:
        text = _BLANK_RUN.sub("\n\n", text)
    return text.lstrip("\n")
