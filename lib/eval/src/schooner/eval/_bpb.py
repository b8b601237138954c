"""Loss and bits-per-byte of a language model on token caches, invariant to the batch size.

The scoring itself is `schooner.model.StreamScorer`, the same scorer training uses for its evaluations:
windows cut from each cache without reference to the batch size (`schooner.model.iter_window_batches`),
padding masked, every window's nats summed on the host in float64 in window order, and the fused output
cross-entropy for Schooner models. So `evaluate_lm` and a run's `eval/<name>/loss` agree exactly for the same
checkpoint, cache, `seq_len` and `max_tokens`, whatever the batch sizes.

Bits per byte divides the scored nats by the UTF-8 bytes of the scored text, counted from the text: a text
cache records each document's bytes (`TokenCache.document_bytes`), as lm-eval's `bits_per_byte` counts
`len(text.encode("utf-8"))`. Summing the tokenizer's per-token byte lengths instead counts 0 for an `<unk>`
(a SentencePiece-style tokenizer gave 1 byte for a 33-byte Japanese sentence) and miscounts tokens that
do not spell the text (a `▁` prefix, WordPiece's `##`). A document's first token is not scored (it has no
context within its document), so the bytes it stands for are left out: the fewer of its decoded bytes and
its table bytes (a leading `▁` decodes to no byte; a BOS to none). A document cut by `max_tokens` counts its
scored tokens' table bytes plus its share, by tokens, of the bytes the table misses in it. Caches without
byte counts (built before they were recorded, chat caches) and token arrays count the table's bytes, with a
warning for caches; `bytes_from` in the results says which (`"text"` or `"tokens"`). The count is
`schooner.tokenize.scored_text_bytes`, which schooner-train's evaluations use too.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from schooner.cluster import storage
from schooner.model import StreamScorer, TokenStream

logger = logging.getLogger(__name__)

CacheLike = Any
"""A token cache path (str), an opened `schooner.tokenize.TokenCache`, or a sequence of 1-D token-id arrays."""


def _byte_table(tokenizer: Any) -> np.ndarray | None:
    if tokenizer is None:
        return None
    if hasattr(tokenizer, "token_byte_lengths"):
        table = tokenizer.token_byte_lengths()
    else:
        table = tokenizer
    table = np.asarray(table)
    if table.ndim != 1 or not np.issubdtype(table.dtype, np.integer) or (table < 0).any():
        raise ValueError(
            "tokenizer must be a Tokenizer (with token_byte_lengths()) or a 1-D array of non-negative "
            f"integer byte lengths indexed by token id; got an array of dtype {table.dtype} shape {table.shape}"
        )
    return table.astype(np.int64)


def _open(name: str, source: CacheLike, max_tokens: int | None, tokenizer: Any) -> tuple[TokenStream, Any]:
    """The token stream of `source` and its cache (None for token arrays)."""
    if isinstance(source, str) or hasattr(source, "__fspath__"):
        path = str(source)
        if not storage.exists(storage.join(path, "manifest.json")):
            splits = [
                s for s in ("validation", "train") if storage.exists(storage.join(path, s, "manifest.json"))
            ]
            hint = (
                f"it is a tokenized step's output: pass {path.rstrip('/')}/{splits[0]}"
                if splits
                else "pass a token cache folder (one with manifest.json)"
            )
            raise FileNotFoundError(f"evaluation dataset {name!r}: no token cache at {path!r}; {hint}")
        from schooner.tokenize import TokenCache

        source = TokenCache.open(path)
    if hasattr(source, "num_documents") and hasattr(source, "offsets"):
        if tokenizer is not None and hasattr(tokenizer, "fingerprint"):
            source.check_tokenizer(tokenizer)
        return TokenStream.from_cache(source, max_tokens), source
    if isinstance(source, Sequence) and not isinstance(source, str | bytes):
        return TokenStream.from_documents(list(source), max_tokens), None
    raise TypeError(
        f"evaluation dataset {name!r}: expected a token cache path, a TokenCache or a sequence of token-id "
        f"arrays, got {type(source).__name__}"
    )


def evaluate_lm(
    model: Any,
    caches: Mapping[str, CacheLike],
    *,
    tokenizer: Any = None,
    seq_len: int,
    batch_size: int = 8,
    max_tokens: int | None = None,
    respect_documents: bool = True,
) -> dict[str, Any]:
    """Mean next-token loss (nats/token) and bits-per-byte of `model` on each token cache.

    Each cache's documents are concatenated in order (the first `max_tokens` tokens when given) and cut into
    windows of `seq_len` tokens overlapping by one token, so every token but the first is predicted once; see
    `schooner.model.iter_window_batches`. The result does not depend on `batch_size`.

    Args:
        model: a callable `model(tokens int32[B, T], *, segment_ids=int32[B, T]) -> logits [B, T, V]`, e.g. a
            `schooner.model` model.
        caches: evaluation set name -> token cache path, opened `TokenCache`, or sequence of token-id arrays.
        tokenizer: the tokenizer the caches were built with (its `token_byte_lengths()` gives the bytes each
            target stands for), or that byte-length table itself, or None to skip bits-per-byte.
        seq_len: window length in tokens (the model's context for scoring).
        batch_size: windows scored per device call; changes speed and memory, never the numbers.
        max_tokens: score only the first `max_tokens` tokens of each cache.
        respect_documents: mask attention across documents and do not score the first token of each document
            (as training does); False scores the stream as one text.

    Returns:
        `{"datasets": {name: {"loss", "perplexity", "nats", "tokens", "documents", "windows"[, "bpb", "bytes",
        "bytes_per_token"]}}, "average": {"loss"[, "bpb"]}, "pooled": {"loss"[, "bpb"]}, "seq_len": ...,
        "max_tokens": ...}` where "average" is the unweighted mean over datasets and "pooled" divides the
        summed nats by the summed tokens (bytes).

    Example:
        >>> results = evaluate_lm(model, {"docs": f"{out}/validation"}, tokenizer=tok, seq_len=256)
        >>> results["datasets"]["docs"]["bpb"]
    """
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len=}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size=}")
    if max_tokens is not None and max_tokens < 2:
        raise ValueError(f"max_tokens must be None or >= 2, got {max_tokens=}")
    if not caches:
        raise ValueError("caches is empty; pass at least one {name: cache path}")
    table = _byte_table(tokenizer)
    opened = {name: _open(name, source, max_tokens, tokenizer) for name, source in caches.items()}
    streams = {name: stream for name, (stream, _) in opened.items()}
    scorer = StreamScorer(
        streams,
        seq_len=seq_len,
        batch_size=batch_size,
        byte_lengths=table,
        respect_documents=respect_documents,
    )
    datasets: dict[str, dict[str, Any]] = {}
    for name in streams:
        start = time.perf_counter()
        datasets[name] = scorer.score(model, name)
        if table is not None:
            _count_text_bytes(datasets[name], name, streams[name], opened[name][1], table, tokenizer,
                              respect_documents)  # fmt: skip
        datasets[name]["seconds"] = time.perf_counter() - start
        logger.info(
            "eval %s: loss %.4f%s over %d tokens (%d windows)",
            name,
            datasets[name]["loss"],
            f", bpb {datasets[name]['bpb']:.4f}" if "bpb" in datasets[name] else "",
            datasets[name]["tokens"],
            datasets[name]["windows"],
        )
    return {
        "datasets": datasets,
        "average": _average(datasets),
        "pooled": _pooled(datasets),
        "seq_len": seq_len,
        "max_tokens": max_tokens,
        "respect_documents": respect_documents,
    }


def _count_text_bytes(
    result: dict[str, Any],
    name: str,
    stream: TokenStream,
    cache: Any,
    table: np.ndarray,
    tokenizer: Any,
    respect_documents: bool,
) -> None:
    """Replace `result`'s token-table `bytes` (and `bpb`, `bytes_per_token`) by the bytes of the scored text
    when `cache` records its documents' bytes (see the module docstring); set `bytes_from`."""
    if cache is None or not getattr(cache, "has_document_bytes", False):
        result["bytes_from"] = "tokens"
        if cache is not None:
            logger.warning(
                "evaluation set %r: token cache %s has no per-document byte counts (%s), so bits per byte "
                "divides by the tokenizer's per-token byte lengths, which count 0 bytes for <unk> and miscount "
                "tokens that do not spell the text (SentencePiece's ▁ prefix, WordPiece's ##); rebuild the cache "
                "with this schooner-tokenize to count the text's bytes",
                name,
                getattr(cache, "path", "?"),
                "a text cache built before they were recorded"
                if cache.kind == "text"
                else f"a {cache.kind} cache",
            )
        return
    from schooner.tokenize import scored_text_bytes

    total = scored_text_bytes(
        cache,
        stream.num_tokens,
        table,
        tokenizer=tokenizer,
        tokens=stream.tokens,
        respect_documents=respect_documents,
    )
    if total is None:  # has_document_bytes said otherwise: keep the token count rather than fail
        result["bytes_from"] = "tokens"
        return
    result.update(bytes=total, bytes_from="text", bytes_per_token=total / result["tokens"])
    result["bpb"] = result["nats"] / math.log(2) / total if total > 0 else float("nan")


def _average(datasets: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    out = {"loss": math.fsum(d["loss"] for d in datasets.values()) / len(datasets)}
    if all("bpb" in d for d in datasets.values()):
        out["bpb"] = math.fsum(d["bpb"] for d in datasets.values()) / len(datasets)
    return out


def _pooled(datasets: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    nats = math.fsum(d["nats"] for d in datasets.values())
    out = {"loss": nats / sum(d["tokens"] for d in datasets.values())}
    if all("bytes" in d for d in datasets.values()):
        total_bytes = sum(d["bytes"] for d in datasets.values())
        out["bpb"] = nats / math.log(2) / total_bytes if total_bytes else float("nan")
    return out
