"""A trained quality classifier: fastText (via `floret`, which imports as `floret` and so never clashes
with the `fasttext` module language id uses) on positive and negative records, as in DCLM (Li et al. 2024,
"DataComp-LM": fastText on instruction-like positives against web negatives) and FineWeb-Edu.

Training holds out a deterministic fraction of each class (by a hash of the record id) and reports
precision, recall and F1 of the positive class on it. Scoring writes the positive-class probability as an
attribute.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

LABELS = ("__label__hq", "__label__lq")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _replace_surrogates(line: str) -> str:
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", line)
    return line


@dataclass(frozen=True)
class ClassifierConfig:
    """fastText supervised training settings (DCLM's are close to fastText's defaults)."""

    epoch: int = 5
    lr: float = 0.1
    word_ngrams: int = 2
    dim: int = 64
    min_count: int = 1
    max_chars: int = 20_000
    """Characters of each text used (training and scoring)."""
    holdout: float = 0.1
    """Fraction of each class held out for precision/recall/F1."""
    max_per_class: int | None = None
    """Use at most this many records of each class (None: all)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.holdout < 1:
            raise ValueError(f"ClassifierConfig.holdout must be in [0, 1), got {self.holdout}")
        if self.epoch < 1 or self.dim < 1 or self.word_ngrams < 1:
            raise ValueError(f"ClassifierConfig: epoch, dim and word_ngrams must be >= 1, got {self}")


def _line(text: str, max_chars: int) -> str:
    """The line fastText reads: lower case, white space runs as one space, `__label__` as `label__` (fastText
    reads a token starting `__label__` as a label: a page about fastText added labels to the model), a lone
    surrogate (JSON allows one) as U+FFFD (fastText reads UTF-8: the training file could not be written, the
    binding refused the text)."""
    line = " ".join(text[:max_chars].lower().split())
    if "__label__" in line:
        line = line.replace("__label__", "label__")
    return line if line.isascii() else _replace_surrogates(line)


def _held_out(rid: str, fraction: float, seed: int) -> bool:
    h = int.from_bytes(hashlib.blake2b(f"{seed}:{rid}".encode(), digest_size=8).digest(), "little")
    return h / 2**64 < fraction


def train_classifier(
    positives: Iterable[dict],
    negatives: Iterable[dict],
    model_path: str,
    config: ClassifierConfig = ClassifierConfig(),
) -> dict[str, Any]:
    """Train on records (label `hq` for positives, `lq` for negatives), save the model to `model_path`
    and return counts and held-out precision / recall / F1 of the positive class (threshold 0.5)."""
    import floret

    train: list[str] = []
    held: list[tuple[int, str]] = []
    counts = {"train.positive": 0, "train.negative": 0, "heldout.positive": 0, "heldout.negative": 0}
    for label, name, recs in ((0, "positive", positives), (1, "negative", negatives)):
        for k, rec in enumerate(recs):
            if config.max_per_class is not None and k >= config.max_per_class:
                break
            line = _line(rec["text"], config.max_chars)
            if not line:
                continue
            if _held_out(str(rec["id"]), config.holdout, config.seed):
                held.append((label, line))
                counts[f"heldout.{name}"] += 1
            else:
                train.append(f"{LABELS[label]} {line}")
                counts[f"train.{name}"] += 1
    if not counts["train.positive"] or not counts["train.negative"]:
        raise ValueError(f"a quality classifier needs positive and negative training records, got {counts}")
    # fastText trains from a file; the order is shuffled deterministically
    import random

    random.Random(config.seed).shuffle(train)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write("\n".join(train) + "\n")
        tmp = f.name
    try:
        model = floret.train_supervised(
            input=tmp, epoch=config.epoch, lr=config.lr, wordNgrams=config.word_ngrams, dim=config.dim,
            minCount=config.min_count, seed=config.seed, thread=1, verbose=0,
        )  # fmt: skip
    finally:
        os.unlink(tmp)
    model.save_model(model_path)
    load_classifier.cache_clear()  # a model this process loaded from `model_path` before is replaced
    tp = fp = fn = 0
    for label, line in held:
        pred = _positive_probability(model, line) >= 0.5
        tp += pred and label == 0
        fp += pred and label == 1
        fn += (not pred) and label == 0
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {**counts, "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4)}


def _positive_probability(model: Any, line: str) -> float:
    # floret's own `predict` is broken twice under numpy 2: its single-line form calls np.array(copy=False),
    # which numpy 2 refuses, and its list form repeats the top probability for every label (so the
    # high-quality probability of a page the model calls junk came out ~1). The binding underneath
    # returns (probability, label) pairs as they are.
    for p, lab in model.f.predict(line + "\n", len(LABELS), 0.0, "strict"):
        if lab == LABELS[0]:
            return float(min(p, 1.0))
    return 0.0


@functools.lru_cache(maxsize=4)
def load_classifier(path: str) -> Any:
    """A floret model loaded once per process (per path; again after `train_classifier` writes a model)."""
    import floret

    return floret.load_model(path)


@dataclass(frozen=True)
class QualityScores:
    """Per record: attribute `key` = the classifier's probability that the text is high quality."""

    model_path: str
    key: str = "quality"
    max_chars: int = 20_000

    @property
    def __name__(self) -> str:
        return "quality_scores"

    def __call__(self, records: Iterator[dict]) -> Iterator[dict]:
        model = load_classifier(self.model_path)
        for rec in records:
            line = _line(rec["text"], self.max_chars)
            # 6 digits: coarser rounding makes ties of scores the model tells apart
            yield {self.key: round(_positive_probability(model, line), 6) if line else 0.0}
