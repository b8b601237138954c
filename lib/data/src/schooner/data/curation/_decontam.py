"""Benchmark decontamination: an n-gram index of evaluation texts, and the paragraphs of training records
that overlap it.

Eval texts are normalised to lower-case words (punctuation dropped), cut into 13-word n-grams (GPT-3's
choice, Brown et al. 2020, appendix C; Dolma's decontamination uses the same with a Bloom filter, Soldaini
et al. 2024) and stored as 128-bit blake2b hashes in an `rbloom` Bloom filter (saved with that stable hash,
so a saved filter means the same on every machine) plus an exact table from n-gram hash to eval items (to
name what matched). A training paragraph (line) is flagged when at least half of its words (`threshold`,
Dolma's paragraph rule, counted in words) lie in n-grams that hit. The n-grams of a training text run over
its whole word stream, across line breaks, so a hard-wrapped line shorter than 13 words is judged by the
text around it (n-grams cut at each line could never match such a line). An eval item shorter than
`ngram` words is one n-gram of all its words, found in training text by its first `min_words` words and
then compared whole (GPT-3 shortened n for tasks of short examples too); texts under `min_words` words are
neither indexed nor checked. A paragraph that holds every n-gram of an eval item is flagged whatever the
fraction (`whole_item`: an item quoted in a long paragraph covers less than half of it). A zero-width space
is read both ways, deleted (a break point inside a word) and as a space (words joined by it), on both sides.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from schooner.data import storage
from schooner.data._folders import expand_paths
from schooner.data._records import content_id

from ._text import WORDS_RULE, ZERO_WIDTH_SPACE, line_spans, normalized_words


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


def _answer(row: Mapping) -> Any:
    """A task row's answer as text: `choices[answer]` for an index, `choices` as HF ARC lays them out
    (`{"text": [...], "label": ["A", ...]}` with `answerKey`), a letter into a plain choice list, else the
    answer (`answer`, `answerKey` or `target`) itself."""
    ans = next((row[k] for k in ("answer", "answerKey", "target") if row.get(k) is not None), None)
    choices, labels = row.get("choices"), None
    if isinstance(choices, Mapping):
        labels = choices.get("label")
        choices = choices.get("text")
    if not isinstance(choices, list) or ans is None or isinstance(ans, bool):
        return ans
    if isinstance(ans, int) and 0 <= ans < len(choices):
        return choices[ans]
    if isinstance(ans, str) and isinstance(labels, list) and ans in labels:
        return choices[labels.index(ans)]
    if (
        isinstance(ans, str)
        and labels is None
        and len(ans) == 1
        and 0 <= ord(ans.upper()) - 65 < len(choices)
    ):
        return choices[ord(ans.upper()) - 65]
    return ans


def item_text(row: Mapping) -> str:
    """The text of an eval item: a record's `text`, or a task row's `question` (or `query`/`prompt`/
    `context`) followed by its answer (see `_answer`; ARC's `choices`/`answerKey` layout included)."""
    if isinstance(row.get("text"), str):
        return row["text"]
    q = next(
        (row[k] for k in ("question", "query", "prompt", "context") if isinstance(row.get(k), str)), None
    )
    if q is None:
        raise ValueError(
            f"eval item {str(row)[:80]!r} has no text, question, query, prompt or context field; give eval "
            "records (`text`) or task rows (`question`, `choices`, `answer`)"
        )
    ans = _answer(row)
    return q if ans is None else f"{q} {ans}"


def _rows_of(x: Any) -> Iterator[tuple[str, str, Mapping]]:
    """`(where, default task, row)` of one `against` entry: a jsonl file, record folder or glob, a
    `Dataset`, or one record (a dict)."""
    import os

    from schooner.data._dataset import Dataset
    from schooner.data._readers import detect_format, read_records

    if isinstance(x, Mapping):
        yield "records", "eval", x
    elif isinstance(x, Dataset):
        for i, row in enumerate(x.iter_records(progress=False)):
            yield f"Dataset row {i}", "eval", row
    elif isinstance(x, str | os.PathLike):
        for path in expand_paths(str(x)):
            stem = os.path.basename(path).split(".")[0]
            try:
                fmt, comp = detect_format(path)
            except ValueError:
                fmt, comp = "", None
            if fmt in ("jsonl", "json"):
                # task rows keep their own fields (question, choices, ...): read the JSON, not records
                yield from _json_rows(path, stem, comp)
            else:
                for i, row in enumerate(read_records(path)):
                    yield f"{path} record {i}", stem, row
    else:
        raise TypeError(
            f"decontaminate against {x!r}: give jsonl files, record folders or globs, step handles, a Dataset "
            "or records (dicts)"
        )


def _json_rows(path: str, stem: str, comp: str | None) -> Iterator[tuple[str, str, Any]]:
    """The rows of a JSON lines file or a JSON array file (plain, `.gz` or `.zst`), as they are."""
    from schooner.data._compression import StreamError, iter_decompressed

    with storage.open_file(path, "rb") as f:
        try:
            data = b"".join(iter_decompressed(f, comp))
        except StreamError as e:
            raise ValueError(
                f"{path}: {e}; the file is incomplete or damaged, rewrite or re-download it"
            ) from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a UTF-8 byte order mark
    if data.lstrip()[:1] == b"[":
        try:
            rows = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise ValueError(
                f"{path}: not JSON ({e}); give a JSON array of objects or one object a line"
            ) from None
        if isinstance(rows, list):
            for i, row in enumerate(rows):
                yield f"{path} element {i}", stem, row
            return
    for n, line in enumerate(data.splitlines(), 1):
        if line.strip():
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise ValueError(
                    f"{path}:{n}: not JSON ({e}); eval files are one JSON object a line"
                ) from None
            yield f"{path}:{n}", stem, row


def load_eval_items(against: Any) -> list[dict]:
    """Eval items `{"id", "task", "text"}` from `against`: jsonl files (records, or task rows with
    question/choices/answer), record folders or globs, a `Dataset`, records (dicts), or a list of these.
    An item's task is its row's `task`, else `source` (the task name eval records carry), else the file's
    stem ("eval" for a Dataset or dicts); its id is the row's `id`, else `task/index`.

    Raises:
        ValueError: a row without text or question (naming file and line), or an id given twice.
    """
    import os

    from schooner.data._dataset import Dataset

    single = isinstance(against, str | os.PathLike | Mapping | Dataset) or not isinstance(against, Iterable)
    items: list[dict] = []
    where: dict[str, str] = {}
    counts: dict[str, int] = {}
    for x in [against] if single else list(against):
        for loc, default_task, row in _rows_of(x):
            if not isinstance(row, Mapping):
                raise ValueError(f"{loc}: an eval item must be a JSON object, got {str(row)[:60]!r}")
            task = str(row.get("task") or row.get("source") or default_task)
            try:
                text = item_text(row)
            except ValueError as e:
                raise ValueError(f"{loc}: {e}") from None
            item_id = str(row.get("id") or f"{task}/{counts.get(task, 0)}")
            counts[task] = counts.get(task, 0) + 1
            if item_id in where:
                raise ValueError(
                    f"eval item id {item_id!r} at {loc} was already given at {where[item_id]}; ids name "
                    "what a hit matched, so they must be unique (pass each file once, or give rows ids)"
                )
            where[item_id] = loc
            items.append({"id": item_id, "task": task, "text": text})
    return items


@dataclass(frozen=True)
class EvalTexts:
    """Eval items carried in a step's config (what `decontaminate` makes of a `Dataset` or records given
    as `against`), keyed by their content."""

    items: tuple[tuple[str, str, str], ...]
    """`(id, task, text)` of each item."""

    @staticmethod
    def of(against: Any) -> EvalTexts:
        return EvalTexts(tuple((it["id"], it["task"], it["text"]) for it in load_eval_items(against)))

    def as_items(self) -> list[dict]:
        return [{"id": i, "task": t, "text": x} for i, t, x in self.items]

    def __schooner_canonical__(self) -> dict:
        return {"eval_texts": hashlib.sha256(orjson.dumps(self.items)).hexdigest(), "items": len(self.items)}


def build_index(
    items: Iterable[dict], folder: str, config: DecontamConfig = DecontamConfig()
) -> dict[str, Any]:
    """Write the index of eval `items` into `folder` (`bloom.bin`, `grams.json`, `shorter.json`,
    `items.jsonl`, and `index.json`: the word rule, `ngram` and `min_words` it was built with); returns counts (items, indexed, too short, n-grams, items shorter than an n-gram, items
    per task)."""
    from rbloom import Bloom

    items = list(items)
    seen: set[str] = set()
    for it in items:
        if it["id"] in seen:
            raise ValueError(
                f"eval item id {it['id']!r} is given twice; ids name what a hit matched, so they must be "
                "unique (pass each eval file or folder once, or give its rows ids)"
            )
        seen.add(it["id"])
    table: dict[int, list[int]] = {}
    shorter: dict[int, list[list]] = {}  # first min_words words -> [item, length, hash of all its words]
    short = []
    counts: list[int] = []  # per item: its distinct n-grams (the fewest of its readings)
    for k, it in enumerate(items):
        readings = [normalized_words(it["text"])]
        if ZERO_WIDTH_SPACE in it["text"]:
            readings.append(normalized_words(it["text"], zero_width_space=" "))
        count = None
        for ws in readings:
            hs = [_gram_hash(" ".join(ws[a:b])) for a, b in _windows(len(ws), config)]
            if hs and len(ws) < config.ngram:
                shorter.setdefault(_gram_hash(" ".join(ws[: config.min_words])), []).append(
                    [k, len(ws), str(hs[0])]
                )
            for h in set(hs):
                if k not in table.setdefault(h, []):
                    table[h].append(k)
            if hs:
                count = len(set(hs)) if count is None else min(count, len(set(hs)))
        if count is None:
            short.append(it["id"])
        counts.append(count or 0)
    bloom = Bloom(max(len(table), 1), config.false_positive_rate, hash_func=_ident)
    bloom.update(table)
    storage.makedirs(folder)
    local = storage.join(folder, "bloom.bin")
    bloom.save(storage.local_path(local) if storage.is_local(local) else local)
    storage.write_bytes(
        storage.join(folder, "grams.json"), orjson.dumps({str(h): v for h, v in table.items()})
    )
    storage.write_bytes(
        storage.join(folder, "shorter.json"), orjson.dumps({str(h): v for h, v in shorter.items()})
    )
    storage.write_bytes(
        storage.join(folder, "items.jsonl"), b"".join(orjson.dumps(it) + b"\n" for it in items)
    )
    storage.write_json(
        storage.join(folder, "index.json"),
        {"words": WORDS_RULE, "ngram": config.ngram, "min_words": config.min_words, "item_ngrams": counts},
    )
    load_index.cache_clear()  # an index this process loaded from `folder` before is replaced
    tasks: dict[str, int] = {}
    for it in items:
        tasks[it["task"]] = tasks.get(it["task"], 0) + 1
    return {"items": len(items), "indexed": len(items) - len(short), "too_short": len(short),
            "too_short_examples": short[:5], "ngrams": len(table),
            "shorter_than_ngram": sum(len(v) for v in shorter.values()), "tasks": tasks}  # fmt: skip


class Index(NamedTuple):
    """A loaded index: the Bloom filter, the exact table (n-gram hash -> items), the items, and the items
    shorter than an n-gram (hash of their first `min_words` words -> `[item, length, hash of all]`)."""

    bloom: Any
    table: dict[int, list[int]]
    items: list[dict]
    shorter: dict[int, list[list]]
    meta: dict
    """`index.json`: the word rule, `ngram` and `min_words` the index was built with."""


@functools.lru_cache(maxsize=4)
def load_index(folder: str) -> Index:
    """The index in `folder`, loaded once per process (again after `build_index` writes an index).

    Raises:
        ValueError: an index built by an earlier schooner-data (its words were normalised by another rule:
            a copy would be missed), naming the folder.
    """
    from rbloom import Bloom

    try:
        meta = orjson.loads(storage.read_bytes(storage.join(folder, "index.json")))
    except FileNotFoundError:
        meta = {}
    if meta.get("words") != WORDS_RULE:
        raise ValueError(
            f"decontamination index {folder} was built with words normalised by another rule "
            f"({meta.get('words', 'an earlier schooner-data, lower-cased')!r}, not {WORDS_RULE!r}): its "
            "n-grams would miss copies; rebuild it with build_index"
        )

    bloom = Bloom.load(storage.local_path(storage.join(folder, "bloom.bin")), _ident)
    with storage.open_file(storage.join(folder, "grams.json"), "rb") as f:
        table = {int(k): v for k, v in orjson.loads(f.read()).items()}
    with storage.open_file(storage.join(folder, "shorter.json"), "rb") as f:
        shorter = {int(k): [[i, n, int(h)] for i, n, h in v] for k, v in orjson.loads(f.read()).items()}
    with storage.open_file(storage.join(folder, "items.jsonl"), "rb") as f:
        items = [orjson.loads(line) for line in f.read().splitlines() if line.strip()]
    return Index(bloom, table, items, shorter, meta)


def _matches(
    words: list[str], index: Index, config: DecontamConfig
) -> Iterator[tuple[int, int, list[int], int | None]]:
    """`(start, end, items, n-gram hash)` of every stretch of `words` found in the index: its n-grams (the
    exact table rules out Bloom false positives), and whole eval items shorter than an n-gram (an n-gram of
    the item's own length, as GPT-3 shortened n for short examples, found by its first `min_words` words;
    hash None: the whole item)."""
    for a, b in _windows(len(words), config):
        h = _gram_hash(" ".join(words[a:b]))
        found = index.table.get(h) if h in index.bloom else None
        if found:
            yield a, b, found, h
    if not index.shorter:
        return
    # a short item is looked for inside every text, one shorter than an n-gram included (its one window
    # of all its words, above, finds only an item of exactly its words, which is not looked for again)
    m, whole = config.min_words, len(words) < config.ngram
    for a in range(len(words) - m + 1):
        for k, n, full in index.shorter.get(_gram_hash(" ".join(words[a : a + m])), ()):
            if whole and n == len(words):
                continue
            if a + n <= len(words) and _gram_hash(" ".join(words[a : a + n])) == full:
                yield a, a + n, [k], None


class _Flag(NamedTuple):
    start: int
    end: int
    item: int
    fraction: float
    ngram: str
    whole: bool


def _scan(text: str, index_folder: str, config: DecontamConfig) -> list[_Flag]:
    """The flagged paragraphs (lines) of `text`, under both readings of a zero-width space (the reading
    that flags a line more surely wins: a whole item, then the larger fraction)."""
    built = load_index(index_folder).meta
    if (built["ngram"], built["min_words"]) != (config.ngram, config.min_words):
        raise ValueError(
            f"decontamination index {index_folder} was built with ngram={built['ngram']}, "
            f"min_words={built['min_words']}; it is checked with ngram={config.ngram}, "
            f"min_words={config.min_words}, which would find nothing: pass the config it was built with"
        )
    lines = list(line_spans(text))
    best: dict[int, _Flag] = {}
    for reading in ("", " ") if ZERO_WIDTH_SPACE in text else ("",):
        for li, flag in _scan_reading(lines, load_index(index_folder), config, reading):
            old = best.get(li)
            if old is None or (flag.whole, flag.fraction) > (old.whole, old.fraction):
                best[li] = flag
    return [best[li] for li in sorted(best)]


def _scan_reading(
    lines: list[tuple[int, int, str]], index: Index, config: DecontamConfig, zero_width_space: str
) -> Iterator[tuple[int, _Flag]]:
    words: list[str] = []
    line_of: list[int] = []
    for li, (_, _, line) in enumerate(lines):
        ws = normalized_words(line, zero_width_space=zero_width_space)
        line_of.extend([li] * len(ws))
        words.extend(ws)
    covered = bytearray(len(words))
    # line -> item -> [hits, first hitting window, distinct n-grams of the item hit, whole item found]
    votes: dict[int, dict[int, list]] = {}
    for a, b, found, h in _matches(words, index, config):
        covered[a:b] = b"\x01" * (b - a)
        for li in range(line_of[a], line_of[b - 1] + 1):
            v = votes.setdefault(li, {})
            for k in found:
                got = v.setdefault(k, [0, (a, b), set(), False])
                got[0] += 1
                if h is None:
                    got[3] = True
                else:
                    got[2].add(h)
    per_line = [0] * len(lines)
    covered_per_line = [0] * len(lines)
    for w, li in enumerate(line_of):
        per_line[li] += 1
        covered_per_line[li] += covered[w]
    counts = index.meta["item_ngrams"]
    for li, v in sorted(votes.items()):
        if not per_line[li]:
            continue  # a line without words inside a matched stretch: nothing to flag
        frac = covered_per_line[li] / per_line[li]
        whole = {k for k, got in v.items() if got[3] or (counts[k] and len(got[2]) >= counts[k])}
        if frac >= config.threshold or whole:
            pool = {k: got for k, got in v.items() if k in whole} if whole else v
            k, (_, (a, b), _, _) = max(pool.items(), key=lambda kv: (kv[1][0], -kv[0]))
            start, end, _ = lines[li]
            yield li, _Flag(start, end, k, round(frac, 4), " ".join(words[a:b]), bool(whole))


def contaminated_spans(text: str, index_folder: str, config: DecontamConfig = DecontamConfig()) -> list[list]:
    """`[start, end, eval item id, fraction]` of every paragraph (line) of `text` whose words lie in n-grams
    that hit the index, a `config.threshold` fraction of them or more, or that holds a whole eval item (the
    item is the one most hits touching the line belong to, a whole one first; the fraction is the line's
    covered words)."""
    items = load_index(index_folder).items
    return [[s, e, items[k]["id"], f] for s, e, k, f, _, _ in _scan(text, index_folder, config)]


def contamination_hits(text: str, index_folder: str, config: DecontamConfig = DecontamConfig()) -> list[dict]:
    """The flagged paragraphs of `text` as hits: `span`, `fraction`, the eval item (`eval_item`, `task`),
    `ngram`, the first normalised n-gram of the paragraph's matched stretch found in that item, and
    `whole_item`: the paragraph holds every n-gram of an eval item (flagged whatever its fraction)."""
    items = load_index(index_folder).items
    return [{"span": [s, e], "fraction": f, "eval_item": items[k]["id"], "task": items[k]["task"], "ngram": g,
             "whole_item": w} for s, e, k, f, g, w in _scan(text, index_folder, config)]  # fmt: skip


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
