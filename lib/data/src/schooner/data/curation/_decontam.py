"""Benchmark decontamination: an n-gram index of evaluation texts, and the paragraphs of training records
that overlap it.

Eval texts are normalised to lower-case words (punctuation dropped), cut into 13-word n-grams (GPT-3's
choice, Brown et al. 2020, appendix C; Dolma's decontamination uses the same with a Bloom filter, Soldaini
et al. 2024) and stored as 128-bit blake2b hashes in an `rbloom` Bloom filter (saved with that stable hash,
so a saved filter means the same on every machine) plus an exact table from n-gram hash to eval items (to
name what matched). A training paragraph (line) is flagged when at least half of its words (`threshold`,
Dolma's paragraph rule, counted in words) lie in n-grams that hit. The n-grams of a training text run over
its whole word stream, across line breaks, so a hard-wrapped line shorter than 13 words is judged by the
text around it (n-grams cut at each line could never match such a line). A text shorter than `ngram`
words is one n-gram of all its words, and texts under `min_words` words are neither indexed nor checked.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from schooner.data import storage
from schooner.data._folders import expand_paths
from schooner.data._records import content_id

from ._text import line_spans, normalized_words


@dataclass(frozen=True)
class DecontamConfig:
    """Decontamination settings (defaults: GPT-3 / Dolma)."""

    ngram: int = 13
    threshold: float = 0.5
    """Fraction of a paragraph's words that must lie in hitting n-grams for it to be flagged."""
    min_words: int = 8
    false_positive_rate: float = 1e-6
    """Of the Bloom filter (a hit is then confirmed in the exact table before it is reported)."""

    def __post_init__(self) -> None:
        if self.ngram < 1 or self.min_words < 1:
            raise ValueError(f"DecontamConfig: ngram and min_words must be >= 1, got {self}")
        if not 0 < self.threshold <= 1:
            raise ValueError(f"DecontamConfig.threshold must be in (0, 1], got {self.threshold}")


def _ident(x: int) -> int:
    return x


def _gram_hash(gram: str) -> int:
    return int.from_bytes(hashlib.blake2b(gram.encode(), digest_size=16).digest(), "little", signed=True)


def _windows(n_words: int, config: DecontamConfig) -> list[tuple[int, int]]:
    """`[start, end)` word windows of a text's n-grams (none under `min_words`; one short of `ngram`)."""
    if n_words < config.min_words:
        return []
    n = config.ngram
    return [(0, n_words)] if n_words < n else [(i, i + n) for i in range(n_words - n + 1)]


def gram_hashes(text: str, config: DecontamConfig) -> list[int]:
    """The signed 128-bit hashes of a text's word n-grams ([] under `min_words` words)."""
    ws = normalized_words(text)
    return [_gram_hash(" ".join(ws[a:b])) for a, b in _windows(len(ws), config)]


def item_text(row: dict) -> str:
    """The text of an eval item: a record's `text`, or a task row's `question` (or `query`/`prompt`) followed
    by its answer (`choices[answer]` when the answer is an index, else the answer itself)."""
    if isinstance(row.get("text"), str):
        return row["text"]
    q = next(
        (row[k] for k in ("question", "query", "prompt", "context") if isinstance(row.get(k), str)), None
    )
    if q is None:
        raise ValueError(f"eval item {str(row)[:80]!r} has no text, question, query, prompt or context field")
    ans = row.get("answer", row.get("target"))
    choices = row.get("choices")
    if (
        isinstance(ans, int)
        and not isinstance(ans, bool)
        and isinstance(choices, list)
        and 0 <= ans < len(choices)
    ):
        ans = choices[ans]
    return q if ans is None else f"{q} {ans}"


def load_eval_items(paths: str | Sequence[str]) -> list[dict]:
    """Eval items `{"id", "task", "text"}` from jsonl files (records, or task rows with question/choices/
    answer), record folders or globs; `task` is the file's stem unless a row names one."""
    import os

    from schooner.data._readers import read_records

    plist = [paths] if isinstance(paths, str) else list(paths)
    items: list[dict] = []
    for path in expand_paths(plist):
        stem = os.path.basename(path).split(".")[0]
        if ".jsonl" in path and not path.endswith((".gz", ".zst")):
            with storage.open_file(path, "rb") as f:
                rows = [orjson.loads(line) for line in f.read().splitlines() if line.strip()]
        else:
            rows = list(read_records(path))
        for i, row in enumerate(rows):
            task = str(row.get("task") or row.get("source") or stem)
            items.append({"id": str(row.get("id") or f"{task}/{i}"), "task": task, "text": item_text(row)})
    return items


