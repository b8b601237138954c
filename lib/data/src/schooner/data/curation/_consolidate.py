"""Consolidation: apply filters and span removals, read from attribute folders, to a source folder.

Filters (`Keep`) are small frozen objects over a record's merged attributes, applied in order: a record
is dropped by the first that rejects it, and counted as `dropped.<filter name>`. Span attributes named in
`remove` are cut out of the kept texts (`removed.<attribute>.spans` / `.chars`); a text left empty is
dropped as `dropped.empty_after_removal`. A dropped record holding the first copy of repeated paragraphs
whose later copies are cut takes them out of the output altogether: the distinct lines a kept record held
(and lost) are counted as `lost.paragraph_dups` by `lost_paragraph_lines`, a second pass run only when a
dropped record held first copies (`paragraph_firsts.dropped`) (compute the paragraph attributes with `duplicates=` the dedup attributes to avoid it). Kept texts are then cleaned (`_clean`: mojibake repaired with ftfy,
counted `cleaned.fixed_text`; soft hyphens, zero-width spaces, word joiners and byte-order marks deleted,
`cleaned.invisible`; unicode spaces, trailing whitespace and runs of blank lines normalised,
`cleaned.whitespace`), each repair on by default and optional; the span attributes attached to a kept record
are moved with the cut and the cleaning (offsets into the written text). A sample of the dropped records of every reason is written
beside the output (`dropped/`), with the reason and their attributes, so a filter can be inspected before
it is trusted (`schooner browse`).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ._clean import clean_text_offsets
from ._offsets import OffsetMap, compose, deletion_map, move_spans
from ._text import remove_spans


class Keep(ABC):
    """A filter over a record's attributes: `keep(attrs) -> bool`; `name` is its drop reason."""

    @property
    @abstractmethod
    def name(self) -> str: ...

    @abstractmethod
    def __call__(self, attrs: dict) -> bool: ...

    def check(self, attrs: dict, loc: Sequence[int] | None) -> bool:
        """Whether the record at `loc` (`[shard, row]` of the source) with `attrs` is kept."""
        return self(attrs)

    def needs(self) -> tuple[str, ...]:
        """The attribute names it reads."""
        return ()


def _get(attrs: dict, key: str, who: str) -> Any:
    if key not in attrs:
        raise KeyError(
            f"{who} needs attribute {key!r}, which the attribute folders do not hold (they hold "
            f"{sorted(attrs)}); add the folder that computes it to `attributes`"
        )
    return attrs[key]


@dataclass(frozen=True)
class LangIs(Keep):
    lang: str
    min_score: float = 0.0

    @property
    def name(self) -> str:
        return f"lang_not_{self.lang}"

    def __call__(self, attrs: dict) -> bool:
        return (
            _get(attrs, "lang", self.name) == self.lang
            and float(attrs.get("lang_score", 0)) >= self.min_score
        )

    def __str__(self) -> str:
        return f"lang_is({self.lang!r}, {self.min_score:g})"

    def needs(self) -> tuple[str, ...]:
        return ("lang", "lang_score")


@dataclass(frozen=True)
class Passes(Keep):
    ruleset: str
    ignore: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.ruleset

    def __call__(self, attrs: dict) -> bool:
        return not [r for r in _get(attrs, self.ruleset, self.name) if r not in self.ignore]

    def __str__(self) -> str:
        return f"passes({self.ruleset!r}" + (f", ignore={list(self.ignore)!r})" if self.ignore else ")")

    def needs(self) -> tuple[str, ...]:
        return (self.ruleset,)


@dataclass(frozen=True)
class ScoreAtLeast(Keep):
    key: str
    threshold: float

    @property
    def name(self) -> str:
        return f"{self.key}_below_threshold"

    def __call__(self, attrs: dict) -> bool:
        return float(_get(attrs, self.key, self.name)) >= self.threshold

    def __str__(self) -> str:
        return f"score_at_least({self.key!r}, {self.threshold:g})"

    def needs(self) -> tuple[str, ...]:
        return (self.key,)


@dataclass(frozen=True)
class TopFraction(Keep):
    """Keep the top `fraction` of the records by score `key`: exactly `round(fraction * n)` (at least one)
    of the `n` scored records that the filters before it keep. `consolidate` resolves it against the scores (`resolve_top_fraction`):
    scores above `threshold` pass; of the records scoring exactly `threshold`, those before `cut` (the
    `(shard, row)` of the first tied record left out; None: all of them), so ties go by input order."""

    key: str
    fraction: float
    threshold: float | None = None
    cut: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ValueError(f"top_fraction needs 0 < fraction <= 1, got fraction={self.fraction}")

    @property
    def name(self) -> str:
        return f"{self.key}_not_top_{self.fraction:g}"

    def __call__(self, attrs: dict) -> bool:
        raise RuntimeError("TopFraction needs the record's place: consolidate calls check(attrs, loc)")

    def check(self, attrs: dict, loc: Sequence[int] | None) -> bool:
        if self.threshold is None:
            raise RuntimeError("TopFraction must be resolved against the scores first (consolidate does)")
        s = float(_get(attrs, self.key, self.name))
        if s != self.threshold or self.cut is None:
            return s >= self.threshold
        if loc is None:
            raise ValueError("TopFraction needs the record's place: read the source with locate=True")
        return tuple(loc) < self.cut

    def __str__(self) -> str:
        return f"top_fraction({self.key!r}, {self.fraction:g})"

    def needs(self) -> tuple[str, ...]:
        return (self.key,)


