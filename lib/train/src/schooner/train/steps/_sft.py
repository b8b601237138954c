"""The `sft` step: supervised fine-tuning on chat data, a configuration of `train_lm`.

SFT is language modeling over chat caches (`schooner.tokenize.steps.tokenized_chat`) started from trained
weights: the loader packs whole conversations per row with document masking and gives each batch its
`loss_mask` (1 on assistant tokens), the loss weights the cross-entropy by it, and a row with no target
token is an `AllMaskedError` naming the conversation (never a loss of 0). During training each chat
validation cache is scored the same way (`schooner.train.ChatEvaluator`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schooner.cluster import ResourceConfig, StepHandle
from schooner.train._optim import AdamConfig, OptimizerConfig

from ._lm import check_paths_exist, train_lm

_CPU = ResourceConfig.with_cpu()


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
    check_paths_exist(f"sft({name!r})", [(f"datasets[{i}]", x) for i, x in enumerate(datasets)])
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
