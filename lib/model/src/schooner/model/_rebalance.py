"""Quantile load balancing after the optimizer step: the router-bias update of ``load_balancing="quantile"``.

Each batch's balancing shift is solved inside the forward pass (``_balancing.py``: what a token selects and
the solver); this module moves the router bias with it after the step.

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
parameters (:func:`balance_stats`, a forward pass without the output layer). In that pass every layer routes
its tokens with the shift just solved for it before the next layer runs (``rebalance``), so a deeper layer is
solved on the inputs it will get once the layers before it route by their new biases: in a trained model a
layer's routing moves the next layer's inputs, and solving every layer on one pass under the old biases left
the deeper layers of ``moe_small`` at 1.1-1.8 on the very batch they were solved on. It is causal: only
tokens already trained on are used.

The rate with the re-solve. The bias that balances the last batch under the updated parameters carries that
batch's sampling noise into the next one (which adds its own): with ``router_bias_rate`` r below 1 the new bias
is r times that solution plus (1 - r) times the previous bias carried along by the step's change of it,

    bias <- solution(batch, new params) - (1 - r) * shift(batch, old params)

(the step's own shift is ``solution(batch, old params) - bias``; the two solutions differ by what the step
changed, their sampling noise cancels). The drift is followed at once at any rate; only the noise is averaged,
over about 2/r - 1 batches (the first steps average all batches so far: the rate is at least 1/(step + 1)).
The take-back ``(1 - r) * shift(batch, old params)`` (:func:`rate_take_back`) is applied inside the re-solve
pass, layer by layer (each layer routes with its solution less its take-back before the next layer runs), so
a deeper layer is solved under the biases the layers before it will really have; taking it back only after
the pass would leave a deeper layer solved under upstream biases no batch meets, and its error would not
average out. The trainer: ``start = balance_router(model, updated, own, rate=1.0)`` (the solver's starting
point), ``take_back = rate_take_back(start, own, step=step)``, ``stats = balance_stats(start, tokens,
take_back=take_back)``, ``balance_router(start, start, stats, rate=1.0, take_back=take_back)``.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ._transformer import Transformer


class BalanceStats(eqx.Module):
    """What quantile balancing takes from one batch, per MoE layer: the balancing ``shift``
    float32[layers, experts] and the mean router input ``input_mean`` float32[layers, embed].

    Returned by :func:`schooner.model.loss_and_balance` next to the loss, averaged over microbatches as a
    plain mean (every microbatch routes the same number of tokens), and applied after the optimizer step with
    :func:`balance_router`.
    """

    shift: jax.Array
    input_mean: jax.Array


def balance_stats(
    model: Transformer,
    tokens: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
    take_back: jax.Array | None = None,
) -> BalanceStats | None:
    """The :class:`BalanceStats` of ``tokens`` [B, T] under ``model`` as it is (its current router bias), each
    MoE layer solved under the routing the layers before it get from their solutions less their ``take_back``
    (float32[layers, experts], :func:`rate_take_back`; None: zeros, the whole solutions), or None where the
    model's config asks for no re-solve (``config.resolves_router_bias``: dense models, other balancing
    modes, ``router_bias_resolve=False``).

    One forward pass through the decoder's blocks (no output layer, no gradient). The trainer calls it after
    the optimizer step on the batch just trained on and applies the result with
    ``balance_router(model, model, stats, rate=1.0, take_back=take_back)`` (see the module docstring).
    """
    if not model.config.resolves_router_bias:
        return None
    if take_back is None:
        take_back = jnp.zeros(model.layers.stacked.mlp.router_bias.array.shape, jnp.float32)
    _, aux = model.hidden_states(tokens, segment_ids=segment_ids, rebalance=take_back)
    return BalanceStats(shift=aux["balance_shift"], input_mean=aux["router_input_mean"])


def balance_router(
    before: Transformer,
    after: Transformer,
    stats: BalanceStats | None,
    *,
    rate: float | None = None,
    take_back: jax.Array | None = None,
) -> Transformer:
    """``after`` with every MoE layer's router bias moved to balance the next batch (see the module docstring).

    Args:
        before: the model that produced ``stats`` (its router is the one before the optimizer step).
        after: the model after the optimizer step.
        stats: the batch's :class:`BalanceStats`; None (a dense model, or balancing other than
            ``"quantile"``) returns ``after`` unchanged.
        rate: the fraction of the shift applied, in (0, 1]; None: the config's ``router_bias_rate``, or 1
            where that is None (the re-solve's rate works through ``take_back`` instead).
        take_back: float32[layers, experts] subtracted from the new bias: the re-solve's
            :func:`rate_take_back`, the one its ``stats`` were solved under; None: nothing.

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
    if rate is None:
        rate = 1.0 if cfg.router_bias_rate is None else cfg.router_bias_rate
    if isinstance(rate, (int, float)) and not 0 < rate <= 1:  # a traced rate is the caller's to check
        raise ValueError(f"rate must be in (0, 1]; got {rate=}.")
    new_bias = bias + rate * shift - jax.lax.stop_gradient(moved)
    if take_back is not None:
        new_bias = new_bias - jax.lax.stop_gradient(take_back)
    return eqx.tree_at(lambda m: m.layers.stacked.mlp.router_bias.array, after, new_bias)


def rate_take_back(model: Transformer, own: BalanceStats, *, step: jax.Array | int) -> jax.Array:
    """float32[layers, experts]: what the re-solve's rate takes back from the solution, ``(1 - rate)`` times
    the step's own shift ``own.shift`` (centred per layer; see the module docstring). ``rate`` is the config's
    ``resolved_router_bias_rate`` but at least ``1 / (step + 1)``: the first step takes its batch's solution
    whole (there is no earlier bias worth keeping), the first biases average every batch so far, and from
    step ``1 / rate - 1`` on the noise is averaged at the configured rate. Zeros at rate 1."""
    cfg = model.config.moe
    if cfg is None:
        raise ValueError(f"a take-back asked for a model without MoE layers ({type(model.config).__name__}).")
    rate = jnp.maximum(cfg.resolved_router_bias_rate, 1.0 / (jnp.asarray(step, jnp.float32) + 1.0))
    own_shift = own.shift - jnp.mean(own.shift, axis=-1, keepdims=True)
    return jax.lax.stop_gradient((1.0 - rate) * own_shift).astype(jnp.float32)
