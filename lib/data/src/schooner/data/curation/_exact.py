"""Exact deduplication as attributes, on the disk shuffle.

- Documents: records with the same text (blake2b of its bytes); all but the first in input order get
  `exact_dup` (with `exact_dup_of`, the kept record's id, and `exact_group_size`).
- Paragraphs (lines, as Dolma and Marin split them): a non-blank line seen before, anywhere in the
  corpus, is marked for removal in every later record (`paragraph_dups`, spans `[start, end]` that include
  the line's newline, so removing them keeps the rest of the document's structure). Lines shorter than
  `min_chars` (after stripping) are never marked. `paragraph_firsts` counts the lines of a record whose
  later copies (in other records) are marked: if that record is dropped, those of them that a kept record
  holds are gone from the output, which `consolidate` counts as `lost.paragraph_dups` (distinct lines). Records that document dedup drops (pass its
  attribute folders as `duplicates`) take no part, so the kept member of a cluster keeps its text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from schooner.data import storage
from schooner.data._dataset import Dataset

from ._marks import loc_key, write_marks_as_attributes
from ._text import line_spans

EXACT_DEFAULTS = {"exact_dup": False, "exact_dup_of": None, "exact_group_size": 1}
PARAGRAPH_DEFAULTS: dict[str, Any] = {"paragraph_dups": [], "paragraph_firsts": 0}
DUP_FLAGS = ("exact_dup", "fuzzy_dup")
"""The attributes of document dedup that mark a record as a duplicate (dropped by `not_dup`)."""


def _h(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _doc_item(rec: dict) -> dict:
    return {"k": _h(rec["text"]), "l": rec["_loc"], "id": rec["id"]}


def _doc_groups(key: Any, items: list[dict]) -> list[dict]:
    if len(items) < 2:
        return []
    first = items[0]
    return [{"l": it["l"], "exact_dup": True, "exact_dup_of": first["id"], "exact_group_size": len(items)}
            for it in items[1:]] + [{"l": first["l"], "exact_dup": False, "exact_dup_of": None,
                                     "exact_group_size": len(items)}]  # fmt: skip


@dataclass(frozen=True)
class ParagraphItems:
    min_chars: int = 1

    @property
    def __name__(self) -> str:
        return "paragraph_items"

    def __call__(self, rec: dict) -> Iterator[dict]:
        attrs = rec.get("_attrs")
        if attrs and any(attrs.get(k) for k in DUP_FLAGS):
            return  # a duplicate document dedup drops: its lines are no one's first copy
        for start, end, line in line_spans(rec["text"]):
            s = line.strip()
            if len(s) >= max(self.min_chars, 1):
                yield {"k": _h(s), "l": rec["_loc"], "s": start, "e": end}


def _paragraph_groups(key: Any, items: list[dict]) -> list[dict]:
    # items arrive in input order; within one record, in text order
    if len(items) < 2:
        return []
    first = items[0]
    if any(it["l"] != first["l"] for it in items[1:]):  # copies in other records: the first is needed
        return [*items[1:], {"l": first["l"], "first": True}]
    return items[1:]


def exact_dedup_attributes(source: str, output: str, *, work: str, **execution: Any) -> dict[str, Any]:
    """Exact document duplicates of `source` as attribute folder `output`; returns counters."""
    storage.makedirs(work)
    base = Dataset.from_files(source, split_row_groups=False, locate=True)
    groups = base.map(_doc_item, name="text_hash").group_by("k", _doc_groups, name="exact_groups")
    marks = {loc_key(m.pop("l")): m for m in groups.iter_records(**execution)}
    manifest = write_marks_as_attributes(
        source, output, marks, EXACT_DEFAULTS, name="exact", work=work, **execution
    )
    dups = sum(1 for m in marks.values() if m["exact_dup"])
    return {"documents": manifest["records"], "duplicates": dups,
            "groups": sum(1 for m in marks.values() if not m["exact_dup"]), "counters": manifest["counters"]}  # fmt: skip


def paragraph_dedup_attributes(
    source: str, output: str, *, min_chars: int = 1, work: str, duplicates: Sequence[str] = (),
    **execution: Any,
) -> dict[str, Any]:  # fmt: skip
    """Repeated paragraphs (lines) of `source` as span attributes in folder `output`; returns counters.

    `duplicates`: attribute folders of document dedup of `source` (`exact_dedup_attributes`,
    `fuzzy_dedup_attributes`). The records they mark as duplicates take no part: their lines are neither
    marked nor count as seen, so when `consolidate` drops them with `not_dup` and cuts `paragraph_dups`, the
    kept member of each cluster keeps the paragraphs it shares with them (without it, a paragraph whose first
    copy is in a dropped record is cut from every record that keeps a copy, and is lost).
    """
    from ._attributes import with_attributes

    storage.makedirs(work)
    for folder in duplicates:
        _check_dedup_folder(folder)
    if duplicates:
        base = with_attributes(source, list(duplicates), locate=True)
    else:
        base = Dataset.from_files(source, split_row_groups=False, locate=True)
    repeats = base.flat_map(ParagraphItems(min_chars), name="paragraphs").group_by(
        "k", _paragraph_groups, name="paragraph_groups"
    )
    marks: dict[str, dict] = {}
    chars = 0
    for it in repeats.iter_records(**execution):
        m = marks.setdefault(loc_key(it["l"]), {"paragraph_dups": [], "paragraph_firsts": 0})
        if it.get("first"):
            m["paragraph_firsts"] += 1
            continue
        m["paragraph_dups"].append([it["s"], it["e"]])
        chars += it["e"] - it["s"]
    for m in marks.values():
        m["paragraph_dups"].sort()
    manifest = write_marks_as_attributes(
        source, output, marks, PARAGRAPH_DEFAULTS, name="paragraphs", work=work, **execution
    )
    return {"documents": manifest["records"], "documents_with_repeats": sum(1 for m in marks.values() if m["paragraph_dups"]),
            "paragraphs_marked": sum(len(m["paragraph_dups"]) for m in marks.values()), "chars_marked": chars,
            "counters": manifest["counters"]}  # fmt: skip


def _check_dedup_folder(folder: str) -> None:
    """A `duplicates=` folder of `paragraph_dedup_attributes`, checked to hold document dedup attributes
    (`exact_dup` or `fuzzy_dup`): another attribute folder marks no record, so it would do nothing."""
    from schooner.data import DataError, list_shards, read_records

    for shard in list_shards(folder):
        for rec in read_records(shard):
            held = rec.get("metadata") or {}
            if not any(k in held for k in DUP_FLAGS):
                raise DataError(
                    folder,
                    f"is given as duplicates= of paragraph_dedup but holds no exact_dup or fuzzy_dup attribute "
                    f"(its attributes: {sorted(held)})",
                    fix="pass the exact_dedup/fuzzy_dedup attribute folders (steps) of the same records",
                )
            return
