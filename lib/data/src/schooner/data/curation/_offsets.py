"""Character offsets through text edits: a map from each position of a text before an edit to the position
in the text after it, so spans computed on the source text (attributes) still cover the same words in the
text `consolidate` writes (cut, repaired, cleaned).

A map is a list of `len(before) + 1` positions in `after`; a deleted character maps to the position of the
next kept one, so a span `[s, e)` becomes `[m[s], m[e])`, empty when all of it was deleted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

OffsetMap = list[int]


def deletion_map(n: int, spans: Sequence[tuple[int, int]]) -> OffsetMap:
    """The map of `remove_spans(text, spans)` for a text of `n` characters (spans may overlap)."""
    gone = bytearray(n + 1)
    for s, e in spans:
        s, e = max(0, int(s)), min(n, int(e))
        if e > s:
            gone[s:e] = b"\x01" * (e - s)
    out, j = [0] * (n + 1), 0
    for i in range(n + 1):
        out[i] = j
        j += not gone[i]
    return out


def subsequence_map(before: str, after: str) -> OffsetMap:
    """The map of an edit that only deletes characters (`after` is a subsequence of `before`): each
    character of `after` matched to the first equal character of `before` left. Where a deleted character
    equals the next kept one (whitespace: a trailing space, an extra blank line) either may be taken; the
    text around is mapped the same."""
    out, j, n = [0] * (len(before) + 1), 0, len(after)
    for i, ch in enumerate(before):
        out[i] = j
        if j < n and after[j] == ch:
            j += 1
    if j != n:
        raise AssertionError(f"the cleaned text is not the text with characters deleted ({j} of {n} matched)")
    out[len(before)] = j
    return out


_SYNC = 4
"""Characters that must agree to resume after a substitution."""
_REACH = 48
"""How far (in each text) a substitution may reach."""


def substitution_map(before: str, after: str) -> OffsetMap:
    """The map of an edit that replaces short runs of characters with others (ftfy's repairs: "Ã©" for "é",
    a line break made `\\n`): equal characters are matched in order; at a difference, the nearest point
    (fewest characters skipped in both) where `_SYNC` characters (or both ends) agree again closes the
    substitution, whose characters all map to its start. Linear in the text for local repairs."""
    out, i, j, na, nb = [0] * (len(before) + 1), 0, 0, len(before), len(after)
    while i < na:
        if j < nb and before[i] == after[j]:
            out[i] = j
            i, j = i + 1, j + 1
            continue
        ii, jj = _resync(before, after, i, j)
        for k in range(i, ii):
            out[k] = j
        i, j = ii, jj
    out[na] = nb
    return out


def _resync(a: str, b: str, i: int, j: int) -> tuple[int, int]:
    na, nb = len(a), len(b)
    for d in range(1, 2 * _REACH + 1):
        for di in range(max(0, d - _REACH), min(d, _REACH) + 1):
            ii, jj = i + di, j + d - di
            if ii > na or jj > nb:
                continue
            ta, tb = a[ii : ii + _SYNC], b[jj : jj + _SYNC]
            if ta == tb and (len(ta) == _SYNC or (ii + len(ta) == na and jj + len(tb) == nb)):
                return ii, jj
    return na, nb  # no agreement within reach: the rest is one substitution


def compose(first: OffsetMap | None, then: OffsetMap | None) -> OffsetMap | None:
    """The map of `first`'s edit followed by `then`'s (None: no edit)."""
    if first is None:
        return then
    if then is None:
        return first
    return [then[p] for p in first]


def is_spans(value: Any) -> bool:
    """Whether an attribute value is spans, `[[start, end, ...], ...]` (a non-empty list of lists whose
    first two items are integer offsets)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(x, (list, tuple))
            and len(x) >= 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in x[:2])
            for x in value
        )
    )


def move_spans(attrs: dict, offsets: OffsetMap) -> dict:
    """`attrs` with every spans attribute moved by `offsets` (what follows start and end kept); spans left
    empty (their text deleted) are dropped. Other attributes are returned as they are."""
    out = {}
    last = len(offsets) - 1
    for key, value in attrs.items():
        if is_spans(value):
            moved = []
            for span in value:
                s, e = offsets[min(max(span[0], 0), last)], offsets[min(max(span[1], 0), last)]
                if e > s:
                    moved.append([s, e, *span[2:]])
            value = moved
        out[key] = value
    return out
