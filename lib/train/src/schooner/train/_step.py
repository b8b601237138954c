"""The train state and the pure train step: `train_step(state, batch) -> (state, metrics)`.

The step computes the loss, gradients and MoE balancing statistics (over microbatches when accumulating),
applies the optimizer and then the state's non-gradient transition: MoE router biases set by quantile
balancing (`schooner.model.balance_router`), and, where the model's config asks for it
(`MoEConfig.router_bias_resolve`, the default), solved once more on the batch just trained on under the
updated parameters (a forward pass, no backward, over the batch's first rows up to
`MoEConfig.router_bias_resolve_tokens`: `resolve_rows`; the bias then does not lag the drift of the router's
inputs by a step). The router bias is a leaf of the model, so it lives in the train state and
its checkpoint like any parameter (the optimizer leaves it alone). The step then checks the loss, the gradient and the updated parameters for NaN/Inf. A
non-finite one leaves the state unchanged (the update is selected away on device) and reports `finite = 0`,
so the host can stop with the step named while the last good state and checkpoint stay intact: a
checkpoint only ever holds a state whose step passed this check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax


class TrainState(eqx.Module):
    """Everything that changes during training. `step` counts finished optimizer steps."""

    step: jax.Array
    model: Any
    opt_state: Any
    key: jax.Array

    @property
    def train_part(self) -> tuple[Any, Any, Any]:
        """What a checkpoint stores besides the model: (step, opt_state, key)."""
        return (self.step, self.opt_state, self.key)


def build_optimizer(optimizer_config: Any, model: Any, num_steps: int) -> optax.GradientTransformation:
    """The optax transformation for `model` (the model's declared parameter groups decide decay, Muon's
    matrices and the leaves no optimizer touches: the MoE router bias, set by load balancing)."""
    return optimizer_config.build(model, num_steps)


def init_state(model: Any, tx: optax.GradientTransformation, key: jax.Array) -> TrainState:
    """A fresh state at step 0."""
    return TrainState(step=jnp.zeros((), jnp.int32), model=model, opt_state=tx.init(model), key=key)


def _split_microbatches(batch: dict[str, jax.Array], k: int) -> dict[str, jax.Array]:
    return {name: x.reshape((k, x.shape[0] // k, *x.shape[1:])) for name, x in batch.items()}


def resolve_rows(
    batch_rows: int, seq_len: int, microbatches: int, shards: int, max_tokens: int | None
) -> int:
    """How many of a batch's rows (its first ones) the router-bias re-solve reads: enough for ``max_tokens``
    tokens (`MoEConfig.router_bias_resolve_tokens`; None: every row), rounded up to a multiple of ``shards``
    (the devices the batch is split over) and, past one microbatch, to whole microbatches (the pass runs a
    microbatch at a time, as the step does), at most the batch (cases: tests/test_moe_balance.py).
    """
    if max_tokens is None:
        return batch_rows
    rows = _round_up(-(-max_tokens // seq_len), shards)
    per_microbatch = batch_rows // microbatches
    if rows > per_microbatch:
        rows = _round_up(rows, per_microbatch)
    return min(rows, batch_rows)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def make_train_step(
    tx: optax.GradientTransformation,
    *,
    z_loss_weight: float,
    microbatches: int,
    lr_schedule: optax.Schedule,
    constrain_batch: Callable[[dict[str, jax.Array]], dict[str, jax.Array]] | None = None,
    loss: Callable[..., tuple[jax.Array, tuple]] | None = None,
    shards: int = 1,
) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """Build the (unjitted) train step.

    Args:
        tx: the optimizer.
        z_loss_weight: weight of the output z-loss.
        microbatches: gradient accumulation factor (the batch's leading dim must divide by it).
        lr_schedule: for logging the learning rate of the step.
        constrain_batch: applied to each microbatch (sharding constraint) inside the step.
        loss: another objective, `loss(model, microbatch, key) -> (loss, (metrics, balance))` like
            `schooner.model.loss_and_balance` (metrics hold `"loss"` and `"token_count"`, the weight of the
            microbatch when accumulating); None: next-token cross-entropy (DPO passes its own). Where it
            returns balancing statistics and the model's config re-solves the router bias
            (`resolves_router_bias`), the re-solve reads the batch's `"tokens"` and `"segment_ids"`.
        shards: the devices each batch is split over (data-parallel size): the re-solve's rows are a multiple.

    Returns:
        `train_step(state, batch) -> (state, metrics)`; `batch` holds int `"tokens"` [B, T] and optionally
        `"segment_ids"` and `"loss_mask"` (1 where the token is a target, as the data loader gives it);
        metrics are float32 scalars.
    """
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise ValueError(f"shards (the devices a batch is split over) must be an int >= 1; got {shards=!r}.")
    from schooner.model import (
        balance_router,
        balance_stats,
        loss_and_balance,
        rate_take_back,
        target_mask_to_loss_mask,
    )

    def loss_of(model: Any, mb: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, tuple]:
        # A batch's "loss_mask" marks the tokens that are targets (the data loader's convention).
        mask = mb.get("loss_mask")
        return loss_and_balance(
            model,
            mb["tokens"],
            segment_ids=mb.get("segment_ids"),
            loss_mask=None if mask is None else target_mask_to_loss_mask(mask),
            z_loss_weight=z_loss_weight,
            key=key,
        )

    grad_fn = eqx.filter_value_and_grad(loss if loss is not None else loss_of, has_aux=True)

    def grads_and_aux(model: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple[Any, dict, Any]:
        """Gradients and metrics of the batch (weighted over microbatches by loss tokens) and its balancing
        statistics (the microbatches' mean: routing ignores the loss mask)."""
        if microbatches == 1:
            mb = constrain_batch(batch) if constrain_batch else batch
            (_, (metrics, balance)), grads = grad_fn(model, mb, key)
            return grads, metrics, balance
        mbs = _split_microbatches(batch, microbatches)

        def one(carry: tuple, xs: tuple[dict, jax.Array]) -> tuple[tuple, None]:
            acc_g, acc_m, acc_b = carry
            mb, i = xs
            mb = constrain_batch(mb) if constrain_batch else mb
            (_, (m, b)), g = grad_fn(model, mb, jax.random.fold_in(key, i))
            # Token-weighted sums so the accumulated loss and gradient equal the full batch's token mean. The
            # balancing statistics are a plain sum: routing sends every token, loss target or not, and every
            # microbatch routes the same number of tokens.
            w = m["token_count"]
            acc_g, acc_m = (
                jax.tree.map(lambda a, x: a + w * x, acc, new) for acc, new in ((acc_g, g), (acc_m, m))
            )
            acc_b = jax.tree.map(lambda a, x: a + x, acc_b, b)
            acc_m["token_count"] = carry[1]["token_count"] + w
            return (acc_g, acc_m, acc_b), None

        zero_g = jax.tree.map(jnp.zeros_like, eqx.filter(model, eqx.is_inexact_array))
        first = jax.tree.map(lambda x: x[0], mbs)
        m_shape, b_shape = jax.eval_shape(lambda: grad_fn(model, first, key)[0][1])
        zeros = lambda shapes: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)  # noqa: E731
        init = (zero_g, zeros(m_shape), zeros(b_shape))
        (g_sum, m_sum, b_sum), _ = jax.lax.scan(one, init, (mbs, jnp.arange(microbatches)))
        total = jnp.maximum(m_sum["token_count"], 1.0)
        grads = jax.tree.map(lambda x: x / total, g_sum)
        balance = jax.tree.map(lambda x: x / microbatches, b_sum)
        metrics = {k: (v if k == "token_count" else v / total) for k, v in m_sum.items()}
        return grads, metrics, balance

    def rebalance(model: Any, batch: dict[str, jax.Array], own: Any, step: jax.Array) -> Any:
        """`model` with its router bias re-solved on the batch's first `resolve_rows` rows under its own
        (updated) parameters, less the rate's take-back from the step's own statistics `own`
        (`rate_take_back`): the mean of the shifts of the rows' microbatches, each solved on its own (every
        microbatch routes the same number of tokens, so the plain mean is the per-token one, as for `own`;
        exact with one microbatch)."""
        take_back = rate_take_back(model, own, step=step)

        def stats_of(mb: dict[str, jax.Array]) -> Any:
            mb = constrain_batch(mb) if constrain_batch else mb
            return balance_stats(model, mb["tokens"], segment_ids=mb.get("segment_ids"), take_back=take_back)

        b, t = batch["tokens"].shape[:2]
        rows = resolve_rows(b, t, microbatches, shards, model.config.moe.router_bias_resolve_tokens)
        batch = {name: x[:rows] for name, x in batch.items()} if rows < b else batch
        parts = rows // (b // microbatches)  # whole microbatches; 0: fewer rows than one microbatch
        if parts <= 1:
            stats = stats_of(batch)
        else:
            _, per = jax.lax.scan(lambda c, mb: (c, stats_of(mb)), None, _split_microbatches(batch, parts))
            stats = jax.tree.map(lambda x: jnp.mean(x, axis=0), per)
        return balance_router(model, model, stats, rate=1.0, take_back=take_back)

    def train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
        key = jax.random.fold_in(state.key, state.step)
        grads, metrics, balance = grads_and_aux(state.model, batch, key)
        grad_norm = optax.tree.norm(grads)
        updates, new_opt = tx.update(grads, state.opt_state, state.model)
        new_model = eqx.apply_updates(state.model, updates)
        # The state transition's non-gradient part: MoE router biases set to balance the next batch.
        if balance is not None and new_model.config.resolves_router_bias:
            # The solution on the batch just trained on under the new parameters (the solver starts from the
            # step's own at rate 1), blended with the carried bias by the rate (`rate_take_back`).
            start = balance_router(state.model, new_model, balance, rate=1.0)
            new_model = rebalance(start, batch, balance, state.step)
        else:
            new_model = balance_router(state.model, new_model, balance)
        # The updated parameters too: a finite loss and gradient can still give Inf/NaN parameters (an
        # overflowing learning rate or update). The largest |parameter| is finite exactly when all are (max
        # propagates NaN) and, unlike a norm, cannot overflow: one reduction per leaf, no copy.
        params = jax.tree.leaves(eqx.filter(new_model, eqx.is_inexact_array))
        params_finite = jnp.all(jnp.stack([jnp.isfinite(jnp.max(jnp.abs(p))) for p in params]))
        param_norm = optax.tree.norm(params)  # logged
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm) & params_finite
        # On NaN/Inf keep the old state: the host stops the run and the last good state stays intact.
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        new_state = TrainState(
            step=state.step + 1,
            model=keep(new_model, state.model),
            opt_state=keep(new_opt, state.opt_state),
            key=state.key,
        )
        out = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
        out["grad_norm"] = grad_norm.astype(jnp.float32)
        out["param_norm"] = param_norm.astype(jnp.float32)
        out["learning_rate"] = jnp.asarray(lr_schedule(state.step), jnp.float32)
        out["finite"] = finite.astype(jnp.float32)
        return new_state, out

    return train_step
