"""Evaluation during training: loss and bits-per-byte on each validation cache, and their average; chat
caches (`ChatEvaluator`) on their assistant tokens, packed as in training.

The scorer is `schooner.model.StreamScorer`, shared with `schooner.eval.evaluate_lm` (the trainer does not
import `schooner.eval`): each cache's first `max_tokens` tokens cut into `seq_len` windows overlapping by one
token, scored with the fused loss. Loss is the mean next-token cross-entropy (nats) over targets within a
document; bits-per-byte divides the summed loss (in bits) by the UTF-8 bytes those target tokens stand for
(`Tokenizer.token_byte_lengths`), which makes runs with different tokenizers comparable.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

logger = logging.getLogger("schooner.train")


def find_tokenizer_file(cache_path: str) -> str | None:
    """The `tokenizer.json` a cache was built with, when it sits in the cache or its parent folder."""
    for folder in (cache_path, os.path.dirname(cache_path.rstrip("/"))):
        candidate = os.path.join(folder, "tokenizer.json")
        if os.path.exists(candidate):
            return candidate
    return None


def default_validation(components: Mapping[str, float]) -> dict[str, str]:
    """For each component `.../X/train` (or a tokenized folder `.../X`), its sibling `validation` cache."""
    from schooner.tokenize import TokenCache

    out: dict[str, str] = {}
    for path in components:
        p = path.rstrip("/")
        root = os.path.dirname(p) if os.path.basename(p) == "train" else p
        val = os.path.join(root, "validation")
        if os.path.exists(os.path.join(val, "manifest.json")):
            cache = TokenCache.open(val)
            if cache.num_tokens > 0:
                # A step output folder `name-1a2b3c4d` is named without its hash.
                out[re.sub(r"-[0-9a-f]{8}$", "", os.path.basename(root))] = val
            elif _asked_for_validation(root):
                logger.warning(empty_split(val))
    return out


def _asked_for_validation(root: str) -> bool:
    """False when the tokenized folder's `build.json` says it was built with `validation_fraction=0` (no
    held-out set asked for: an empty split is no news); True otherwise, a build record missing included."""
    import json

    try:
        with open(os.path.join(root, "build.json")) as f:
            fraction = json.load(f)["plan"]["validation_fraction"]
    except (OSError, ValueError, KeyError, TypeError):
        return True
    return not (isinstance(fraction, int | float) and fraction == 0)


def empty_split(folder: str) -> str:
    """The warning for a `validation/` cache of no documents, skipped as a held-out set."""
    return (
        f"validation cache {folder} is empty (the build's validation_fraction routed no record to it): no "
        "held-out metrics from it; rebuild it with a larger validation_fraction, or pass validation= / evals="
    )


class Evaluator:
    """Scores a model on the first `max_tokens` tokens of several validation caches, with the scorer
    `schooner.eval` uses (`schooner.model.StreamScorer`): the same numbers as `evaluate_lm` for the same
    checkpoint, caches, `seq_len` and `max_tokens`.

    Args:
        caches: name -> validation cache folder.
        seq_len: window length.
        batch_size: windows per device call (a multiple of the data-parallel size).
        max_tokens: tokens of each cache (the first ones, fixed: numbers comparable across steps and runs);
            None: all of them.
        byte_lengths: int32[vocab] bytes per token id for bits-per-byte, or None to skip bits-per-byte.
        sharding: sharding of the [B, T] batches.
        tokenizer: the run's tokenizer (or its fingerprint); every cache must have been built with it.
        text_tokenizer: the loaded `Tokenizer` whose `decode` gives the bytes of each document's unscored
            first token (as `evaluate_lm` counts them); None: `tokenizer` when it is one, else the first
            token's `byte_lengths` entry.
    """

    def __init__(
        self,
        caches: Mapping[str, str],
        *,
        seq_len: int,
        batch_size: int,
        max_tokens: int | None,
        byte_lengths: np.ndarray | None,
        sharding: Any = None,
        tokenizer: Any = None,
        text_tokenizer: Any = None,
    ) -> None:
        from schooner.model import StreamScorer, TokenStream
        from schooner.tokenize import TokenCache, scored_text_bytes

        if text_tokenizer is None and hasattr(tokenizer, "decode"):
            text_tokenizer = tokenizer
        streams = {}
        self.text_bytes: dict[str, int] = {}  # name -> bytes of the scored text, for caches that record them
        for name, path in caches.items():
            cache = TokenCache.open(path)
            if tokenizer is not None:
                cache.check_tokenizer(tokenizer)
            stream = TokenStream.from_cache(cache, max_tokens)
            if stream.num_tokens < 2 or stream.num_documents == stream.num_tokens:
                logger.warning(f"validation cache {name!r} ({path}) has no token to score; skipped")
                continue
            streams[name] = stream
            if byte_lengths is None:
                continue
            nbytes = scored_text_bytes(
                cache, stream.num_tokens, byte_lengths, tokenizer=text_tokenizer, tokens=stream.tokens
            )
            if nbytes is not None:
                self.text_bytes[name] = nbytes
            else:  # once per run: the evaluator is built once and scores every `eval_every` steps
                logger.warning(
                    f"validation cache {name!r} ({path}) has no per-document byte counts (a text cache built "
                    "before they were recorded), so its eval bits per byte divides by the tokenizer's per-token "
                    "byte lengths, which count 0 bytes for <unk> and miscount tokens that do not spell the text "
                    "(SentencePiece's ▁ prefix, WordPiece's ##); rebuild the cache with this schooner-tokenize "
                    "to count the text's bytes as schooner.eval does"
                )
        self.scorer = StreamScorer(
            streams, seq_len=seq_len, batch_size=batch_size, byte_lengths=byte_lengths, sharding=sharding
        )

    @property
    def names(self) -> list[str]:
        """The validation sets scored."""
        return list(self.scorer.streams)

    def __call__(self, model: Any) -> dict[str, float]:
        """`eval/<name>/loss`, `eval/<name>/bpb` per cache, and `eval/loss`, `eval/bpb` averaged over caches."""
        metrics: dict[str, float] = {}
        losses, bpbs = [], []
        for name, scores in self.scorer(model).items():
            metrics[f"eval/{name}/loss"] = scores["loss"]
            losses.append(scores["loss"])
            if name in self.text_bytes:  # the same bits over the text's bytes (schooner.eval's division)
                nbytes = self.text_bytes[name]
                scores["bpb"] = scores["nats"] / math.log(2) / nbytes if nbytes > 0 else float("nan")
            if "bpb" in scores and math.isfinite(scores["bpb"]):
                metrics[f"eval/{name}/bpb"] = scores["bpb"]
                bpbs.append(scores["bpb"])
        if losses:
            metrics["eval/loss"] = math.fsum(losses) / len(losses)
        if bpbs:
            metrics["eval/bpb"] = math.fsum(bpbs) / len(bpbs)
        return metrics


class ChatEvaluator:
    """Masked loss and bits-per-byte of a model on chat validation caches, packed as in training.

    Args:
        caches: name -> chat cache folder.
        seq_len: row length (conversations packed whole, first-fit, cut to `seq_len`).
        batch_size: rows per device call (a multiple of the data-parallel size); never changes the numbers.
        max_tokens: score the first `ceil(max_tokens / seq_len)` rows of each cache (fixed across steps);
            None: all rows.
        byte_lengths: int[vocab] bytes per token id (bits-per-byte), or None.
        sharding: sharding of the [B, T] arrays.
        tokenizer: the run's tokenizer or fingerprint; every cache must have been built with it.
    """

    def __init__(
        self,
        caches: Mapping[str, str],
        *,
        seq_len: int,
        batch_size: int,
        max_tokens: int | None,
        byte_lengths: np.ndarray | None,
        sharding: Any = None,
        tokenizer: Any = None,
    ) -> None:
        from schooner.tokenize import PackedSequences, TokenCache

        self.sets = {}
        for name, path in caches.items():
            cache = TokenCache.open(path)
            if tokenizer is not None:
                cache.check_tokenizer(tokenizer)
            packed = PackedSequences(cache, seq_len)
            rows = packed.num_sequences
            if max_tokens is not None:
                rows = min(rows, math.ceil(max_tokens / seq_len))
            self.sets[name] = (packed, rows)
        self.batch_size, self.byte_lengths, self.sharding = batch_size, byte_lengths, sharding

    @property
    def names(self) -> list[str]:
        return list(self.sets)

    def score(self, model: Any, name: str) -> dict[str, float]:
        """`{"loss", "bpb", "tokens"}` of one cache: nats per target token, bits per target byte."""
        import jax

        from schooner.model import token_nll

        packed, rows = self.sets[name]
        nats = count = nbytes = 0.0
        for start in range(0, rows, self.batch_size):
            b = packed.batch(np.arange(start, min(start + self.batch_size, rows)))
            n = b["tokens"].shape[0]
            if n < self.batch_size:  # pad to a full batch with rows that score nothing
                b = {k: np.concatenate([v, np.repeat(v[:1], self.batch_size - n, 0)]) for k, v in b.items()}
                b["loss_mask"][n:] = 0
            tokens, segs = b["tokens"], b["segment_ids"]
            put = (lambda x: jax.device_put(x, self.sharding)) if self.sharding is not None else (lambda x: x)
            nll = np.asarray(jax.device_get(token_nll(model, put(tokens), put(segs))), np.float64)
            w = (segs[:, :-1] == segs[:, 1:]) * b["loss_mask"][:, 1:]
            nats += float((w * nll).sum())
            count += float(w.sum())
            if self.byte_lengths is not None:
                nbytes += float((w * self.byte_lengths[tokens[:, 1:]]).sum())
        out = {"loss": nats / max(count, 1.0), "tokens": count}
        if nbytes > 0:
            out["bpb"] = nats / math.log(2) / nbytes
        return out

    def __call__(self, model: Any) -> dict[str, float]:
        """`eval/<name>/loss` and `eval/<name>/bpb` per cache (a chat cache's target tokens only)."""
        metrics: dict[str, float] = {}
        for name in self.sets:
            s = self.score(model, name)
            metrics[f"eval/{name}/loss"] = s["loss"]
            if "bpb" in s:
                metrics[f"eval/{name}/bpb"] = s["bpb"]
        return metrics


class Evaluators:
    """Several evaluators as one: their per-set metrics, and `eval/loss`, `eval/bpb` averaged over all sets."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts

    @property
    def names(self) -> list[str]:
        return [n for p in self.parts for n in p.names]

    def __call__(self, model: Any) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for p in self.parts:
            metrics.update({k: v for k, v in p(model).items() if k.count("/") == 2})
        for kind in ("loss", "bpb"):
            vals = [v for k, v in metrics.items() if k.endswith(f"/{kind}")]
            if vals:
                metrics[f"eval/{kind}"] = math.fsum(vals) / len(vals)
        return metrics
