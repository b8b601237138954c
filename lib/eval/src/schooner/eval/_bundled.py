"""Tasks built from Schooner's embedded corpus (Python's documentation): accuracy with no download.

Three 4-way multiple-choice tasks, each a seeded sample of the `python-docs` source (`schooner.data.sources`),
written as jsonl in the `examples` layout so they run like any other `Task`:

* `docs_next_sentence`: up to two sentences of a documentation paragraph, then the sentence that follows them
  against three sentences from other documents that also follow another sentence and fall in the same length
  bin (eighths of the pool by characters).
* `docs_function_name` (partial scoring): which of four signatures (`name(args)`, each a real function of the
  corpus with its own arguments) is followed by this docstring's first line. The docstring is the shared
  continuation, so the score is p(docstring | signature) and its length cancels (no `acc_norm`: it would equal `acc`).
* `docs_cloze`: the last word of a documentation sentence, given the sentence and the one before it, against
  three last words of sentences from other documents.

The distractors are drawn from the distribution the right answer was drawn from, so the four choices are
exchangeable for any scorer that ignores the context: it scores chance in expectation, and a model only beats
chance through what it learned of how context and answer go together (tested: the right answer is the longest,
the shortest and the unigram's pick about one time in four). Version 1 drew next-sentence distractors from all
sentences, which are shorter on average than those that follow another one: summed log-probability (`acc`)
then favoured the distractors, and a weak model scored below chance.

Each task's record carries its chance level and the score of a word-unigram model fitted on the whole corpus
(add-one smoothing), scored by the same rules (`unigram_acc`, `unigram_acc_norm`), so a trained model's
accuracy can be read against both. The documents are those the tutorial trains on (less its 2% validation
split): these tasks measure what a model learned of its training distribution, not generalisation.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from schooner.cluster import storage

from ._tasks import Example
from ._taskspec import Suite, Task, chance_level

_WORD = re.compile(r"\w+|[^\w\s]")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z])")
_NEXT_CONTEXT = 2
"""Sentences of the paragraph before the one to pick (docs_next_sentence's context)."""
_LENGTH_BINS = 8
"""docs_next_sentence draws its distractors from the gold's length bin (`_length_bins`)."""
_SIGNATURE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)\(([^()]{0,60})\)$")

BUNDLED_VERSION = 2
"""Bumped whenever the construction changes (the folder's tasks.json records it)."""


def _paragraphs(text: str) -> list[str]:
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.splitlines()
        if not lines or any(
            line.startswith((" ", "\t", ">>>")) or "::" in line or "*" in line for line in lines
        ):
            continue  # code, grammar, headings: keep plain prose paragraphs
        out.append(" ".join(line.strip() for line in lines))
    return out


def _sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(paragraph) if 30 <= len(s.strip()) <= 200]


def _functions(text: str) -> list[tuple[str, str, str]]:
    """(name, args, first docstring line) of each documented function in a pydoc-like module record."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines[:-1]):
        match = _SIGNATURE.match(line)
        summary = lines[i + 1].strip()
        if match and lines[i + 1].startswith("    ") and 20 <= len(summary) <= 150:
            name = match.group(1)
            if not name.startswith("_") and name.lower() not in summary.lower():
                out.append((name, match.group(2), summary))
    return out


class Unigram:
    """A word-unigram model with add-one smoothing (the reference score of the bundled tasks)."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.counts = Counter(w for t in texts for w in _WORD.findall(t))
        self.total = sum(self.counts.values())
        self.size = len(self.counts) + 1

    def logprob(self, text: str) -> float:
        return math.fsum(
            math.log((self.counts.get(w, 0) + 1) / (self.total + self.size)) for w in _WORD.findall(text)
        )


