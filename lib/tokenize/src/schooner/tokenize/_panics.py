"""Rust panics inside HF `tokenizers`: pyo3 raises them as `pyo3_runtime.PanicException`, a `BaseException`,
so an `except Exception` lets them through. `tokenizers` panics on some inputs with some added-token flags
(`<R>` with `rstrip=True` and `"\\n"` with `lstrip=True` on `"<R>\\n\\n"`: "AddedVocabulary bad split").
The tokenizer stays usable after one; only that text has no ids."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def is_panic(error: BaseException) -> bool:
    """Whether `error` is a Rust panic surfaced by pyo3 (the class is not importable by name)."""
    return type(error).__name__ == "PanicException"


def first_panicking(encode: Callable[[str], Any], texts: Sequence[str]) -> str | None:
    """The first of `texts` on which `encode` panics (each text encoded alone), or None."""
    for text in texts:
        try:
            encode(text)
        except BaseException as e:
            if is_panic(e):
                return text
            raise
    return None


def panic_error(
    source: str, encode: Callable[[str], Any], texts: Sequence[str], error: BaseException
) -> ValueError:
    """A `ValueError` for a panic of HF `tokenizers` while encoding `texts`, naming the text it panicked on."""
    bad = first_panicking(encode, texts) if len(texts) > 1 else texts[0]
    shown = "one of the texts" if bad is None else f"{bad[:80]!r}" + ("..." if len(bad) > 80 else "")
    return ValueError(
        f"tokenizer {source}: HF tokenizers panicked encoding {shown} ({error}), a bug in `tokenizers` with this "
        "tokenizer's added tokens; that text has no ids (remove or change it, or the added token's "
        "lstrip/rstrip flags)"
    )
