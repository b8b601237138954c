"""The train state and the pure train step: `train_step(state, batch) -> (state, metrics)`.

The step computes the loss and gradients (over microbatches when accumulating), checks them for NaN/Inf,
applies the optimizer, and applies the MoE router-bias update. A non-finite loss or gradient leaves the
state unchanged (the update is selected away on device) and reports `finite = 0`, so the host can stop
with the step named while the last good state and checkpoint stay intact.
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
    """The optax transformation for `model`: the configured optimizer, frozen leaves held fixed."""
    from schooner.model import trainable_mask

    trainable = trainable_mask(model)
    if all(jax.tree.leaves(trainable)):
        return optimizer_config.build(model, num_steps)
    # Rebuild on the trainable leaves only so Muon/AdamW never see the frozen ones.
    return _masked_build(optimizer_config, model, trainable, num_steps)


def _masked_build(
    optimizer_config: Any, model: Any, trainable: Any, num_steps: int
) -> optax.GradientTransformation:
    labels = jax.tree.map(lambda t: "train" if t else "frozen", trainable)
    train_view = jax.tree.map(lambda x, t: x if t else optax.MaskedNode(), model, trainable)
    inner = optimizer_config.build(train_view, num_steps)
    return optax.partition({"train": inner, "frozen": optax.set_to_zero()}, lambda _: labels)


def init_state(model: Any, tx: optax.GradientTransformation, key: jax.Array) -> TrainState:
    """A fresh state at step 0."""
    return TrainState(step=jnp.zeros((), jnp.int32), model=model, opt_state=tx.init(model), key=key)


def _split_microbatches(batch: dict[str, jax.Array], k: int) -> dict[str, jax.Array]:
    return {name: x.reshape((k, x.shape[0] // k, *x.shape[1:])) for name, x in batch.items()}


def make_train_step(
    tx: optax.GradientTransformation,
    *,
    z_loss_weight: float,
    microbatches: int,
    lr_schedule: optax.Schedule,
    constrain_batch: Callable[[dict[str, jax.Array]], dict[str, jax.Array]] | None = None,
) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """Build the (unjitted) train step.

    Args:
        tx: the optimizer.
        z_loss_weight: weight of the output z-loss.
        microbatches: gradient accumulation factor (the batch's leading dim must divide by it).
        lr_schedule: for logging the learning rate of the step.
        constrain_batch: applied to each microbatch (sharding constraint) inside the step.

    Returns:
        `train_step(state, batch) -> (state, metrics)`; metrics are float32 scalars.
    """
    from schooner.model import loss_fn, scalar_metrics, update_router_bias

    def loss_of(model: Any, mb: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, dict]:
        return loss_fn(
            model, mb["tokens"], segment_ids=mb.get("segment_ids"), z_loss_weight=z_loss_weight, key=key
        )

    grad_fn = eqx.filter_value_and_grad(loss_of, has_aux=True)

    def grads_and_metrics(model: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple[Any, dict]:
        if microbatches == 1:
            mb = constrain_batch(batch) if constrain_batch else batch
            (_, metrics), grads = grad_fn(model, mb, key)
            return grads, metrics
        mbs = _split_microbatches(batch, microbatches)

        def one(carry: tuple[Any, dict], xs: tuple[dict, jax.Array]) -> tuple[tuple[Any, dict], None]:
            acc_g, acc_m = carry
            mb, i = xs
            mb = constrain_batch(mb) if constrain_batch else mb
            (_, m), g = grad_fn(model, mb, jax.random.fold_in(key, i))
            # Token-weighted sums so the accumulated loss and gradient equal the full batch's token mean.
            w = m["token_count"]
            acc_g = jax.tree.map(lambda a, b: a + w * b, acc_g, g)
            acc_m = jax.tree.map(lambda a, b: a + w * b, acc_m, m)
            acc_m["token_count"] = carry[1]["token_count"] + w
            return (acc_g, acc_m), None

        zero_g = jax.tree.map(jnp.zeros_like, eqx.filter(model, eqx.is_inexact_array))
        first = jax.tree.map(lambda x: x[0], mbs)
        m_shape = jax.eval_shape(lambda: grad_fn(model, first, key)[0][1])
        zero_m = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), m_shape)
        (g_sum, m_sum), _ = jax.lax.scan(one, (zero_g, zero_m), (mbs, jnp.arange(microbatches)))
        total = jnp.maximum(m_sum["token_count"], 1.0)
        grads = jax.tree.map(lambda g: g / total, g_sum)
        metrics = {k: (v if k == "token_count" else v / total) for k, v in m_sum.items()}
        return grads, metrics

    def train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
        key = jax.random.fold_in(state.key, state.step)
        grads, metrics = grads_and_metrics(state.model, batch, key)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
        updates, new_opt = tx.update(grads, state.opt_state, state.model)
        new_model = eqx.apply_updates(state.model, updates)
        new_model = update_router_bias(new_model, metrics)
        # On NaN/Inf keep the old state: the host stops the run and the last good state stays intact.
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        new_state = TrainState(
            step=state.step + 1,
            model=keep(new_model, state.model),
            opt_state=keep(new_opt, state.opt_state),
            key=state.key,
        )
        out = {k: jnp.asarray(v, jnp.float32) for k, v in scalar_metrics(metrics).items()}
        out["grad_norm"] = grad_norm.astype(jnp.float32)
        out["learning_rate"] = jnp.asarray(lr_schedule(state.step), jnp.float32)
        out["finite"] = finite.astype(jnp.float32)
        return new_state, out

    return train_step
