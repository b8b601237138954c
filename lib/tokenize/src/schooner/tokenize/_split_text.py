"""Cutting very long documents into pieces that encode to exactly the tokens of the whole document.

Encoding a 53 MB document in one call holds every token's `Encoding` entry (ids, offsets, token strings:
about 250 bytes a token) at once, gigabytes for tens of millions of tokens. Pieces of `piece_chars`
characters, cut at whitespace, bound that. A cut at position p is exact when the tokenizer's token
boundaries there do not depend on what lies beyond the cut, which holds for every pre-tokenizer that
splits text into words with a bounded look-around (GPT-2, Llama 3, Whitespace, Bert, Metaspace without
prepending, digit splitting), normalizers that work per character, and any model on top of them.

Each cut is therefore checked, not assumed: around a candidate position p (the last whitespace character
before a non-whitespace one), the text `CHECK_CHARS` characters to each side (the left side widened to
the start of the white-space run ending at p) must satisfy
`encode(left + right) == encode(left) + encode(right)`. A candidate that fails is skipped for an earlier
or later one. Where a tokenizer fails the check everywhere (one that prepends a space or `▁` to every
sequence, strips whitespace at the ends, or whose tokens span whitespace), no cut is found and the
document is encoded whole: exact, but without the memory bound; `split_report` counts such documents.
"""

from __future__ import annotations

import re
from collections.abc import Callable

CHECK_CHARS = 256
"""Characters on each side of a cut that its check encodes."""

_CANDIDATE = re.compile(r"\s(?=\S)")


MAX_RUN_CHARS = 64 * CHECK_CHARS
"""A cut after a longer run of white space is not used (checking it would encode the whole run)."""


def cut_is_exact(encode: Callable[[str], list[int]], text: str, p: int) -> bool:
    """Whether encoding `text[:p]` and `text[p:]` separately gives the tokens of the two together, judged
    on the `CHECK_CHARS` characters around `p`, the left side widened to hold the whole run of white space
    that ends at `p` (and `CHECK_CHARS` before it): how that run is tokenized can depend on where it starts
    (an added token with rstrip before it takes all of it; added white-space tokens pair it up from its
    start), so a window starting inside it could pass a cut that is wrong. A run longer than
    `MAX_RUN_CHARS` fails the check."""
    run = p
    while run > 0 and text[run - 1].isspace():
        run -= 1
        if p - run > MAX_RUN_CHARS:
            return False
    left, right = text[max(0, run - CHECK_CHARS) : p], text[p : p + CHECK_CHARS]
    return encode(left + right) == encode(left) + encode(right)


def find_cut(
    encode: Callable[[str], list[int]], text: str, lo: int, hi: int, *, last: bool = True, tries: int = 8
) -> int | None:
    """The last (or first) exact cut in `text[lo:hi]`, checking at most `tries` candidates; or None."""
    candidates = [m.start() for m in _CANDIDATE.finditer(text, lo, hi)]
    order = reversed(candidates[-tries:]) if last else candidates[:tries]
    for p in order:
        if p > 0 and cut_is_exact(encode, text, p):
            return p
    return None


def split_for_encoding(
    encode: Callable[[str], list[int]], text: str, piece_chars: int
) -> tuple[list[str], bool]:
    """`text` in pieces of at most about `piece_chars` characters whose encodings concatenate to the
    encoding of `text`; returns (pieces, whether the whole stretch could be cut as asked).

    A piece is cut at the last exact cut in its second half; when there is none, the search goes on in
    the following `4 * piece_chars` characters, and failing that the rest of the text is one piece.
    """
    if len(text) <= piece_chars:
        return [text], True
    pieces: list[str] = []
    start = 0
    complete = True
    while len(text) - start > piece_chars:
        cut = find_cut(encode, text, start + piece_chars // 2, start + piece_chars)
        if cut is None:
            end = min(len(text), start + 5 * piece_chars)
            cut = find_cut(encode, text, start + piece_chars, end, last=False, tries=32)
        if cut is None or cut <= start:
            complete = False
            break
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces, complete
