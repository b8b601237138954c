"""The UTF-8 bytes of the text a stream scorer's targets stand for: the denominator of bits per byte.

One count for `schooner.eval.evaluate_lm` and the trainer's own evaluations (`schooner.train`), so both
divide the same bits by the same bytes. A text cache records each document's bytes
(`TokenCache.document_bytes`), as lm-eval's `bits_per_byte` counts `len(text.encode("utf-8"))`; summing the
tokenizer's per-token byte lengths instead counts 0 for an `<unk>` and miscounts tokens that do not spell
the text (a `▁` prefix, WordPiece's `##`).

The scorer (`schooner.model.StreamScorer`) predicts every token of the cache's first `num_tokens` tokens
but the first of each document (with `respect_documents`; only the stream's first without). So a whole
document counts its text's bytes less the bytes of its unscored first token: the fewer of that token's
decoded bytes (special tokens skipped) and its table bytes (a leading `▁` decodes to no byte; a BOS to
none). A document cut by `num_tokens` counts its scored tokens' table bytes plus its share, by tokens, of
the bytes the table misses in it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def scored_text_bytes(
    cache: Any,
    num_tokens: int,
    byte_lengths: np.ndarray,
    *,
    tokenizer: Any = None,
    tokens: np.ndarray | None = None,
    respect_documents: bool = True,
) -> int | None:
    """The UTF-8 bytes of the text scored on `cache`'s first `num_tokens` tokens, or None when the cache
    records no per-document byte counts (`TokenCache.has_document_bytes`: chat and preference caches, text
    caches built before they were recorded); callers then count `byte_lengths` and should say so.

    Args:
        cache: a `TokenCache` (`offsets()`, `tokens(start, stop)`, `document_bytes(start, stop)`).
        num_tokens: how many of its first tokens are scored (all: `cache.num_tokens`).
        byte_lengths: int[vocab] bytes per token id (`Tokenizer.token_byte_lengths()`).
        tokenizer: the cache's `Tokenizer`, whose `decode` gives an unscored first token's bytes; None: its
            table bytes.
        tokens: the cache's first `num_tokens` tokens when already read (saves the read).
        respect_documents: as the scorer's: each document's first token is not scored (False: only the
            stream's first).
    """
    if not getattr(cache, "has_document_bytes", False):
        return None
    table = np.asarray(byte_lengths, np.int64)
    stop = int(num_tokens)
    if tokens is None:
        tokens = np.asarray(cache.tokens(0, stop))
    offsets = np.asarray(cache.offsets(), np.int64)
    count = int(np.searchsorted(offsets, stop, side="left"))  # documents starting before `stop`
    whole = int(np.searchsorted(offsets, stop, side="right")) - 1  # documents ending at or before it
    text_bytes = cache.document_bytes(0, count)
    total = int(text_bytes[:whole].sum())
    firsts = tokens[offsets[: whole if respect_documents else min(whole, 1)]]
    ids, times = np.unique(firsts, return_counts=True)
    total -= sum(_first_token_bytes(int(t), table, tokenizer) * int(n) for t, n in zip(ids, times))
    if whole < count:  # the last document is cut by num_tokens
        lo, hi = int(offsets[whole]), int(offsets[whole + 1])
        scored = tokens[lo + (1 if respect_documents or lo == 0 else 0) : stop]
        missing = int(text_bytes[whole]) - int(table[cache.tokens(lo, hi)].sum())
        total += int(table[scored].sum()) + round(missing * (stop - lo) / (hi - lo))
    return total


def _first_token_bytes(token: int, table: np.ndarray, tokenizer: Any) -> int:
    """The bytes of the text an unscored first token stands for: the fewer of its decoded bytes (special
    tokens skipped) and its table bytes (a leading `▁` decodes to nothing; a byte-fallback piece of a
    character decodes to a whole replacement character)."""
    decode = getattr(tokenizer, "decode", None)
    if decode is None:
        return int(table[token])
    decoded = len(decode([token], skip_special_tokens=True).encode("utf-8"))
    return min(decoded, int(table[token]))