@dataclass(frozen=True)
class NotFlag(Keep):
    """Drop records whose attribute `key` is truthy (a duplicate mark, contaminated spans)."""

    key: str
    reason: str

    @property
    def name(self) -> str:
        return self.reason

    def __call__(self, attrs: dict) -> bool:
        return not _get(attrs, self.key, self.name)

    def __str__(self) -> str:
        kind = self.key.removesuffix("_dup")
        return f"not_dup({kind!r})" if self.key != kind else "not_contaminated()"

    def needs(self) -> tuple[str, ...]:
        return (self.key,)


def lang_is(lang: str, min_score: float = 0.0) -> Keep:
    """Keep records whose language id is `lang` with a score of at least `min_score` (FineWeb keeps English
    at fastText score >= 0.65)."""
    return LangIs(lang, float(min_score))


def passes(ruleset: str, ignore: Sequence[str] = ()) -> Keep:
    """Keep records that fail no rule of `ruleset` ("gopher_quality", "gopher_repetition", "c4",
    "fineweb"), except the rules named in `ignore`."""
    return Passes(ruleset, tuple(ignore))


def score_at_least(key: str, threshold: float) -> Keep:
    """Keep records whose score attribute `key` is at least `threshold`."""
    return ScoreAtLeast(key, float(threshold))


def top_fraction(key: str, fraction: float) -> Keep:
    """Keep the top `fraction` of records by score attribute `key`."""
    return TopFraction(key, float(fraction))


def not_dup(kind: str = "fuzzy") -> Keep:
    """Drop the records a deduplication marked as duplicates: kind "exact" or "fuzzy" (the kept
    representative of each cluster passes)."""
    if kind not in ("exact", "fuzzy"):
        raise ValueError(f"not_dup(kind={kind!r}): use 'exact' or 'fuzzy'")
    return NotFlag(f"{kind}_dup", f"{kind}_duplicate")


def not_contaminated() -> Keep:
    """Drop whole records with any paragraph flagged by decontamination (instead of removing the spans)."""
    return NotFlag("contaminated", "contaminated")


def resolve_top_fraction(keep: Keep, scored: Sequence[tuple[float, tuple[int, int]]]) -> Keep:
    """A `TopFraction` with its threshold and cut set from the scored records `(score, (shard, row))`:
    the highest scores, ties at the threshold broken by input order (earlier first). Other filters, and
    a `TopFraction` already resolved, come back as they are."""
    if not isinstance(keep, TopFraction) or keep.threshold is not None:
        return keep
    if not scored:
        return ScoreAtLeast(keep.key, float("-inf"))
    ordered = sorted(scored, key=lambda s: (-s[0], s[1]))
    k = max(1, int(round(keep.fraction * len(ordered))))
    threshold = ordered[k - 1][0]
    cut: tuple[int, int] | None = None
    if k < len(ordered) and ordered[k][0] == threshold:
        shard, row = ordered[k][1]
        cut = (shard, row)  # a tuple even where the position arrived as a list
    return dataclasses.replace(keep, threshold=threshold, cut=cut)


