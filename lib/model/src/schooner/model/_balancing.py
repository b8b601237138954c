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

This module is the solver alone (``_moe`` calls it inside every routed layer); what the trainer does with the
shift after each optimizer step, and why, is in ``_rebalance.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

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
