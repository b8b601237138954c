"""Evaluation during training: loss and bits-per-byte on each validation cache, and their average.

Each validation cache contributes its first `max_sequences` consecutive `seq_len` windows (fixed, so the
numbers are comparable across steps and runs). Loss is the mean next-token cross-entropy (nats) over
targets within a document; bits-per-byte divides the summed loss (in bits) by the UTF-8 bytes those
target tokens stand for (`Tokenizer.token_byte_lengths`), which makes runs with different tokenizers
comparable.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
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
    return out


class Evaluator:
    """Scores a model on fixed windows of several validation caches.

    Args:
        caches: name -> validation cache folder.
        seq_len: window length.
        batch_size: sequences per eval batch (a multiple of the data-parallel size).
        max_sequences: windows per cache (the first ones).
        byte_lengths: int32[vocab] bytes per token id for bits-per-byte, or None to skip bits-per-byte.
        sharding: sharding of the [B, T] batches.
    """

    def __init__(
        self,
        caches: Mapping[str, str],
        *,
        seq_len: int,
        batch_size: int,
        max_sequences: int,
        byte_lengths: np.ndarray | None,
        sharding: Any = None,
    ) -> None:
        from schooner.tokenize import TokenCache, TokenSequences

        self.batch_size = batch_size
        self.sharding = sharding
        self.byte_lengths = None if byte_lengths is None else jnp.asarray(byte_lengths, jnp.int32)
        self.sets: dict[str, list[dict[str, np.ndarray]]] = {}
        for name, path in caches.items():
            seqs = TokenSequences(TokenCache.open(path), seq_len)
            n = min(len(seqs), max_sequences)
            if n == 0:
                logger.warning(
                    f"validation cache {name!r} ({path}) has fewer than seq_len={seq_len} tokens; skipped"
                )
                continue
            full = seqs.batch(np.arange(n))
            batches = []
            for start in range(0, n, batch_size):
                b = {k: v[start : start + batch_size] for k, v in full.items()}
                rows = b["tokens"].shape[0]
                # Pad the last batch to a static shape; padded rows get weight 0.
                valid = np.zeros((batch_size,), np.float32)
                valid[:rows] = 1.0
                if rows < batch_size:
                    b = {
                        k: np.concatenate([v, np.zeros((batch_size - rows, seq_len), v.dtype)])
                        for k, v in b.items()
                    }
                b["valid"] = valid
                batches.append(b)
            self.sets[name] = batches
        self._step = jax.jit(self._sums)

    def _sums(self, model: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        from schooner.model import target_weights, token_losses

        tokens, segs = batch["tokens"], batch["segment_ids"]
        nll = token_losses(model, tokens, segs)
        w = target_weights(tokens, segs, None) * batch["valid"][:, None]
        out = {"nll": jnp.sum(nll * w), "count": jnp.sum(w)}
        if self.byte_lengths is not None:
            out["bytes"] = jnp.sum(self.byte_lengths[tokens[:, 1:]].astype(jnp.float32) * w)
        return out

    def __call__(self, model: Any) -> dict[str, float]:
        """`eval/<name>/loss`, `eval/<name>/bpb` per cache, and `eval/loss`, `eval/bpb` averaged over caches."""
        metrics: dict[str, float] = {}
        losses, bpbs = [], []
        for name, batches in self.sets.items():
            tot = {"nll": 0.0, "count": 0.0, "bytes": 0.0}
            for b in batches:
                placed = {
                    k: jax.device_put(v, self.sharding) if self.sharding is not None and k != "valid" else v
                    for k, v in b.items()
                }
                for k, v in jax.device_get(self._step(model, placed)).items():
                    tot[k] += float(v)
            loss = tot["nll"] / max(tot["count"], 1.0)
            metrics[f"eval/{name}/loss"] = loss
            losses.append(loss)
            if self.byte_lengths is not None and tot["bytes"] > 0:
                bpb = tot["nll"] / math.log(2) / tot["bytes"]
                metrics[f"eval/{name}/bpb"] = bpb
                bpbs.append(bpb)
        if losses:
            metrics["eval/loss"] = sum(losses) / len(losses)
        if bpbs:
            metrics["eval/bpb"] = sum(bpbs) / len(bpbs)
        return metrics
