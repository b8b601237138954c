"""Tasks built from Schooner's embedded corpus (Python's documentation): accuracy with no download.

Three tasks, each a seeded sample of the `python-docs` source (`schooner.data.sources`), written as jsonl in
the `examples` layout so they run like any other `Task`:

* `docs_next_sentence` (4-way multiple choice): a sentence of a documentation paragraph, then its true next
  sentence against three sentences drawn from other documents.
* `docs_function_name` (4-way, partial scoring): which of four function names, written as the corpus writes a
  signature (`name(args)`), is followed by this docstring's first line. The docstring is the shared
  continuation, so the score is p(docstring | name): the corpus order, name first.
* `docs_cloze` (continuation, LAMBADA-style): the last word of a documentation sentence, given the sentence
  and the one before it; accuracy is the greedy continuation matching it.

Each task's record carries its chance level and the score of a word-unigram model fitted on the whole corpus
(add-one smoothing), scored by the same rules (`unigram_acc`, `unigram_acc_norm`), so a trained model's
accuracy can be read against both. The documents are those the tutorial trains on (less its 2% validation
split): these tasks measure what a model learned of its training distribution, not generalisation.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ._tasks import Example
from ._taskspec import Suite, Task, chance_level

_WORD = re.compile(r"\w+|[^\w\s]")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z])")
_SIGNATURE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)\(([^()]{0,60})\)$")

BUNDLED_VERSION = 1
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

    def most_common_word(self) -> str:
        return next(w for w, _ in self.counts.most_common() if w.isalpha())


def _unigram_scores(model: Unigram, examples: Sequence[Example], kind: str) -> dict[str, float]:
    if kind == "continuation":
        top = model.most_common_word()
        acc = sum(ex.continuations[ex.gold].strip() == top for ex in examples) / len(examples)
        return {"unigram_acc": acc}
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


def _next_sentence(records: list[dict], rng: random.Random, size: int) -> list[Example]:
    pairs: list[tuple[int, str, str]] = []
    pool: list[tuple[int, str]] = []
    for r, record in enumerate(records):
        for paragraph in _paragraphs(record["text"]):
            sentences = _sentences(paragraph)
            pool.extend((r, s) for s in sentences)
            pairs.extend((r, a, b) for a, b in zip(sentences, sentences[1:], strict=False))
    out = []
    for r, first, second in rng.sample(pairs, min(size, len(pairs))):
        others: list[str] = []
        while len(others) < 3:
            owner, sentence = pool[rng.randrange(len(pool))]
            if owner != r and sentence not in others:
                others.append(sentence)
        gold = rng.randrange(4)
        choices = others[:gold] + [second] + others[gold:]
        out.append(Example((first,), tuple(choices), gold))
    return out


def _function_name(records: list[dict], rng: random.Random, size: int) -> list[Example]:
    functions = [f for record in records for f in _functions(record["text"])]
    names = sorted({name for name, _, _ in functions})
    out = []
    for name, args, summary in rng.sample(functions, min(size, len(functions))):
        others = rng.sample([n for n in names if n != name], 3)
        gold = rng.randrange(4)
        candidates = others[:gold] + [name] + others[gold:]
        contexts = tuple(f"{c}({args})\n" for c in candidates)
        out.append(Example(contexts, (f"    {summary}",), gold, answer_texts=tuple(candidates)))
    return out


def _cloze(records: list[dict], rng: random.Random, size: int) -> list[Example]:
    items = []
    for record in records:
        for paragraph in _paragraphs(record["text"]):
            sentences = _sentences(paragraph)
            for before, sentence in zip(sentences, sentences[1:], strict=False):
                head, _, last = sentence[:-1].rpartition(" ")
                if sentence.endswith(".") and last.isalpha() and len(last) >= 3 and head:
                    items.append(Example((f"{before} {head}",), (last,), 0))
    return rng.sample(items, min(size, len(items)))


BUILDERS = {
    "docs_next_sentence": (_next_sentence, "multiple_choice"),
    "docs_function_name": (_function_name, "multiple_choice"),
    "docs_cloze": (_cloze, "continuation"),
}


def _write_examples(path: str, examples: Sequence[Example]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for ex in examples:
            row = {"contexts": list(ex.contexts), "continuations": list(ex.continuations), "gold": ex.gold}
            if ex.answer_texts:
                row["answer_texts"] = list(ex.answer_texts)
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


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
        with open(index, encoding="utf-8") as f:
            saved = json.load(f)
        if saved.get("settings") == settings:
            return Suite("bundled", tuple(Task(**t) for t in saved["tasks"]))
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
                reference=_unigram_scores(unigram, examples, kind),
            )
        )
    payload: dict[str, Any] = {"settings": settings, "tasks": [t.to_dict() for t in tasks]}
    tmp = f"{index}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
    os.replace(tmp, index)
    return Suite("bundled", tuple(tasks))
