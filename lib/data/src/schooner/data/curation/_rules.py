"""Heuristic quality rules: Gopher quality and repetition, C4, FineWeb. Each rule set is a frozen config
with the paper's thresholds as defaults; `check(text)` returns the names of every rule the text fails
(empty: it passes), so the step record can count drops per rule.

Sources (thresholds and formulas as datatrove 0.10 implements them; `tests/test_rules_datatrove.py` checks
every decision against datatrove's own filters on fixed texts):
- Gopher quality and repetition: Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights
  from Training Gopher", appendix A1 and table A1.
- C4: Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
  Transformer", section 2.2, plus the line rules of its reference code (policy lines, long words).
- FineWeb: Penedo et al. 2024, "The FineWeb Datasets", section 3.3 (custom filters).
Words and sentences are split as datatrove splits English (spaCy's blank English tokenizer and sentencizer,
ported in `_words.py`). One deliberate difference: the repetition and FineWeb rules read `\r\n` and lone `\r`
line endings as `\n` (datatrove does not, and drops a Windows document for lines "without punctuation").
"""

from __future__ import annotations

import collections
import itertools
import re
from collections import Counter
from dataclasses import dataclass, field

from ._words import punctuation, sentence_count, spacy_words, terminal_punctuation

STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
"""Gopher's stop words: a document needs at least two of them."""
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
"""C4's policy phrases: lines holding one are removed."""
_CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
_TERMINAL = (".", "?", "!", '"', "'")
_LINE_BREAK = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
"""What `str.splitlines` splits on (C4's line rules split with it)."""
_LINES = re.compile("\n+")


