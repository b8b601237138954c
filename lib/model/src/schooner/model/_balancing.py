"""Quantile load balancing of MoE routers: a gradient-free router bias that keeps every expert at its share.

Selection. A token picks the ``k`` experts with the largest ``router logit + bias`` (the combine weights
come from the unbiased scores, so the bias steers load without changing what the gradient sees; DeepSeek-V3's
auxiliary-loss-free balancing). The bias lives in logit space: the softmax squashes large score differences
towards 0 and 1, where a bias on probabilities flips whole groups of tokens at once.

The batch's balancing shift. A token picks expert ``j`` iff its biased logit beats the k-th largest biased
logit of the other experts; the difference is its margin for ``j``, and lowering ``bias[j]`` by the
``1 - k/E`` quantile of its margins over the batch would give ``j`` exactly its share ``k/E`` of the batch,
the other experts held fixed. Moving every expert at once by its quantile overshoots (the experts trade
tokens), so :func:`balancing_shift` iterates a damped version of that step on the batch's own logits until
the shift balances the batch jointly (``SOLVER_STEPS`` steps of ``SOLVER_DAMPING``).

Keeping up with training. The shift balances the batch the model has just seen, but the optimizer step that
follows moves the router, and with AdamW a step moves every expert's logits, for all tokens alike, by up to
``learning_rate`` times the L1 norm of the router input: a router trained this way drifts faster than a
lagging bias can follow. That common part of the move is known after the step: ``x_mean . (W' - W)`` for
expert ``e``, with ``x_mean`` the batch's mean router input. :func:`balance_router` therefore sets

    bias <- bias + rate * shift - (x_mean . (W' - W) - its mean over experts)

(the common offset over experts changes no selection), so what reaches the next batch is only the router's
token-specific change and the batch-to-batch variation of the data.

The re-solve (``MoEConfig.router_bias_resolve``, on by default). The token-specific change is not small while
the model learns: every other layer trains too, so the router's INPUTS drift, in one direction for the first
tens of steps, and a bias solved on the model before the step is a step behind them. The trainer therefore
solves the shift once more after the optimizer step, on the batch just trained on under the updated
parameters (:func:`balance_stats`, a forward pass without the output layer), and applies it with
:func:`balance_router` (``before`` = ``after``: nothing to compensate). The bias then balances the last batch
under the parameters the next batch meets; only the data's batch-to-batch variation is left. It is causal:
only tokens already trained on are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp

if TYPE_CHECKING:  # _transformer imports this module (through _moe)
    from ._transformer import Transformer

SOLVER_STEPS = 8
SOLVER_DAMPING = 0.5


def margin_quantiles(select: jax.Array, k: int) -> jax.Array:
    """float32[E]: per expert, the ``1 - k/E`` quantile over tokens of its selection margin.

    ``select`` is float32[tokens, E] (biased logits). A token picks expert ``j`` iff ``select[t, j]`` beats
    the k-th largest of the OTHER experts: that is the (k+1)-th largest overall when ``j`` is picked, the
    k-th largest otherwise; the margin is the difference.
    """
    e = select.shape[-1]
    if k >= e:  # every expert is always picked: nothing to balance
        return jnp.zeros((e,), jnp.float32)
    top_vals, top_idx = jax.lax.top_k(select, k + 1)
    chosen = jnp.any(jax.nn.one_hot(top_idx[:, :k], e, dtype=jnp.bool_), axis=1)  # [n, e]
    threshold = jnp.where(chosen, top_vals[:, k : k + 1], top_vals[:, k - 1 : k])
    return jnp.quantile(select - threshold, 1.0 - k / e, axis=0)


def balancing_shift(select: jax.Array, k: int) -> jax.Array:
    """float32[E], mean 0: the bias shift under which ``top_k(select + shift)`` gives every expert its share
    of these tokens (see the module docstring). ``select``: float32[tokens, E], biased logits."""
    select = jax.lax.stop_gradient(select.astype(jnp.float32))

    def step(_: int, shift: jax.Array) -> jax.Array:
        q = margin_quantiles(select + shift[None, :], k)
        return shift - SOLVER_DAMPING * (q - jnp.mean(q))

    return jax.lax.fori_loop(0, SOLVER_STEPS, step, jnp.zeros((select.shape[-1],), jnp.float32))


class BalanceStats(eqx.Module):
    """What quantile balancing takes from one batch, per MoE layer: the balancing ``shift``
    float32[layers, experts] and the mean router input ``input_mean`` float32[layers, embed].

    Returned by :func:`schooner.model.loss_and_balance` next to the loss, averaged over microbatches by
    token count like a gradient, and applied after the optimizer step with :func:`balance_router`.
    """

    shift: jax.Array
    input_mean: jax.Array


def balance_stats(
    model: Transformer, tokens: jax.Array, *, segment_ids: jax.Array | None = None
) -> BalanceStats | None:
    """The :class:`BalanceStats` of ``tokens`` [B, T] under ``model`` as it is (its current router bias), or
    None where the model's config asks for no re-solve (``config.resolves_router_bias``: dense models, other
    balancing modes, ``router_bias_resolve=False``).

    One forward pass through the decoder's blocks (no output layer, no gradient). The trainer calls it after
    the optimizer step on the batch just trained on and applies the result with
    ``balance_router(model, model, stats)`` (see the module docstring).
    """
    if not model.config.resolves_router_bias:
        return None
    _, aux = model.hidden_states(tokens, segment_ids=segment_ids)
    return BalanceStats(shift=aux["balance_shift"], input_mean=aux["router_input_mean"])


def balance_router(before: Transformer, after: Transformer, stats: BalanceStats | None) -> Transformer:
    """``after`` with every MoE layer's router bias moved to balance the next batch (see the module docstring).

    Args:
        before: the model that produced ``stats`` (its router is the one before the optimizer step).
        after: the model after the optimizer step.
        stats: the batch's :class:`BalanceStats`; None (a dense model, or balancing other than
            ``"quantile"``) returns ``after`` unchanged.

    Raises:
        ValueError: ``stats`` of another shape than the model's router bias, or given for a dense model.
    """
    if stats is None:
        return after
    cfg = after.config.moe
    if cfg is None:
        raise ValueError(
            f"balancing stats given for a model without MoE layers ({type(after.config).__name__}); pass "
            "stats=None."
        )
    mlp_before, mlp_after = before.layers.stacked.mlp, after.layers.stacked.mlp
    bias = mlp_after.router_bias.array
    if stats.shift.shape != bias.shape:
        raise ValueError(
            f"balancing shift of shape {stats.shift.shape}; the model's router bias is {bias.shape}."
        )
    moved = jnp.einsum("ld,led->le", stats.input_mean, mlp_after.router.array - mlp_before.router.array)
    moved = moved - jnp.mean(moved, axis=-1, keepdims=True)
    shift = stats.shift - jnp.mean(stats.shift, axis=-1, keepdims=True)
    new_bias = bias + cfg.router_bias_rate * shift - jax.lax.stop_gradient(moved)
    return eqx.tree_at(lambda m: m.layers.stacked.mlp.router_bias.array, after, new_bias)
