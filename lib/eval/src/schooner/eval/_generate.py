"""Greedy decoding: a small, exact reference sampler for looking at what a model has learned.

There is no KV cache: each new token re-runs the model over the whole (fixed-shape, right-padded) context
buffer, so generating `n` tokens costs `n` full forward passes over `L` positions. That is simple and exactly
equal to scoring (same forward function, no second code path to get wrong), and fast enough for the short
samples experiments print on small models. The buffer has one fixed shape, so the step compiles once; causal
attention keeps the padding after the last real token from influencing its logits. When the text outgrows the
context (`max_seq_len`), the oldest tokens slide out of the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

_BUCKET = 64  # buffer lengths are rounded up to a multiple of this, so nearby lengths share one compilation


@eqx.filter_jit
def _next_token(model: Any, tokens: jax.Array, position: jax.Array) -> jax.Array:
    logits = model(tokens)
    row = jax.lax.dynamic_index_in_dim(logits[0], position, axis=0, keepdims=False)
    return jnp.argmax(row)


def _model_max_seq_len(model: Any) -> int | None:
    config = getattr(model, "config", None)
    value = getattr(config, "max_seq_len", None)
    return int(value) if value else None


def greedy_tokens(
    model: Any,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    max_seq_len: int | None = None,
    eos_id: int | None = None,
    pad_id: int = 0,
) -> list[int]:
    """Greedily extend `prompt_ids` by up to `max_new_tokens` tokens (stopping after `eos_id`, if given).

    Args:
        model: a callable `model(tokens int32[B, T]) -> logits [B, T, V]`.
        prompt_ids: the prompt's token ids (at least one).
        max_new_tokens: how many tokens to add at most.
        max_seq_len: the longest context the model sees; defaults to `model.config.max_seq_len` when the model
            carries its config, else the prompt plus the new tokens.
        eos_id: stop once this token is produced (it is included in the result).
        pad_id: the id used to fill the unused end of the buffer (never attended to by real positions).

    Returns:
        The new token ids only (not the prompt).
    """
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("greedy_tokens needs a non-empty prompt (e.g. the tokenizer's BOS or EOS token id)")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens=}")
    from ._loglikelihood import check_token_ids

    check_token_ids(model, [prompt], "prompt")
    needed = len(prompt) + max_new_tokens
    length = -(-needed // _BUCKET) * _BUCKET
    limit = max_seq_len if max_seq_len is not None else _model_max_seq_len(model)
    if limit is not None:
        if limit < 2:
            raise ValueError(f"max_seq_len must be >= 2, got {limit}")
        length = min(length, limit)
    ids = list(prompt)
    new: list[int] = []
    buffer = np.full((1, length), pad_id, dtype=np.int32)
    for _ in range(max_new_tokens):
        context = ids[-length:]
        buffer[0, : len(context)] = context
        buffer[0, len(context) :] = pad_id
        token = int(_next_token(model, jnp.asarray(buffer), jnp.asarray(len(context) - 1, jnp.int32)))
        ids.append(token)
        new.append(token)
        if eos_id is not None and token == eos_id:
            break
    return new


def generate(
    model: Any,
    tokenizer: Any,
    prompt: str,
    max_new_tokens: int = 64,
    *,
    max_seq_len: int | None = None,
    stop_at_eos: bool = True,
) -> str:
    """Greedy continuation of `prompt` as text (the prompt itself is not repeated).

    Args:
        model: a `schooner.model` model (or any `model(tokens) -> logits` callable).
        tokenizer: a `schooner.tokenize.Tokenizer` (`encode`, `decode`, `eos_id`, `bos_id`).
        prompt: the text to continue; an empty prompt starts from the BOS (else EOS) token.
        max_new_tokens: how many tokens to generate at most.
        max_seq_len: the model's context length (see `greedy_tokens`).
        stop_at_eos: stop at the end-of-text token (which is not included in the text).

    Example:
        >>> print(generate(model, tokenizer, "def main(", max_new_tokens=32))
    """
    prompt_ids = list(tokenizer.encode(prompt)) if prompt else []
    eos_id = getattr(tokenizer, "eos_id", None)
    if not prompt_ids:
        start = getattr(tokenizer, "bos_id", None)
        start = eos_id if start is None else start
        if start is None:
            raise ValueError("an empty prompt needs a tokenizer with a BOS or EOS token to start from")
        prompt_ids = [start]
    elif eos_id is not None and prompt_ids[-1] == eos_id:
        # a tokenizer that appends EOS would make the model start a new document instead of continuing
        prompt_ids = prompt_ids[:-1] or prompt_ids
    new = greedy_tokens(
        model, prompt_ids, max_new_tokens, max_seq_len=max_seq_len, eos_id=eos_id if stop_at_eos else None
    )
    if stop_at_eos and new and eos_id is not None and new[-1] == eos_id:
        new = new[:-1]
    return tokenizer.decode(new)
