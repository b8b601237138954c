"""Text units shared by the curation operators: lines (paragraphs) with their character spans, and
the normalisation n-gram matching uses."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

_NORM_WORD = re.compile(r"\w+", re.UNICODE)


def line_spans(text: str) -> Iterator[tuple[int, int, str]]:
    """`(start, end, line)` of every line; `end` includes the line's newline, so removing the span keeps
    the rest of the document's structure."""
    start = 0
    n = len(text)
    while start < n:
        nl = text.find("\n", start)
        end = n if nl < 0 else nl + 1
        yield start, end, text[start : (end if nl < 0 else nl)]
        start = end


# Unicode's format characters (category Cf, Unicode 14: U+00AD soft hyphen, U+200B-U+200D zero-width space and
# joiners, U+2060 word joiner, U+FEFF byte-order mark, direction marks, ...; a test checks the list against
# `unicodedata`): invisible, they split a word in two
FORMAT_CHARS = re.compile(
    "[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064"
    "\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]"
)


WORDS_RULE = "cf-deleted nfkc-casefold-nfkc \\w+; u200b both ways, whole items"
"""Names the rule of `normalized_words` (and what an index stores: the n-grams of both readings of a
zero-width space, each item's n-gram count); a decontamination index records it (one built by another rule is
refused)."""

ZERO_WIDTH_SPACE = "\u200b"
"""Read two ways by decontamination: inside a word (a line-break point: deleted) and between words (in place
of a space: a space)."""


def normalized_words(text: str, *, zero_width_space: str = "") -> list[str]:
    """The words decontamination n-grams compare (rule `WORDS_RULE`): the text's format characters (category
    Cf: soft hyphens, zero-width spaces and joiners, word joiners, byte-order marks; invisible, they would
    split a word in two) deleted, then NFKC, full case folding (`str.casefold`: "Straße" and "STRASSE" are
    both "strasse"; `lower` kept "ß") and NFKC again (Unicode's compatibility caseless match), then its runs
    of word characters (`\\w+`: punctuation and spaces dropped). `zero_width_space=" "` reads U+200B as a
    space instead (words joined by zero-width spaces)."""
    if zero_width_space and ZERO_WIDTH_SPACE in text:
        text = text.replace(ZERO_WIDTH_SPACE, zero_width_space)
    text = unicodedata.normalize("NFKC", FORMAT_CHARS.sub("", text))
    return _NORM_WORD.findall(unicodedata.normalize("NFKC", text.casefold()))


def remove_spans(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` without the characters of `spans` (`[start, end)` pairs, may overlap, any order)."""
    if not spans:
        return text
    merged: list[list[int]] = []
    for s, e in sorted((max(0, int(s)), min(len(text), int(e))) for s, e in spans):
        if e <= s:
            continue
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    out, pos = [], 0
    for s, e in merged:
        out.append(text[pos:s])
        pos = e
    out.append(text[pos:])
    return "".join(out)
