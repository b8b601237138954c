"""Loss and bits-per-byte of a language model on token caches, invariant to the batch size.

The numbers are a pure function of (model, cache contents, seq_len, max_tokens, respect_documents): windows are
cut from each cache by `schooner.eval._windows` without reference to the batch size, padding is masked, and
every window's nats are summed on the host in float64 in window order, so scoring with batch size 1, 3 or 8
gives the same totals (up to the float32 rounding of the per-token losses the device computes).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import equinox as eqx
import fsspec
import jax
import jax.numpy as jnp
import numpy as np

from ._windows import TokenStream, iter_window_batches, num_windows

logger = logging.getLogger(__name__)

CacheLike = Any
"""A token cache path (str), an opened `schooner.tokenize.TokenCache`, or a sequence of 1-D token-id arrays."""


@eqx.filter_jit
def _token_nll(model: Any, tokens: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """Per-position next-token negative log-likelihood in nats, float32 `[B, T - 1]`."""
    logits = model(tokens, segment_ids=segment_ids)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]


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


def _stream_from_cache(cache: Any, max_tokens: int | None) -> TokenStream:
    """Read a TokenCache's documents in order into a stream, stopping after `max_tokens` tokens."""
    total = int(cache.num_tokens)
    stop = total if max_tokens is None else min(total, max_tokens)
    offsets = np.asarray(cache.offsets(), dtype=np.int64)
    tokens = np.asarray(cache.tokens(0, stop), dtype=np.int32)
    # document index of every token: the last offset at or before it
    doc_ids = np.searchsorted(offsets, np.arange(stop, dtype=np.int64), side="right") - 1
    return TokenStream(tokens, doc_ids.astype(np.int64))


def _open(name: str, source: CacheLike, max_tokens: int | None, tokenizer: Any) -> TokenStream:
    if isinstance(source, str) or hasattr(source, "__fspath__"):
        path = str(source)
        fs, root = fsspec.core.url_to_fs(path)
        root = root.rstrip("/")
        if not fs.exists(f"{root}/manifest.json"):
            splits = [s for s in ("validation", "train") if fs.exists(f"{root}/{s}/manifest.json")]
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
        return _stream_from_cache(source, max_tokens)
    if isinstance(source, Sequence) and not isinstance(source, str | bytes):
        return TokenStream.from_documents(list(source), max_tokens)
    raise TypeError(
        f"evaluation dataset {name!r}: expected a token cache path, a TokenCache or a sequence of token-id "
        f"arrays, got {type(source).__name__}"
    )


def _score_stream(
    model: Any,
    stream: TokenStream,
    *,
    name: str,
    table: np.ndarray | None,
    seq_len: int,
    batch_size: int,
    respect_documents: bool,
    vocab_size: int | None,
) -> dict[str, Any]:
    if stream.num_tokens and int(stream.tokens.min()) < 0:
        raise ValueError(f"evaluation dataset {name!r} holds a negative token id {int(stream.tokens.min())}")
    top = int(stream.tokens.max()) if stream.num_tokens else -1
    if vocab_size is not None and top >= vocab_size:
        raise ValueError(
            f"evaluation dataset {name!r} holds token id {top} but the model's vocabulary has {vocab_size} "
            "entries; the cache was built with a different tokenizer than the model was trained on"
        )
    if table is not None and top >= table.size:
        raise ValueError(
            f"evaluation dataset {name!r} holds token id {top} but the tokenizer's byte table has only "
            f"{table.size} entries; pass the tokenizer the cache was built with"
        )
    window_nats: list[float] = []
    window_tokens = 0
    window_bytes = 0
    for batch in iter_window_batches(
        stream, seq_len=seq_len, batch_size=batch_size, respect_documents=respect_documents
    ):
        nll = np.asarray(_token_nll(model, jnp.asarray(batch.tokens), jnp.asarray(batch.segment_ids)))
        nll = nll.astype(np.float64)
        for r in range(batch.num_real):
            mask = batch.target_mask[r]
            window_nats.append(float(nll[r][mask].sum()))
            window_tokens += int(mask.sum())
            if table is not None:
                window_bytes += int(table[batch.tokens[r, 1:][mask]].sum())
    if window_tokens == 0:
        raise ValueError(
            f"evaluation dataset {name!r} has no token to score ({stream.num_tokens} tokens in "
            f"{stream.num_documents} documents); it needs at least one document of two or more tokens"
        )
    nats = math.fsum(window_nats)
    loss = nats / window_tokens
    result: dict[str, Any] = {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "nats": nats,
        "tokens": window_tokens,
        "documents": stream.num_documents,
        "windows": len(window_nats),
    }
    if table is not None:
        result["bytes"] = window_bytes
        result["bpb"] = nats / math.log(2) / window_bytes if window_bytes else float("nan")
        result["bytes_per_token"] = window_bytes / window_tokens
    return result


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
    `schooner.eval._windows`. The result does not depend on `batch_size`.

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
    probe = eqx.filter_eval_shape(
        lambda m, t: m(t, segment_ids=t), model, jax.ShapeDtypeStruct((1, seq_len), jnp.int32)
    )
    vocab_size = int(probe.shape[-1])
    datasets: dict[str, dict[str, Any]] = {}
    for name, source in caches.items():
        start = time.perf_counter()
        stream = _open(name, source, max_tokens, tokenizer)
        datasets[name] = _score_stream(
            model,
            stream,
            name=name,
            table=table,
            seq_len=seq_len,
            batch_size=batch_size,
            respect_documents=respect_documents,
            vocab_size=vocab_size,
        )
        datasets[name]["seconds"] = time.perf_counter() - start
        logger.info(
            "eval %s: loss %.4f%s over %d tokens (%d windows)",
            name,
            datasets[name]["loss"],
            f", bpb {datasets[name]['bpb']:.4f}" if "bpb" in datasets[name] else "",
            datasets[name]["tokens"],
            num_windows(stream.num_tokens, seq_len),
        )
    return {
        "datasets": datasets,
        "average": _average(datasets),
        "pooled": _pooled(datasets),
        "seq_len": seq_len,
        "max_tokens": max_tokens,
        "respect_documents": respect_documents,
    }


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
