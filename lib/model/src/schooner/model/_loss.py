"""Next-token cross-entropy with segment-aware targets, a loss mask, z-loss and MoE auxiliary losses.

Target convention (exact). For tokens ``x[b, 0..T-1]`` the prediction made at position ``t`` is of
``x[b, t+1]``; there are ``T-1`` predictions per row. Prediction ``t`` is counted with weight

    w[b, t] = [segment_ids[b, t] == segment_ids[b, t+1]] * loss_mask[b, t]

The data loader starts a new segment AFTER each EOS, so an EOS belongs to the document it ends: predicting
the EOS is trained, predicting the first token of the next document (from the EOS) is not.
``loss_mask[b, t]`` weights the prediction OF token ``t+1`` (made at position ``t``); it may be [B, T]
(the last column is ignored) or [B, T-1]. For an SFT mask ``m`` that marks the *target* tokens to learn,
pass ``loss_mask=target_mask_to_loss_mask(m)`` (i.e. ``m[:, 1:]``).

The loss is ``sum(w * nll) / max(sum(w), 1)`` plus ``z_loss_weight * sum(w * lse^2) / max(sum(w), 1)``
plus the MoE auxiliary losses (router z-loss always when weighted; the load-balancing loss when
``load_balancing="aux_loss"``). The output projection and the log-softmax are one fused operation with a
hand-written backward (``_xent.output_cross_entropy``): by default it keeps the softmax in the compute dtype
for the backward and never holds the float32 logits of more than one chunk; with
``config.loss_chunk_tokens`` set it keeps nothing of size [tokens, vocab] and recomputes each chunk's logits
in the backward instead.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._kernels import resolve_kernels
from ._layers import BATCH, EMBED, POSITION
from ._moe import moe_loss_terms
from ._rebalance import BalanceStats
from ._transformer import Transformer
from ._xent import output_cross_entropy


def target_weights(
    tokens: jax.Array, segment_ids: jax.Array | None = None, loss_mask: jax.Array | None = None
) -> jax.Array:
    """float32[B, T-1] weights of the next-token predictions (see the module docstring for the rule)."""
    b, t = tokens.shape
    w = jnp.ones((b, t - 1), jnp.float32)
    if segment_ids is not None:
        w = w * (segment_ids[:, :-1] == segment_ids[:, 1:]).astype(jnp.float32)
    if loss_mask is not None:
        loss_mask = jnp.asarray(loss_mask)
        if loss_mask.shape == (b, t):
            loss_mask = loss_mask[:, :-1]
        elif loss_mask.shape != (b, t - 1):
            raise ValueError(
                f"loss_mask must be [B, T]={[b, t]} or [B, T-1]={[b, t - 1]}; got {list(loss_mask.shape)}."
            )
        w = w * loss_mask.astype(jnp.float32)
    return w


def target_mask_to_loss_mask(target_mask: jax.Array) -> jax.Array:
    """Turn a per-token mask (1 where the token itself is a target to learn) into ``loss_mask`` [B, T-1]."""
    return jnp.asarray(target_mask)[:, 1:]


def _nll_lse(
    model: Transformer, tokens: jax.Array, segment_ids: jax.Array | None
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """(nll, lse, aux): float32[B, T-1] negative log-likelihoods and log-partition values."""
    h, aux = model.hidden_states(tokens, segment_ids=segment_ids)
    b = tokens.shape[0]
    hidden = h.rearrange((BATCH, POSITION, EMBED)).array[:, :-1]
    chunk = model.config.loss_chunk_tokens
    nll, lse = output_cross_entropy(
        hidden,
        model.output_embedding().array,
        tokens[:, 1:],
        chunk_positions=max(1, chunk // b) if chunk else None,
        keep_probs=chunk == 0,
        kernels=resolve_kernels(model.config.kernels),
    )
    return nll, lse, aux


def token_losses(model: Transformer, tokens: jax.Array, segment_ids: jax.Array | None = None) -> jax.Array:
    """float32[B, T-1]: nats of each next-token prediction (``[b, t]`` is -log p(x[t+1] | x[..t])).

    Nothing is masked here; combine with :func:`target_weights` to drop cross-document predictions.
    """
    nll, _, _ = _nll_lse(model, jnp.asarray(tokens), segment_ids)
    return nll


def loss_and_balance(
    model: Transformer,
    tokens: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
    loss_mask: jax.Array | None = None,
    z_loss_weight: float = 0.0,
    key: jax.Array | None = None,
) -> tuple[jax.Array, tuple[dict[str, jax.Array], BalanceStats | None]]:
    """:func:`loss_fn`, and what the batch asks of quantile load balancing.

    Returns:
        ``(loss, (metrics, balance))``: ``balance`` is the batch's :class:`BalanceStats` for a MoE model with
        ``load_balancing="quantile"`` (apply it after the optimizer step with :func:`balance_router`), else
        None. Differentiable in ``model`` (``balance`` carries no gradient).
    """
    del key
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"loss_fn needs tokens [B, T] with T >= 2; got shape {tuple(tokens.shape)}.")
    nll, lse, aux = _nll_lse(model, tokens, segment_ids)
    w = target_weights(tokens, segment_ids, loss_mask)
    count = jnp.sum(w)
    denom = jnp.maximum(count, 1.0)
    ce = jnp.sum(w * nll) / denom
    z_loss = jnp.sum(w * lse * lse) / denom
    total = ce + z_loss_weight * z_loss
    metrics: dict[str, Any] = {"ce_loss": ce, "z_loss": z_loss, "token_count": count}
    cfg = model.config.moe
    balance = None
    if cfg is not None:
        extra, moe_metrics = moe_loss_terms(cfg, aux)
        total = total + extra
        metrics.update(moe_metrics)
        if cfg.load_balancing == "quantile":
            balance = BalanceStats(shift=aux["balance_shift"], input_mean=aux["router_input_mean"])
    metrics["loss"] = total
    return total, (metrics, balance)


def loss_fn(
    model: Transformer,
    tokens: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
    loss_mask: jax.Array | None = None,
    z_loss_weight: float = 0.0,
    key: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean next-token cross-entropy (+ z-loss, + MoE aux losses) and metrics. Differentiable in ``model``.

    Args:
        model: the decoder.
        tokens: int[B, T].
        segment_ids: int[B, T] document ids (attention and targets stay within a segment) or None.
        loss_mask: weights of the predictions of token t+1 ([B, T] or [B, T-1]; see the module docstring).
        z_loss_weight: weight of the mean squared log-partition of the output softmax.
        key: reserved for stochastic layers (the decoder has none); accepted and unused.

    Returns:
        ``(loss, metrics)``: float32 scalars ``"loss"`` (total), ``"ce_loss"``, ``"z_loss"``,
        ``"token_count"`` and, for MoE models, ``"moe/..."``. Training a MoE model with quantile balancing
        needs :func:`loss_and_balance` instead (the trainer uses it).
    """
    loss, (metrics, _) = loss_and_balance(
        model, tokens, segment_ids=segment_ids, loss_mask=loss_mask, z_loss_weight=z_loss_weight, key=key
    )
    return loss, metrics
