"""Supervised fine-tuning: the `sft` step and the held-out masked evaluation of chat caches.

SFT is `train_lm` over chat caches (`schooner.tokenize.steps.tokenized_chat`) started from trained weights:
the loader packs whole conversations per row with document masking and gives each batch its `loss_mask`
(1 on assistant tokens), the train step weights the cross-entropy by it, and a row with no target token is
an `AllMaskedError` naming the conversation (never a loss of 0). During training each chat validation
cache is scored the same way (`ChatEvaluator`): mean cross-entropy over the assistant tokens of its
conversations, packed as in training, and bits-per-byte over the bytes those tokens stand for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from schooner.cluster import ResourceConfig, StepHandle

from ._optim import AdamConfig, OptimizerConfig

_CPU = ResourceConfig.with_cpu()


def is_chat_cache(path: str) -> bool:
    """Whether the token cache at `path` carries per-token loss masks (a chat cache)."""
    from schooner.tokenize import TokenCache

    return TokenCache.open(path).has_loss_mask


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


def sft(
    name: str,
    *,
    initialize_from: Any,
    datasets: Mapping[Any, float],
    batch_size: int | list[tuple[int, int]],
    seq_len: int,
    num_train_steps: int | None = None,
    train_tokens: int | None = None,
    optimizer: OptimizerConfig | None = None,
    model: Any = None,
    initialize_from_step: int | None = None,
    resources: ResourceConfig | None = _CPU,
    **train_lm_args: Any,
) -> StepHandle:
    """A step that fine-tunes a model on chat data (assistant-only loss), from a run or an HF folder.

    `train_lm` with `initialize_from` and SFT's defaults: the datasets are `tokenized_chat` steps (plain
    caches may be mixed in: all their tokens are targets), evaluated on their `validation/` caches with the
    masked loss and bits-per-byte (`ChatEvaluator`). The result is a `train_lm` handle: `export_hf`,
    `evaluate` and a later `dpo(initialize_from=...)` take it.

    Args:
        name: step name.
        initialize_from: a `train_lm`/`sft` handle, a run or checkpoint folder, or a Hugging Face folder.
        datasets: `{tokenized_chat_step_or_cache: weight}`.
        batch_size: rows per step (each row packs whole conversations).
        seq_len: tokens per row; a conversation whose first assistant token lies beyond it is an error.
        num_train_steps: optimizer steps (or `train_tokens`).
        train_tokens: a token budget instead.
        optimizer: default `AdamConfig(learning_rate=1e-4, weight_decay=0.0, warmup=0.03, schedule="linear",
            min_lr_ratio=0.0)` (a linear decay to 0, the common SFT recipe); tune the rate to the model.
        model: the model config; None: the source's (its vocabulary grows to the chat tokenizer's).
        initialize_from_step: the source run's checkpoint of this step instead of its latest.
        resources: where it runs (runtime-only).
        **train_lm_args: any other `train_lm` argument (`eval_every`, `seed`, `validation`, `evals`, ...).

    Example:
        >>> chat = tokenized_chat("tokenized/docstring-chat", source=chats, tokenizer=tok)  # doctest: +SKIP
        >>> sft_model = sft("checkpoints/nano-sft", initialize_from=model, datasets={chat: 1.0},
        ...                 batch_size=16, seq_len=256, num_train_steps=200)                 # doctest: +SKIP
    """
    from .steps import train_lm

    return train_lm(
        name,
        model=model,
        optimizer=optimizer
        if optimizer is not None
        else AdamConfig(
            learning_rate=1e-4, weight_decay=0.0, warmup=0.03, schedule="linear", min_lr_ratio=0.0
        ),
        datasets=datasets,
        batch_size=batch_size,
        seq_len=seq_len,
        num_train_steps=num_train_steps,
        train_tokens=train_tokens,
        initialize_from=initialize_from,
        initialize_from_step=initialize_from_step,
        resources=resources,
        **train_lm_args,
    )