def _unigram_scores(model: Unigram, examples: Sequence[Example]) -> dict[str, float]:
    acc = norm = 0.0
    for ex in examples:
        # p(continuation | context) of a unigram model does not see the context: a partial-scoring task
        # (one context per choice) ties every choice, and a tie counts as a random pick among the tied
        lps = [model.logprob(c) for _, c in ex.pairs()]
        texts = ex.norm_texts()
        acc += _expected_hit(lps, ex.gold)
        norm += _expected_hit([lp / max(len(t), 1) for lp, t in zip(lps, texts, strict=True)], ex.gold)
    return {"unigram_acc": acc / len(examples), "unigram_acc_norm": norm / len(examples)}


def _expected_hit(scores: Sequence[float], gold: int) -> float:
    best = max(scores)
    tied = [i for i, s in enumerate(scores) if s == best]
    return 1.0 / len(tied) if gold in tied else 0.0


def _length_bins(pool: Sequence[tuple[int, str]], bins: int) -> dict[str, list[tuple[int, str]]]:
    """Each string of `pool` -> the members of its length bin (`bins` bins of equal count, by characters).

    Distractors drawn from the gold's own bin are exchangeable with it: the four choices of a question are
    independent draws from the same distribution, so a scorer that ignores the context is at chance in
    expectation, and no length tell is left (a window centred on the gold's length would leave one: the gold
    would be the median-length choice too often).
    """
    ordered = sorted(pool, key=lambda item: (len(item[1]), item[1]))
    out: dict[str, list[tuple[int, str]]] = {}
    for b in range(bins):
        members = ordered[b * len(ordered) // bins : (b + 1) * len(ordered) // bins]
        for _, text in members:
            out.setdefault(text, members)
    return out


def _draw_others(rng: random.Random, pool: Sequence[tuple[int, str]], owner: int, gold: str) -> list[str]:
    """Three distinct strings of `pool`, from documents other than `owner`, none equal to `gold`."""
    others: list[str] = []
    for _ in range(100 * len(pool)):
        other_owner, other = pool[rng.randrange(len(pool))]
        if other_owner != owner and other.lower() != gold.lower() and other not in others:
            others.append(other)
            if len(others) == 3:
                return others
    raise ValueError(f"too few distractors for {gold!r} in a pool of {len(pool)}")


def _insert_gold(rng: random.Random, others: list[str], gold: str) -> tuple[tuple[str, ...], int]:
    index = rng.randrange(len(others) + 1)
    return tuple(others[:index] + [gold] + others[index:]), index


def _next_sentence(records: list[dict], rng: random.Random, size: int) -> list[Example]:
    items: list[tuple[int, str, str]] = []  # (document, preceding sentences, the sentence that follows them)
    for r, record in enumerate(records):
        for paragraph in _paragraphs(record["text"]):
            sentences = _sentences(paragraph)
            for i in range(1, len(sentences)):
                items.append((r, " ".join(sentences[max(0, i - _NEXT_CONTEXT) : i]), sentences[i]))
    # distractors: sentences that follow another one (as the gold does) from other documents, of similar length
    bins = _length_bins([(r, sentence) for r, _, sentence in items], _LENGTH_BINS)
    out = []
    for r, context, sentence in rng.sample(items, min(size, len(items))):
        choices, gold = _insert_gold(rng, _draw_others(rng, bins[sentence], r, sentence), sentence)
        out.append(Example((context,), choices, gold))
    return out


def _function_name(records: list[dict], rng: random.Random, size: int) -> list[Example]:
    functions = [f for record in records for f in _functions(record["text"])]
    out = []
    for name, args, summary in rng.sample(functions, min(size, len(functions))):
        others: list[tuple[str, str]] = []
        while len(others) < 3:  # other documented functions, each with its own arguments
            other, other_args, _ = functions[rng.randrange(len(functions))]
            if other != name and other not in {o for o, _ in others}:
                others.append((other, other_args))
        gold = rng.randrange(4)
        candidates = others[:gold] + [(name, args)] + others[gold:]
        contexts = tuple(f"{c}({a})\n" for c, a in candidates)
        out.append(Example(contexts, (f"    {summary}",), gold))
    return out


def _cloze(records: list[dict], rng: random.Random, size: int) -> list[Example]:
    items: list[tuple[int, str, str]] = []  # (document, context, the sentence's last word)
    for r, record in enumerate(records):
        for paragraph in _paragraphs(record["text"]):
            sentences = _sentences(paragraph)
            for before, sentence in zip(sentences, sentences[1:], strict=False):
                head, _, last = sentence[:-1].rpartition(" ")
                if sentence.endswith(".") and last.isalpha() and len(last) >= 3 and head:
                    items.append((r, f"{before} {head}", last))
    out = []
    for r, context, word in rng.sample(items, min(size, len(items))):
        # distractors: other sentences' last words (the gold's own distribution: a unigram is at chance)
        others = _draw_others(rng, [(owner, last) for owner, _, last in items], r, word)
        choices, gold = _insert_gold(rng, others, word)
        out.append(Example((context,), choices, gold))
    return out


BUILDERS = {
    "docs_next_sentence": (_next_sentence, "multiple_choice"),
    "docs_function_name": (_function_name, "multiple_choice"),
    "docs_cloze": (_cloze, "multiple_choice"),
}


def _write_examples(path: str, examples: Sequence[Example]) -> None:
    with storage.atomic_open(path, "w") as f:
        for ex in examples:
            row = {"contexts": list(ex.contexts), "continuations": list(ex.continuations), "gold": ex.gold}
            if ex.answer_texts:
                row["answer_texts"] = list(ex.answer_texts)
            f.write(storage.dumps_json(row, indent=None, sort_keys=False) + "\n")


@dataclasses.dataclass(frozen=True)
class BundledTasks:
    """The bundled tasks in `evaluate(tasks=[...])` with a size or seed of your choice ("bundled" is
    `BundledTasks()`); built under the step's output folder when it runs (`bundled_suite`).

    Attributes:
        size: documents per task (fewer when the corpus has fewer candidates: all of them with a large size).
        seed: the sampling seed.
    """

    size: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise ValueError(f"BundledTasks: size must be a positive int, got size={self.size!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"BundledTasks: seed must be an int, got seed={self.seed!r}")


def bundled_suite(folder: str, *, size: int = 200, seed: int = 0) -> Suite:
    """Write the bundled tasks' files into `folder` (once; reused when `tasks.json` matches) and return them.

    Args:
        folder: where the jsonl files and `tasks.json` (each task's chance and unigram reference) go.
        size: documents per task (fewer when the corpus has fewer candidates).
        seed: the sampling seed.
    """
    os.makedirs(folder, exist_ok=True)
    index = os.path.join(folder, "tasks.json")
    settings = {"version": BUNDLED_VERSION, "size": size, "seed": seed}
    if os.path.exists(index):
        saved = storage.read_json(index)
        if saved.get("settings") == settings:
            # Each task's file is `{folder}/{name}.jsonl`: found where the folder is now (a step's attempt
            # folder is renamed when it is published, and an older tasks.json holds absolute paths).
            return Suite(
                "bundled",
                tuple(
                    Task(**{**t, "path": os.path.join(folder, f"{t['name']}.jsonl")}) for t in saved["tasks"]
                ),
            )
    from schooner.data.sources import iter_source

    records = list(iter_source("python-docs"))
    unigram = Unigram([r["text"] for r in records])
    tasks = []
    for offset, (name, (build, kind)) in enumerate(sorted(BUILDERS.items())):
        examples = build(records, random.Random(seed * 1000 + offset), size)
        path = os.path.join(folder, f"{name}.jsonl")
        _write_examples(path, examples)
        tasks.append(
            Task(
                name=name,
                path=path,
                layout="examples",
                kind=kind,
                delimiter=" " if name != "docs_function_name" else "",
                chance=chance_level(examples, kind),
                reference=_unigram_scores(unigram, examples),
            )
        )
    # Paths relative to the folder: it may move (a step's attempt folder is renamed when published).
    saved_tasks = [{**t.to_dict(), "path": os.path.basename(t.path)} for t in tasks]
    payload: dict[str, Any] = {"settings": settings, "tasks": saved_tasks}
    storage.write_json(index, payload, indent=2)
    return Suite("bundled", tuple(tasks))
