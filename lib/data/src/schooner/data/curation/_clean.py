"""Clean text: mojibake repaired (ftfy) and whitespace normalised, what `consolidate` does to the text it keeps.

Extracted pages keep the no-break spaces of `&nbsp;` (10.3% of the characters of the tutorial crawl's clean
text) and other unicode spaces, and cutting spans out (repeated paragraphs, contamination) leaves runs of
empty lines (up to 22 in a row there). `normalize_whitespace` makes every unicode space a plain space, every
line break `\\n`, strips each line's trailing whitespace and keeps at most one blank line in a row. `fix_text`
repairs text decoded with the wrong codec (UTF-8 read as windows-1252 or latin-1: "cafÃ©" for "café") with
ftfy (Speer, "ftfy", 2019), the repair C4, Dolma and FineWeb apply; ftfy is imported only here.
`remove_invisible` deletes the invisible characters pages put inside words (soft hyphens from `&shy;`,
zero-width spaces, word joiners, byte-order marks), which split a word in two for every later reader.
`clean_text_offsets` also says where each character went, so spans on the source text follow the cleaning.
"""

from __future__ import annotations

from typing import Any

from ._html import _tidy
from ._offsets import OffsetMap, compose, subsequence_map, substitution_map

# str.splitlines' line breaks besides \n and \r (which `_tidy` handles): vertical tab, form feed, the file,
# group and record separators, NEL, the line and paragraph separators
_LINE_BREAKS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


# Unicode's space separators (category Zs) besides " ": no-break, ogham, en quad to hair space, narrow
# no-break, medium mathematical, ideographic (a test checks the list against `unicodedata`)
UNICODE_SPACES = "\u00a0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u202f\u205f\u3000"
_SPACE_TABLE = {**{ord(c): " " for c in UNICODE_SPACES}, **{ord(c): "\n" for c in _LINE_BREAKS}}


def normalize_whitespace(text: str) -> str:
    """`text` with unicode spaces (U+00A0 no-break, U+2009 thin, U+3000 ideographic, every category Zs
    character) as plain spaces, line breaks (`\\r\\n`, `\\r`, U+2028, ... as `str.splitlines` sees them) as
    `\\n`, no trailing whitespace on a line, at most one blank line in a row and none at the start or end.
    A line's leading whitespace (code's indentation) and the spaces between words are kept.

    >>> normalize_whitespace("a\\u00a0b  \\n\\n\\n\\nc\\u2009d\\n")
    'a b\\n\\nc d'
    """
    if "\r" in text:  # before the other breaks become "\n": "\r" + U+2028 is two line breaks, not a "\r\n"
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _tidy(text.translate(_SPACE_TABLE))


FTFY_OPTIONS: dict[str, Any] = {
    "unescape_html": False,  # extraction already unescaped; a literal "&amp;" in a page about HTML stays
    "uncurl_quotes": False,  # curly quotes are text, not damage
    "fix_character_width": False,  # full-width forms are text (CJK), not damage
    "fix_latin_ligatures": False,
}
"""ftfy's options besides its defaults: mojibake, C1 controls, surrogates, terminal escapes, control characters
and line breaks are repaired, NFC applied; quotes, character widths, ligatures and HTML entities are left."""


def fix_text(text: str) -> str:
    """`text` with mojibake repaired (UTF-8 decoded as windows-1252 or latin-1, possibly several times) and
    control characters, surrogates and terminal escapes removed, by ftfy's `fix_text` with `FTFY_OPTIONS`.

    >>> fix_text("The caf\\u00c3\\u00a9 is open")
    'The café is open'
    """
    try:
        import ftfy
    except ImportError as e:  # pragma: no cover - a core install without the curation extra
        raise ImportError("fix_text needs ftfy: pip install 'schooner-data[curation]'") from e
    return ftfy.fix_text(text, **FTFY_OPTIONS)


INVISIBLE = "\u00ad\u200b\u2060\u2061\u2062\u2063\u2064\ufeff"
"""What `remove_invisible` deletes: soft hyphen, zero-width space, word joiner, the invisible mathematical
operators and the zero-width no-break space (byte-order mark). Left in: the zero-width joiner and non-joiner
(emoji sequences, Indic conjuncts, Persian words) and direction marks, which change how text reads."""
_INVISIBLE_TABLE = dict.fromkeys(map(ord, INVISIBLE))


def remove_invisible(text: str) -> str:
    """`text` without its soft hyphens, zero-width spaces, word joiners and byte-order marks (`INVISIBLE`).

    >>> remove_invisible("co\u00adoper\u200bation")
    'cooperation'
    """
    return text.translate(_INVISIBLE_TABLE)


def clean_text(text: str, *, fix: bool = True, whitespace: bool = True, invisible: bool = True) -> str:
    """`text` repaired (`fix_text`, when `fix`), its invisible characters deleted (`remove_invisible`, when
    `invisible`; after the repair, which reads a soft hyphen as the second byte of mojibake "Ã\u00ad" for
    "í"), then its whitespace normalised (`normalize_whitespace`, when `whitespace`)."""
    return clean_text_offsets(text, fix=fix, whitespace=whitespace, invisible=invisible, offsets=False)[0]


# normalize_whitespace's replacements, one character for one (its other edits delete characters)
_ONE_FOR_ONE = {**_SPACE_TABLE, ord("\r"): "\n"}


def clean_text_offsets(
    text: str, *, fix: bool = True, whitespace: bool = True, invisible: bool = True, offsets: bool = True
) -> tuple[str, OffsetMap | None]:
    """`clean_text(text)` and, when `offsets` and the text changed, the map of each of its positions to the
    cleaned text's (`_offsets`: a deleted character maps to the next kept one), so spans follow the
    cleaning."""
    moved: OffsetMap | None = None
    if fix:
        fixed = fix_text(text)
        if offsets and fixed != text:
            moved = substitution_map(text, fixed)
        text = fixed
    if invisible:
        seen = remove_invisible(text)
        if offsets and seen != text:
            moved = compose(moved, subsequence_map(text, seen))
        text = seen
    if whitespace:
        tidy = normalize_whitespace(text)
        if offsets and tidy != text:
            moved = compose(moved, subsequence_map(text.translate(_ONE_FOR_ONE), tidy))
        text = tidy
    return text, moved
