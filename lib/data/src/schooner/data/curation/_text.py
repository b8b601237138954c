"""Text units shared by the curation operators: words, lines (paragraphs) with their character spans, and
the normalisation n-gram matching uses."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

_WORD = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]", re.UNICODE)
_NORM_WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> list[str]:
    """Word and punctuation tokens (a regex stand-in for NLTK's `word_tokenize`, which datatrove uses:
    runs of word characters with inner apostrophes, and each punctuation character on its own)."""
    return _WORD.findall(text)


def is_punct(token: str) -> bool:
    """Whether a token of `words` is a single punctuation character."""
    return len(token) == 1 and not token.isalnum() and not token.isspace()


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


def normalized_words(text: str) -> list[str]:
    """Lower-cased words without punctuation, NFKC-normalised (what decontamination n-grams compare)."""
    return _NORM_WORD.findall(unicodedata.normalize("NFKC", text).lower())


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