def _unix_newlines(text: str) -> str:
    """`text` with `\r\n` and lone `\r` line endings as `\n`: the rules that split lines on `\n` judge a
    Windows document as its `\n` copy (lines ending in `\r` ended in no punctuation; its blank lines, `\r`,
    were repeated lines)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _dups(items: list[str]) -> tuple[int, int]:
    seen: set[str] = set()
    n = chars = 0
    for x in items:
        if x in seen:
            n += 1
            chars += len(x)
        else:
            seen.add(x)
    return n, chars


@dataclass(frozen=True)
class GopherQuality:
    """Gopher quality rules (Rae et al. 2021, A1)."""

    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3
    max_mean_word_length: float = 10
    max_symbol_word_ratio: float = 0.1
    """Hashes, and ellipses, per word."""
    max_bullet_lines: float = 0.9
    """Lines starting with "•" or "-"."""
    max_ellipsis_lines: float = 0.3
    min_alpha_words: float = 0.8
    """Fraction of all tokens (punctuation tokens included) holding an alphabetic character."""
    min_stop_words: int = 2
    """Distinct stop words the text must hold (matched case-sensitively, as datatrove does)."""
    stop_words: tuple[str, ...] = STOP_WORDS

    def check(self, text: str) -> list[str]:
        toks = spacy_words(text)
        punct = punctuation()
        ws = [w for w in toks if any(ch not in punct for ch in w)]  # symbols (only punctuation) left out
        n = len(ws)
        failed: list[str] = []
        if n < self.min_words:
            failed.append("too_few_words")
        if n > self.max_words:
            failed.append("too_many_words")
        if n == 0:
            return failed + ["no_alpha_words"]
        mean = sum(map(len, ws)) / n
        if not self.min_mean_word_length <= mean <= self.max_mean_word_length:
            failed.append("mean_word_length")
        n_all = len(toks)  # the symbol ratios and the alphabetic ratio count every token, as datatrove does
        if text.count("#") / n_all > self.max_symbol_word_ratio:
            failed.append("hash_ratio")
        if (text.count("...") + text.count("…")) / n_all > self.max_symbol_word_ratio:
            failed.append("ellipsis_ratio")
        lines = text.splitlines() or [""]
        if sum(ln.lstrip().startswith(("•", "-")) for ln in lines) / len(lines) > self.max_bullet_lines:
            failed.append("bullet_lines")
        if sum(ln.rstrip().endswith(("...", "…")) for ln in lines) / len(lines) > self.max_ellipsis_lines:
            failed.append("ellipsis_lines")
        if sum(any(c.isalpha() for c in w) for w in toks) / n_all < self.min_alpha_words:
            failed.append("alpha_words")
        if len(set(self.stop_words).intersection(toks)) < self.min_stop_words:
            failed.append("stop_words")
        return failed


@dataclass(frozen=True)
class GopherRepetition:
    """Gopher repetition rules (Rae et al. 2021, table A1)."""

    dup_line_frac: float = 0.30
    dup_para_frac: float = 0.30
    dup_line_char_frac: float = 0.20
    dup_para_char_frac: float = 0.20
    top_ngrams: tuple[tuple[int, float], ...] = ((2, 0.20), (3, 0.18), (4, 0.16))
    """(n, most frequent n-gram's character fraction)."""
    dup_ngrams: tuple[tuple[int, float], ...] = (
        (5, 0.15),
        (6, 0.14),
        (7, 0.13),
        (8, 0.12),
        (9, 0.11),
        (10, 0.10),
    )
    """(n, duplicated n-grams' character fraction)."""

    def check(self, text: str) -> list[str]:
        text = _unix_newlines(text)
        if not text:
            return ["empty"]
        failed: list[str] = []
        size = len(text)
        paras = re.split(r"\n{2,}", text.strip())
        n, chars = _dups(paras)
        if n / len(paras) > self.dup_para_frac:
            failed.append("dup_para_frac")
        if chars / size > self.dup_para_char_frac:
            failed.append("dup_para_char_frac")
        # lines split on runs of newlines, as datatrove does: blank lines are not repeated lines
        lines = _LINES.split(text)
        n, chars = _dups(lines)
        if n / len(lines) > self.dup_line_frac:
            failed.append("dup_line_frac")
        if chars / size > self.dup_line_char_frac:
            failed.append("dup_line_char_frac")
        ws = spacy_words(text)
        for k, frac in self.top_ngrams:
            if len(ws) >= k:  # n-grams built and counted in C (a 4 MB page's 700k words: seconds, not tens)
                gram, count = Counter(map(" ".join, _shifted(ws, k))).most_common(1)[0]
                if len(gram) * count / size > frac:
                    failed.append(f"top_{k}_gram")
        for k, frac in self.dup_ngrams:
            if _dup_ngram_chars(ws, k) / size > frac:
                failed.append(f"dup_{k}_grams")
        return failed


def _shifted(ws: list[str], k: int) -> zip:
    """The `k`-grams of `ws` as tuples, lazily."""
    return zip(*(itertools.islice(ws, i, None) for i in range(k)))


def _dup_ngram_chars(ws: list[str], k: int) -> int:
    """Characters of the words (spaces not counted, as datatrove counts them) in repeated `k`-grams, each
    repeat skipped whole (the `k`-grams after it are not looked at)."""
    seen: set[str] = set()
    chars = 0
    grams = map("".join, _shifted(ws, k))
    for g in grams:
        if g in seen:
            chars += len(g)
            collections.deque(itertools.islice(grams, k - 1), maxlen=0)  # skip the rest of the repeat
        else:
            seen.add(g)
    return chars


@dataclass(frozen=True)
class C4Rules:
    """C4's rules (Raffel et al. 2020): line rules remove lines (spans), page rules drop the page. As in C4's
    reference code, "lorem ipsum" and a curly bracket drop the page when they are in a line the line rules
    keep; bad words anywhere in the page."""

    min_words_per_line: int = 3
    max_word_length: int = 1000
    min_sentences: int = 5
    terminal_punctuation: bool = True
    javascript_lines: bool = True
    policy_lines: bool = True
    lorem_ipsum: bool = True
    curly_bracket: bool = True
    bad_words: tuple[str, ...] = field(default=())
    """Optional list of bad words (the LDNOOBW list C4 used is not bundled: pass your own)."""

    def check_lines(self, text: str) -> tuple[list[str], list[list]]:
        """(page rules failed, line spans removed `[start, end, rule]`)."""
        failed: list[str] = []
        spans: list[list] = []
        sentences = 0
        lorem = curly = False
        for start, end, line in _c4_lines(text):
            ws = line.split()  # before citations are removed, as datatrove counts them
            if not ws:
                continue
            ln = _CITATION.sub("", line.strip())
            low = ln.lower()
            rule = None
            if any(len(w) > self.max_word_length for w in ws):
                rule = "long_word"
            elif self.terminal_punctuation and (not ln.endswith(_TERMINAL) or ln.endswith("...")):
                rule = "no_terminal_punctuation"
            elif len(ws) < self.min_words_per_line:
                rule = "too_few_words"
            # as C4's reference code (TFDS c4_utils.clean_page) and datatrove: "lorem ipsum" and "{" drop the
            # page only in a line the rules above keep (a code line without terminal punctuation goes alone)
            elif self.lorem_ipsum and "lorem ipsum" in low:
                lorem = True
                continue
            elif self.javascript_lines and "javascript" in low:
                rule = "javascript"
            elif self.curly_bracket and "{" in ln:
                curly = True
                continue
            elif self.policy_lines and any(p in low for p in POLICY):
                rule = "policy"
            if rule:
                spans.append([start, end, rule])
            else:
                sentences += sentence_count(ln)
        if lorem:
            failed.append("lorem_ipsum")
        if curly:
            failed.append("curly_bracket")
        if self.bad_words:
            bad = re.compile(r"(?:\W|^)(" + "|".join(map(re.escape, self.bad_words)) + r")(?:\W|$)")
            if bad.search(text.lower()):
                failed.append("bad_words")
        if sentences < self.min_sentences:
            failed.append("too_few_sentences")
        return failed, spans

    def check(self, text: str) -> list[str]:
        return self.check_lines(text)[0]


def _c4_lines(text: str) -> list[tuple[int, int, str]]:
    """`(start, end, line)` of the lines `str.splitlines` gives (C4 and datatrove split with it); `end`
    includes the line break, so removing the span keeps the rest of the text's structure."""
    out = []
    start = 0
    for m in _LINE_BREAK.finditer(text):
        out.append((start, m.end(), text[start : m.start()]))
        start = m.end()
    if start < len(text):
        out.append((start, len(text), text[start:]))
    return out


@dataclass(frozen=True)
class FineWebRules:
    """FineWeb's additional rules (Penedo et al. 2024, 3.3)."""

    line_punct_thr: float = 0.12
    """Drop when less than this fraction of the non-blank lines ends in terminal punctuation."""
    line_punct_exclude_zero: bool = False
    short_line_thr: float = 0.67
    """Drop when more than this fraction of the non-blank lines is short."""
    short_line_length: int = 30
    char_duplicates_ratio: float = 0.01
    """Drop when more than this fraction of the characters (newlines aside) sits in repeated lines."""
    new_line_ratio: float = 0.3
    """Drop when newlines per word exceed this (list-like pages)."""

    def check(self, text: str) -> list[str]:
        text = _unix_newlines(text)
        lines = [ln for ln in text.split("\n") if ln.strip()]  # blank lines are no lines (datatrove)
        if not lines:
            return ["empty"]
        failed: list[str] = []
        ratio = sum(ln.endswith(terminal_punctuation()) for ln in lines) / len(lines)
        if ratio < self.line_punct_thr and not (ratio == 0 and self.line_punct_exclude_zero):
            failed.append("line_punct_ratio")
        if sum(len(ln) <= self.short_line_length for ln in lines) / len(lines) > self.short_line_thr:
            failed.append("short_line_ratio")
        if _dups(lines)[1] / len(text.replace("\n", "")) > self.char_duplicates_ratio:
            failed.append("char_dup_ratio")
        if text.count("\n") / max(1, len(spacy_words(text))) > self.new_line_ratio:
            failed.append("list_ratio")
        return failed


RULE_SETS = {"gopher_quality": GopherQuality, "gopher_repetition": GopherRepetition, "c4": C4Rules,
             "fineweb": FineWebRules}  # fmt: skip
"""Rule set names `quality_rules` knows, and their configs."""


@dataclass(frozen=True)
class RuleAttributes:
    """Per record: for each rule set, the list of rules failed (and `c4_lines`, C4's removed line spans)."""

    rulesets: tuple[tuple[str, object], ...]

    @property
    def __name__(self) -> str:
        return "quality_rules"

    def __call__(self, rec: dict) -> dict:
        text = rec["text"]
        out: dict = {}
        for name, rules in self.rulesets:
            if isinstance(rules, C4Rules):
                out[name], out[f"{name}_lines"] = rules.check_lines(text)
            else:
                out[name] = rules.check(text)  # type: ignore[attr-defined]
        return out