def build_index(
    items: Iterable[dict], folder: str, config: DecontamConfig = DecontamConfig()
) -> dict[str, Any]:
    """Write the index of eval `items` into `folder` (`bloom.bin`, `grams.json`, `items.jsonl`); returns
    counts (items indexed, too short, n-grams)."""
    from rbloom import Bloom

    items = list(items)
    table: dict[int, list[int]] = {}
    short = []
    for k, it in enumerate(items):
        hs = gram_hashes(it["text"], config)
        if not hs:
            short.append(it["id"])
        for h in set(hs):
            table.setdefault(h, []).append(k)
    bloom = Bloom(max(len(table), 1), config.false_positive_rate, hash_func=_ident)
    bloom.update(table)
    storage.makedirs(folder)
    local = storage.join(folder, "bloom.bin")
    bloom.save(storage.local_path(local) if storage.is_local(local) else local)
    storage.write_bytes(
        storage.join(folder, "grams.json"), orjson.dumps({str(h): v for h, v in table.items()})
    )
    storage.write_bytes(
        storage.join(folder, "items.jsonl"), b"".join(orjson.dumps(it) + b"\n" for it in items)
    )
    return {"items": len(items), "indexed": len(items) - len(short), "too_short": len(short),
            "too_short_examples": short[:5], "ngrams": len(table)}  # fmt: skip


@functools.lru_cache(maxsize=4)
def load_index(folder: str) -> tuple[Any, dict[int, list[int]], list[dict]]:
    """(Bloom filter, exact table, items) of an index folder, loaded once per process."""
    from rbloom import Bloom

    bloom = Bloom.load(storage.local_path(storage.join(folder, "bloom.bin")), _ident)
    with storage.open_file(storage.join(folder, "grams.json"), "rb") as f:
        table = {int(k): v for k, v in orjson.loads(f.read()).items()}
    with storage.open_file(storage.join(folder, "items.jsonl"), "rb") as f:
        items = [orjson.loads(line) for line in f.read().splitlines() if line.strip()]
    return bloom, table, items


def contaminated_spans(text: str, index_folder: str, config: DecontamConfig = DecontamConfig()) -> list[list]:
    """`[start, end, eval item id, fraction]` of every paragraph (line) of `text` whose words lie in n-grams
    that hit the index, a `config.threshold` fraction of them or more (the item is the one most hits
    touching the line belong to; the fraction is the line's covered words)."""
    bloom, table, items = load_index(index_folder)
    spans: list[tuple[int, int]] = []
    words: list[str] = []
    line_of: list[int] = []
    for start, end, line in line_spans(text):
        ws = normalized_words(line)
        line_of.extend([len(spans)] * len(ws))
        words.extend(ws)
        spans.append((start, end))
    covered = bytearray(len(words))
    votes: dict[int, dict[int, int]] = {}
    reach = 0
    for a, b in _windows(len(words), config):
        h = _gram_hash(" ".join(words[a:b]))
        found = table.get(h) if h in bloom else None  # the exact table rules out Bloom false positives
        if not found:
            continue
        covered[max(a, reach) : b] = b"\x01" * (b - max(a, reach))
        reach = max(reach, b)
        for li in range(line_of[a], line_of[b - 1] + 1):
            v = votes.setdefault(li, {})
            for k in found:
                v[k] = v.get(k, 0) + 1
    per_line = [0] * len(spans)
    covered_per_line = [0] * len(spans)
    for w, li in enumerate(line_of):
        per_line[li] += 1
        covered_per_line[li] += covered[w]
    out: list[list] = []
    for li, v in sorted(votes.items()):
        if not per_line[li]:
            continue  # a line without words inside a matched stretch: nothing to flag
        frac = covered_per_line[li] / per_line[li]
        if frac >= config.threshold:
            k = max(v.items(), key=lambda kv: (kv[1], -kv[0]))[0]
            out.append([spans[li][0], spans[li][1], items[k]["id"], round(frac, 4)])
    return out


@dataclass(frozen=True)
class DecontamAttributes:
    """Per record: `contaminated`, the flagged paragraphs as spans `[start, end, item id, fraction]`."""

    index_folder: str
    config: DecontamConfig = DecontamConfig()

    @property
    def __name__(self) -> str:
        return "decontaminate"

    def __call__(self, rec: dict) -> dict:
        return {"contaminated": contaminated_spans(rec["text"], self.index_folder, self.config)}


def eval_records_to_items(records: Iterable[dict], task: str) -> Iterator[dict]:
    """Eval items from records (`{"id", "text"}`), tagged with `task`."""
    for r in records:
        yield {"id": str(r.get("id") or content_id(r["text"])), "task": task, "text": r["text"]}