@dataclass(frozen=True)
class Consolidator:
    """The per-shard work of `consolidate`: kept records out (mode "kept"), or a sample of the dropped
    ones (mode "dropped", at most `sample` per reason per shard). A kept text is repaired (`fix_text`: ftfy's
    mojibake repair), its invisible characters deleted (`remove_invisible`: soft hyphens, zero-width spaces)
    and its whitespace normalised (`normalize_whitespace`) after its spans are cut out; the span attributes it
    carries (`attach`) are moved with every edit, so they cover the same words in the written text."""

    keep: tuple[Keep, ...]
    remove: tuple[str, ...] = ()
    attach: bool = True
    mode: str = "kept"
    sample: int = 20
    fix_text: bool = True
    normalize_whitespace: bool = True
    remove_invisible: bool = True

    @property
    def __name__(self) -> str:
        return "consolidate" if self.mode == "kept" else "dropped_sample"

    def decide(self, rec: dict) -> tuple[str | None, dict, dict[str, tuple[int, int]]]:
        """`(drop reason or None, attributes, {attribute: (spans, chars) removed})`; a kept record's text is
        cut and cleaned in place, and `removed` then also holds `cleaned.<repair>` for each repair that
        changed it. The attributes of a kept record have their spans moved to the cut and cleaned text."""
        attrs = rec.get("_attrs", {})
        loc = rec.get("_loc")
        for k in self.keep:
            if not k.check(attrs, loc):
                return k.name, attrs, {}
        spans: list[tuple[int, int]] = []
        removed: dict[str, tuple[int, int]] = {}
        for key in self.remove:
            got = [(int(s[0]), int(s[1])) for s in _get(attrs, key, f"remove={key!r}") or []]
            if got:
                spans.extend(got)
                removed[key] = (len(got), sum(e - s for s, e in got))
        track = self.attach and self.mode == "kept"
        moved: OffsetMap | None = None
        if spans:
            if track:
                moved = deletion_map(len(rec["text"]), spans)
            rec["text"] = remove_spans(rec["text"], spans)
            if not rec["text"].strip():
                return "empty_after_removal", attrs, removed
        for name, on in (("fixed_text", self.fix_text), ("invisible", self.remove_invisible),
                         ("whitespace", self.normalize_whitespace)):  # fmt: skip
            if on:
                text, step = clean_text_offsets(
                    rec["text"], fix=name == "fixed_text", invisible=name == "invisible",
                    whitespace=name == "whitespace", offsets=track,
                )  # fmt: skip
                if text != rec["text"]:
                    removed[f"cleaned.{name}"] = (1, len(rec["text"]) - len(text))
                    rec["text"] = text
                    moved = compose(moved, step)
        if not rec["text"].strip():
            return "empty_after_cleaning", attrs, removed
        if moved is not None:
            attrs = move_spans(attrs, moved)
        return None, attrs, removed

    def __call__(self, records: Iterator[dict], counters: dict[str, int]) -> Iterator[dict]:
        seen: dict[str, int] = {}
        for rec in records:
            original = rec["text"]
            reason, attrs, removed = self.decide(rec)
            rec.pop("_attrs", None)
            rec.pop("_loc", None)
            if self.mode == "kept":
                if reason is not None:
                    counters[f"dropped.{reason}"] = counters.get(f"dropped.{reason}", 0) + 1
                    firsts = attrs.get("paragraph_firsts") if "paragraph_dups" in self.remove else 0
                    if firsts:  # its lines' later copies are cut: lost where a kept record holds one (see
                        # `lost_paragraph_lines`, which counts the distinct lines that are)
                        key = "paragraph_firsts.dropped"
                        counters[key] = counters.get(key, 0) + int(firsts)
                    continue
                for key, (n, chars) in removed.items():
                    if key.startswith("cleaned."):  # records changed by the repair, and characters it removed
                        counters[key] = counters.get(key, 0) + n
                        counters[f"{key}.chars"] = counters.get(f"{key}.chars", 0) + chars
                        continue
                    counters[f"removed.{key}.spans"] = counters.get(f"removed.{key}.spans", 0) + n
                    counters[f"removed.{key}.chars"] = counters.get(f"removed.{key}.chars", 0) + chars
                if self.attach:
                    rec["metadata"] = {**rec["metadata"], "attributes": attrs}
                yield rec
            elif reason is not None and seen.get(reason, 0) < self.sample:
                seen[reason] = seen.get(reason, 0) + 1
                rec["text"] = original
                rec["metadata"] = {**rec["metadata"], "drop_reason": reason, "attributes": attrs}
                yield rec


@dataclass(frozen=True)
class _LostLineItems:
    """Per record, the hashes of the lines that decide `lost.paragraph_dups`: a record the filters keep gives
    its repeated lines (`paragraph_dups`, cut from it: `cut`), a dropped one the lines it holds the first
    copy of (its lines not marked as repeats)."""

    keep: tuple[Keep, ...]

    @property
    def __name__(self) -> str:
        return "lost_lines"

    def __call__(self, rec: dict) -> Iterator[dict]:
        from ._exact import _h
        from ._text import line_spans

        attrs = rec.get("_attrs", {})
        text = rec["text"]
        dups = [
            (int(x[0]), int(x[1])) for x in _get(attrs, "paragraph_dups", "remove='paragraph_dups'") or []
        ]
        if all(k.check(attrs, rec.get("_loc")) for k in self.keep):
            for start, end in dups:
                yield {"k": _h(text[start:end].strip()), "cut": True}
        elif attrs.get("paragraph_firsts"):
            marked = set(dups)
            for start, end, line in line_spans(text):
                if (start, end) not in marked and line.strip():
                    yield {"k": _h(line.strip()), "cut": False}


def _lost_groups(key: Any, items: list[dict]) -> list[dict]:
    # lost: its first copy is in a dropped record and a kept record's copy is cut (so is every kept copy)
    cut = any(it["cut"] for it in items)
    return [{"lost": 1}] if cut and not all(it["cut"] for it in items) else []


def lost_paragraph_lines(records: Any, keep: Sequence[Keep]) -> int:
    """How many distinct lines `remove=["paragraph_dups"]` takes out of the output altogether: lines whose
    first copy is in a record the filters `keep` drop and whose every copy in the kept records is cut (a
    line only in dropped records went with them, and is not counted). `records`: the `with_attributes`
    dataset consolidate reads (located)."""
    groups = records.flat_map(_LostLineItems(tuple(keep)), name="lost_lines").group_by(
        "k", _lost_groups, name="lost_line_groups"
    )
    return sum(1 for _ in groups.iter_records(progress=False))
